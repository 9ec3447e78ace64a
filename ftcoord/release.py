"""Releasing a member blocked in a collective with a peer that will never join it.

gloo cannot abort a collective. A peer that dies closes its connections (the kernel does it) and every collective
with it fails at once; a peer that stops answering without closing them does not: its node lost power or its
network (a partition), or it is stopped. The leader declares it dead after heartbeat_timeout and interrupts the
generation, but the members blocked in a collective with it are deaf to the interrupt: they stood still until
pg_timeout (60 s at the defaults; chaos fault `partition`, a node's processes stopped for good: recovery 60.1 s after
a detection in 2.2 s), and no launcher was left to kill the silent peer and close its connections.

So each member watches its generation for as long as its group lives (`GroupRelease`, a thread per generation):
once the generation is interrupted for the death of one of its members (the interrupt's reason names it:
`heartbeat_stale`, `hung` or `gone`, written by the leader: ftcoord.judgement), the group's sockets are shut down
(ftcoord.group_sockets), a collective blocked on that member fails at once, and the member rejoins like any other.
A collective cannot complete without that member anyway, so nothing that would have completed is cut. An interrupt
for any other reason (a raise, a rejoin, a replacement or a spare to seat, a stop) cuts nothing: every member is
alive, finishes its step, and leaves at its boundary. Nobody else's interrupt names a dead member, since the first
reason wins; a member blocked behind a stuck peer while another reason won waits for that peer's fence (its launcher
kills it, closing its connections) as before.

gloo only: NCCL's communicator has an abort and a watchdog of its own (ftcoord.call.CallWrapper.teardown).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from ftcoord import group_sockets
from ftcoord.judgement import DEATH_REASONS
from ftcoord.log import get_logger

_REASON = re.compile(r"^([a-z_]+):slot=(\d+)")
_POLL_S = 1.0  # how often the watch looks whether its group was torn down (an interrupt wakes it at once)


def dead_member(reason: str | None) -> int | None:
    """The slot an interrupt's reason declares dead ("heartbeat_stale:slot=3"), or None for any other reason."""
    match = _REASON.match(reason or "")
    return int(match.group(2)) if match and match.group(1) in DEATH_REASONS else None


class GroupRelease:
    """The watch of one generation's group: shuts its sockets down once the generation is interrupted for the death
    of another member (module docstring). `interrupted(timeout)` waits for the generation's interrupt (the
    interrupt monitor's); `reason()` is its reason."""

    def __init__(self, slot: int, generation: int, members: tuple[int, ...], sockets: dict[int, str],
                 interrupted: Callable[[float], bool], reason: Callable[[], str | None]) -> None:
        self._others = set(members) - {slot}
        self._sockets = dict(sockets)  # a copy: the training thread clears its own at teardown
        self._interrupted = interrupted
        self._reason = reason
        self._done = threading.Event()
        self.released = 0
        """How many sockets this watch shut down (0 until it did)."""
        self._log = get_logger(component="release", slot=slot, generation=generation)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-release-{slot}", daemon=True)

    def start(self) -> GroupRelease:
        self._thread.start()
        return self

    def stop(self) -> None:
        """The group is torn down (or the generation left): nothing to watch."""
        self._done.set()

    def join(self, timeout: float) -> bool:
        """Wait until the watch ended (after its generation's interrupt, or within _POLL_S of stop); True when it
        did. `released` is final then."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._done.is_set():
            if not self._interrupted(_POLL_S) or self._done.is_set():
                continue
            reason = self._reason()
            dead = dead_member(reason)
            if dead in self._others:
                self.released = group_sockets.shut_down(self._sockets)
                self._log.warning("process_group_released_early", reason=reason, sockets=self.released)
            return  # interrupted: one look at its reason is all this generation gets
