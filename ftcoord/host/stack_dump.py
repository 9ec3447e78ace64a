"""A fenced process's stacks, written by faulthandler before its launcher's SIGKILL.

A process fenced for its silence logs nothing itself: its Python code does not run (the interpreter frozen, a
native call that holds the GIL, a helper thread stuck in a store call). faulthandler's signal handler still runs:
it writes every thread's Python stack from C, without the GIL. A rank registers it for DUMP_SIGNAL (`install`, from
Wrapper.run; `uninstall` at its end); a launcher that fences a process sends it that signal first and waits, bounded,
for the handler to return before the kill (`before_kill`), with the kernel's view of each thread written below the
stacks. The launcher says a replacement is coming before this (the leader waits FENCE_ANSWER_S for that,
ftcoord.leader.judge), so the dump delays only the kill.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from structlog.typing import FilteringBoundLogger

from ftcoord.host.process_state import blocking, catches, pending, state, stopped, threads

DUMP_SIGNAL = signal.SIGRTMIN + 3
"""A real-time signal, so that no handler of the user's (SIGUSR1, SIGUSR2: SLURM's --signal, say) is replaced or
sent."""
DUMP_WAIT_S = 1.0
"""The longest a fence waits for a thread of the process to take the signal."""
WRITE_WAIT_S = 1.0
"""The longest a fence waits, once the signal was taken, for the handler to have written every stack and returned (a
few milliseconds, unless the process loses its core in the middle on a busy node)."""
UNSEEN_S = 0.5
"""A handler never seen running and that wrote nothing where it was watched (it finished between two looks, or wrote
to stderr or another log directory) is taken as finished this long after the signal was taken."""
_POLL_S = 0.005

_dump_file: TextIO | None = None  # kept open: faulthandler writes to its descriptor


def dump_path(log_dir: str | os.PathLike[str], slot: int, pid: int) -> Path:
    """Where a rank of `log_dir` writes its stacks."""
    return Path(log_dir) / f"stacks-slot{slot}-{pid}.txt"


def install(log_dir: str | os.PathLike[str] | None, slot: int) -> None:
    """Have DUMP_SIGNAL write this process's stacks to `stacks-slot<S>-<pid>.txt` in `log_dir` (stderr when None)."""
    global _dump_file
    path = dump_path(log_dir, slot, os.getpid()) if log_dir else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if _dump_file is not None:
            _dump_file.close()
        _dump_file = open(path, "a")  # noqa: SIM115 - faulthandler holds its descriptor until `uninstall`
    faulthandler.register(DUMP_SIGNAL, file=_dump_file if path is not None else sys.stderr, all_threads=True,
                          chain=False)


def discard_empty(log_dir: str | None, slot: int, pid: int) -> None:
    """A launcher reaped `pid`: its stacks file goes when empty (a process killed from outside had no time to remove
    it; a fence's dump stays)."""
    if log_dir:
        _remove_if_empty(dump_path(log_dir, slot, pid))


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()


def uninstall() -> None:
    """Wrapper.run is over: no dump to ask for. Its file goes when empty (every process made one; a fence's dump stays;
    the launcher discards the empty one of a process killed from outside: `discard_empty`)."""
    global _dump_file
    faulthandler.unregister(DUMP_SIGNAL)
    if _dump_file is None:
        return
    with contextlib.suppress(OSError):
        _dump_file.close()
    _remove_if_empty(Path(_dump_file.name))
    _dump_file = None


def dump(pid: int, path: Path | None) -> str:
    """Ask `pid` for its stacks and wait until its handler has written them and returned; what came of it:
    "dumped", "stopped" (a stopped process runs no handler), "not_installed" (it catches no DUMP_SIGNAL: not a
    Wrapper's rank, or not there yet), "undelivered" (no thread took the signal within DUMP_WAIT_S: one in
    uninterruptible sleep, say), "cut_short" (the handler was still writing WRITE_WAIT_S after it began), "elsewhere"
    (the handler ran, and `path` did not grow: the rank was given a log directory of its own) or "gone".

    The handler is installed without SA_NODEFER, so the thread running it blocks DUMP_SIGNAL until it returns
    (`process_state.blocking`): a file that stands still is no sign of the end, since a handler that lost its core
    stands still too."""
    if stopped(pid):
        return "stopped"
    if not catches(pid, DUMP_SIGNAL):
        return "not_installed"
    blocked_anyway = blocking(pid, DUMP_SIGNAL)  # a thread that blocks it for its own reasons runs no handler
    size = _size(path)
    try:
        os.kill(pid, DUMP_SIGNAL)
    except ProcessLookupError:
        return "gone"
    deadline = time.monotonic() + DUMP_WAIT_S
    while pending(pid, DUMP_SIGNAL):
        if time.monotonic() > deadline:
            return "undelivered"
        time.sleep(_POLL_S)
    taken = time.monotonic()
    seen_running = False
    while True:
        if state(pid) in (None, "Z"):
            return "gone"
        if blocking(pid, DUMP_SIGNAL) - blocked_anyway:
            seen_running = True
        else:
            grew = _size(path) > size
            if grew or (seen_running and path is None):
                return "dumped"
            if seen_running or time.monotonic() - taken >= UNSEEN_S:
                return "elsewhere" if path is not None else "dumped"
        if time.monotonic() - taken > WRITE_WAIT_S:
            return "cut_short"
        time.sleep(_POLL_S)


def _size(path: Path | None) -> int:
    """The size of `path`; 0 when there is none."""
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


KERNEL_VIEW = ("Threads as the kernel saw them at the fence (R: computing; S: asleep in the kernel function named, "
               "futex_...: a lock or condition; D: a disk read or page fault):")


def before_kill(pid: int, slot: int, log_dir: str | None, log: FilteringBoundLogger) -> str:
    """A launcher's fence: `dump` the process of `slot` (its rank's file in `log_dir`), and the kernel's view of its
    threads below the stacks; log what came of it.

    A Python stack ends at the innermost Python frame: a thread stuck in native code under it (a matmul, a lock, a
    page fault) looks the same as one computing there. So how the kernel saw each thread (`process_state.threads`:
    running, or asleep and in which kernel function, and its CPU time) is read before the signal wakes any of them,
    written below the stacks, and the main thread's goes into the log line."""
    path = dump_path(log_dir, slot, pid) if log_dir else None
    seen = threads(pid)  # before the signal: a sleeping thread that takes it runs for a moment
    outcome = dump(pid, path)
    if path is not None and seen:
        with contextlib.suppress(OSError), path.open("a") as file:
            file.write("\n".join([KERNEL_VIEW, *(f"  {thread.line()}" for thread in seen)]) + "\n")
    main = next((thread for thread in seen if thread.tid == pid), None)
    log.info("rank_stacks_dumped" if outcome == "dumped" else "rank_stacks_not_dumped", slot=slot, pid=pid,
             outcome=outcome, file=str(path) if path is not None and seen else None,
             main_thread=main.line() if main is not None else None)
    return outcome
