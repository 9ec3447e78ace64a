"""The environment of the processes the chaos tools start on one host (a run's launchers, a bench's members).

Every "node" is the same host: gloo binds its pairs on loopback (its default, the interface of the host's name, may
be one a sandbox cannot route), and torch's C++ warnings stay at ERROR (ftcoord's store waits end in a timeout by
design: ftcoord.launcher.children_env). What the caller set wins.
"""

from __future__ import annotations

import os


def machine_env(**extra: str) -> dict[str, str]:
    """This process's environment with gloo on loopback and torch's C++ log at ERROR unless set, plus `extra`."""
    values = dict(os.environ)
    values.setdefault("GLOO_SOCKET_IFNAME", "lo")
    values.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    values.update(extra)
    return values
