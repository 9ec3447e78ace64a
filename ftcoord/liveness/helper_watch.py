"""The helper watch: a process whose helper threads died, or whose slot has a newer incarnation, ends.

A participant's safety rests on three helper threads (heartbeat, leader duty, interrupt monitor). One that died (its
store client broke, a bug) leaves the process half-alive: a leader whose duty thread died keeps its claim alive
through the heartbeat, so nobody takes over and the next fault hangs every joiner until barrier_timeout. A superseded
incarnation (paused or cut off long enough for its slot to be restarted) must not keep beating for the slot either.
Either way the process ends (EXIT_HELPER_FAILED): its launcher sees a crash and replaces it, and its leadership passes
on by the usual evidence. The watch is a daemon thread that sleeps until told something changed (`nudge`: a helper
failed, the leader duty read a newer incarnation of this slot) and looks again every `backstop` seconds in case.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from ftcoord.errors import StoreLost
from ftcoord.log import get_logger

EXIT_HELPER_FAILED = 70  # EX_SOFTWARE: the launcher restarts the slot like any crash


def exit_process(reason: str) -> None:
    """The default reaction: say why on stderr (the log has it too) and end the process at once."""
    print(f"ftcoord: {reason}; ending this process so its launcher replaces it", file=sys.stderr, flush=True)
    os._exit(EXIT_HELPER_FAILED)


class HelperWatch:
    """Checks that each helper thread is alive and this incarnation is the newest: at start, whenever nudged,
    and every `backstop` seconds."""

    def __init__(self, slot: int, backstop: float, helpers: dict[str, Callable[[], BaseException | None]],
                 superseded: Callable[[], str | None], on_failure: Callable[[str], None] = exit_process) -> None:
        """`helpers` maps a thread's name to a function returning why it died (None while it runs);
        `superseded` returns why this incarnation is superseded, or None. Whatever changes either calls
        `nudge()`."""
        self._helpers = helpers
        self._superseded = superseded
        self._backstop = backstop
        self._on_failure = on_failure
        self._stop = threading.Event()
        self._nudged = threading.Event()
        self._log = get_logger(component="watch", slot=slot)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-watch-{slot}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def nudge(self) -> None:
        """Look now: a helper failed, or a newer incarnation of this slot was read (safe from any thread)."""
        self._nudged.set()

    def stop(self) -> None:
        self._stop.set()
        self._nudged.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self._check()
            if reason is not None and not self._stop.is_set():
                self._log.error("helper_failed", reason=reason)
                self._on_failure(reason)
                return
            self._nudged.wait(self._backstop)
            self._nudged.clear()

    def _check(self) -> str | None:
        for name, died in self._helpers.items():
            error = died()
            # A lost store ends the process from its training thread, after the emergency checkpoint.
            if error is not None and not isinstance(error, StoreLost):
                return f"the {name} thread died ({type(error).__name__}: {error})"
        try:
            return self._superseded()
        except Exception:  # noqa: BLE001 - the store is gone: the helpers will say so
            return None
