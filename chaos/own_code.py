"""The worker processes a bench starts run the bench's own code, wherever it was started from.

`python -m module` puts the working directory first on the module path, ahead of PYTHONPATH: a bench of one
checkout started from another (an A/B run of two versions, PYTHONPATH=/other/checkout) would get workers of the
working directory's checkout, and time the same code in both arms. So a worker runs with `-P` (no working directory
on its path: Python 3.11) and this checkout first on PYTHONPATH, in the caller's own working directory, where the
relative paths it was given (`--out runs/x`) mean what they meant.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CODE_ROOT = Path(__file__).resolve().parents[1]
"""The checkout whose `chaos`, `ftcoord` and `training` this process runs."""


def checkout_command(module: str, args: list[str]) -> list[str]:
    """`python -P -m module args`: with `own_code_env`, the module of this checkout
    (ftcoord.host.interpreter.module_command gives a child its parent's path options instead: a rank's helpers)."""
    return [sys.executable, "-P", "-m", module, *args]


def own_code_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's environment when None) with this checkout first on PYTHONPATH."""
    values = dict(os.environ if env is None else env)
    rest = values.get("PYTHONPATH")
    values["PYTHONPATH"] = os.pathsep.join([str(CODE_ROOT), rest] if rest else [str(CODE_ROOT)])
    return values


def start_worker(module: str, args: list[str], env: dict[str, str] | None = None,
                 **popen: Any) -> subprocess.Popen[Any]:
    """Start `python -m module args` of this checkout (module docstring); `env` as `own_code_env` takes it."""
    return subprocess.Popen(checkout_command(module, args), env=own_code_env(env), **popen)
