"""What the kernel says a child process is doing right now (Linux /proc), for the launcher's judgement."""

from __future__ import annotations

import os
import signal
from pathlib import Path

_STOPPED = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP; a debugger's stop), or by a tracer
_EXIT_CODE = 49  # /proc/PID/stat's exit_code (field 52, Linux 3.5+), counted from the state (field 3)


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat from the state on; [] when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")"
    return stat.rpartition(")")[2].split()


def state(pid: int) -> str | None:
    """The process's state letter (R running, S sleeping, T stopped, Z ended and not waited for yet, ...); None when
    it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, a debugger): it runs no code until something continues it. False when it
    runs, sleeps, or is gone (nothing to say about it then)."""
    return state(pid) in _STOPPED


def zombie_exit_code(pid: int) -> int | None:
    """The exit code of `pid` when it has ended and its parent has not waited for it yet (a zombie's status, as
    waitpid would give it); None while it runs, and once it was reaped."""
    fields = _stat(pid)
    if not fields or fields[0] != "Z":
        return None
    return os.waitstatus_to_exitcode(int(fields[_EXIT_CODE])) if len(fields) > _EXIT_CODE else -signal.SIGKILL


def _signal_mask(pid: int, field: str) -> int:
    """A signal mask of /proc/PID/status (`SigCgt`: caught, `ShdPnd`: pending for the process); 0 when gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.strip(), 16)
    return 0


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for `signum` (its default action, often termination, would not run)."""
    return bool(_signal_mask(pid, "SigCgt") >> (signum - 1) & 1)


def pending(pid: int, signum: int) -> bool:
    """`signum`, sent to the process, is not delivered yet (no thread of it took it)."""
    return bool(_signal_mask(pid, "ShdPnd") >> (signum - 1) & 1)
