"""What a launcher tells observers about the slots it runs (`ftcoord status`, its own metrics).

One JSON value per slot under `slot/<s>/launcher`, written when a process starts and when its warm
standby changes state: the node, the launcher's pid, the slot's restarts by kind, and the standby.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections import Counter
from typing import TYPE_CHECKING

from ftcoord.protocol import keys

if TYPE_CHECKING:  # the launcher starts its warm standby before it imports torch (ftcoord.launcher.main)
    import torch.distributed as dist

RESTART_KINDS = ("fenced", "signal", "exit", "job")
"""Why a slot's process was replaced: the leader fenced it (hung, stalled, a hung outsider) and its
launcher killed it; it died of a signal (SIGKILL, the OOM killer, a segfault); it exited non-zero (an
exception, `sys.exit(1)`); or the whole job was restarted (--restart-policy job)."""


def exit_kind(code: int, fenced: bool) -> str:
    """The RESTART_KINDS entry of a process that exited with `code` (negative: the signal that killed it)."""
    if fenced and code == -signal.SIGKILL:
        return "fenced"
    return "signal" if code < 0 else "exit"


def standby_state(enabled: bool, alive: bool, ready: bool) -> str:
    """The slot's warm standby, in a word: "off", "none" (not running), "warming" or "ready"."""
    if not enabled:
        return "off"
    return "ready" if alive and ready else "warming" if alive else "none"


def publish(store: dist.Store, slot: int, pid: int | None, restarts: Counter[str], standby: str) -> None:
    """Write the slot's report under keys.launcher(slot): this node, this launcher's pid, the slot's process (`pid`),
    its restarts by kind and its standby's state."""
    value = {"host": socket.gethostname(), "launcher_pid": os.getpid(), "pid": pid,
             "restarts": {kind: restarts.get(kind, 0) for kind in RESTART_KINDS}, "standby": standby}
    store.set(keys.launcher(slot), json.dumps(value, separators=(",", ":")))
