"""Waiting for a process ftcoord killed, with a bound.

A SIGKILLed process normally exits at once, but one in uninterruptible sleep (a hung NFS read, a
stuck driver call) does not, and an unbounded `wait()` would hang the launcher with it. Every wait
after a kill is bounded; a process that outlives it is reported and left to the kernel.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Protocol

KILL_WAIT_S = 10.0


class Waitable(Protocol):
    pid: int

    def wait(self, timeout: float | None = None) -> int: ...


def wait_killed(process: Waitable, timeout: float = KILL_WAIT_S) -> int | None:
    """The exit code of a process that was just killed; None (and a line on stderr) when it did not exit
    within `timeout` seconds."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"ftcoord: process {process.pid} did not exit {timeout:.0f}s after SIGKILL (uninterruptible sleep?); "
              f"going on without it", file=sys.stderr, flush=True)
        return None
