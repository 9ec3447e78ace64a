"""What the kernel says a child process is doing right now (Linux /proc), for the launcher's judgement."""

from __future__ import annotations

from pathlib import Path

_STOPPED = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP; a debugger's stop), or by a tracer


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, a debugger): it runs no code until something continues it. False when it
    runs, sleeps, or is gone (nothing to say about it then)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")"
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] in _STOPPED
