"""What the kernel says a child process is doing right now (Linux /proc), for the launcher's judgement."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

_STOPPED = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP; a debugger's stop), or by a tracer
_EXIT_CODE = 49  # /proc/PID/stat's exit_code (field 52, Linux 3.5+), counted from the state (field 3)
_UTIME, _STIME = 11, 12  # user and system CPU time in clock ticks (fields 14 and 15), counted from the state


def _stat(pid: int, task: int | None = None) -> list[str]:
    """The fields of /proc/PID/stat (of its thread `task`) from the state on; [] when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat").read_text()
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


def _signal_mask(pid: int, field: str, task: int | None = None) -> int:
    """A signal mask of /proc/PID/status (`SigCgt`: caught, `ShdPnd`: pending for the process), or of its thread
    `task`'s (`SigBlk`: blocked by that thread); 0 when gone."""
    try:
        status = Path(f"/proc/{pid}/status" if task is None else f"/proc/{pid}/task/{task}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.strip(), 16)
    return 0


def blocking(pid: int, signum: int) -> set[int]:
    """The threads of `pid` that block `signum` now (`SigBlk`): a thread running a handler installed without
    SA_NODEFER blocks that handler's signal until the handler returns. Empty when the process is gone."""
    return {tid for tid in _tids(pid) if _signal_mask(pid, "SigBlk", tid) >> (signum - 1) & 1}


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for `signum` (its default action, often termination, would not run)."""
    return bool(_signal_mask(pid, "SigCgt") >> (signum - 1) & 1)


def pending(pid: int, signum: int) -> bool:
    """`signum`, sent to the process, is not delivered yet (no thread of it took it)."""
    return bool(_signal_mask(pid, "ShdPnd") >> (signum - 1) & 1)


@dataclass(frozen=True)
class ThreadState:
    """One thread as the kernel sees it: what a Python stack cannot say, whether the native code under its innermost
    frame computes (R, its CPU time growing) or sleeps, and on what (a lock or condition: futex_...; a
    socket; D: a disk read or page fault)."""

    tid: int
    name: str
    state: str
    """R running, S sleeping, D uninterruptible sleep, T stopped, ... (/proc's letter)."""
    waits_in: str
    """The kernel function it sleeps in (wchan); "" when it runs."""
    cpu_s: float
    """CPU time it has used, user and system."""

    def line(self) -> str:
        """`tid name state [waits_in] cpu_s`, one thread of a listing."""
        waits = f" in {self.waits_in}" if self.waits_in else ""
        return f"{self.tid} {self.name}: {self.state}{waits}, {self.cpu_s:.2f} s of CPU"


def thread_state(pid: int, tid: int) -> ThreadState | None:
    """Thread `tid` of `pid` as the kernel sees it now; None when it is gone (or this is not Linux)."""
    fields = _stat(pid, tid)
    if len(fields) <= _STIME:
        return None
    base = Path(f"/proc/{pid}/task/{tid}")
    try:
        name = (base / "comm").read_text().strip()
        wchan = (base / "wchan").read_text().strip()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return ThreadState(tid, name, fields[0], "" if wchan in ("", "0") or fields[0] == "R" else wchan,
                       (int(fields[_UTIME]) + int(fields[_STIME])) / ticks)


def _tids(pid: int) -> list[int]:
    """The thread ids of `pid`, in order; [] when the process is gone (or this is not Linux)."""
    try:
        return sorted(int(name) for name in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def threads(pid: int) -> list[ThreadState]:
    """Every thread of `pid` as the kernel sees it now; [] when the process is gone (or this is not Linux)."""
    return [state for state in (thread_state(pid, tid) for tid in _tids(pid)) if state is not None]
