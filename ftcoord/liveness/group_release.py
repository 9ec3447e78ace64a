"""Releasing a member blocked in a collective with a peer that will never join it.

gloo cannot abort a collective. A peer that dies closes its connections (the kernel does it) and every collective
with it fails at once; a peer that stops answering without closing them does not: its node lost power or its
network (a partition), or it is stopped. The leader declares it dead after heartbeat_timeout and interrupts the
generation, but the members blocked in a collective with it are deaf to the interrupt: they stood still until
pg_timeout (60 s at the defaults; chaos fault `partition`, a node's processes stopped for good: recovery 60.1 s after
a detection in 2.2 s), and no launcher was left to kill the silent peer and close its connections.

So each member watches its generation for as long as its group lives (`GroupRelease`, a thread per generation):
once the generation is interrupted for the death of one of its members (the interrupt's reason names it:
`heartbeat_stale`, `hung` or `gone`, written by the leader: ftcoord.leader.judge), the group's sockets are shut down
(ftcoord.host.group_sockets), a collective blocked on that member fails at once, and the member rejoins like any other.
A collective cannot complete without that member anyway, so nothing that would have completed is cut. A rejoin
(`rejoin:slot=<n>`, written by a newer incarnation of a member's slot: ftcoord.wrapper.generation_client) names a member gone as
surely: its incarnation in this generation died or was fenced, and a newer one registered in its place. It cuts
too: a member blocked on a third peer that is stuck (alive, its connections open, never contributing) stood still
behind the rejoin until that peer was fenced, progress_timeout later, or pg_timeout (a stuck rank and the leader
killed 0.3 s later: its replacement's rejoin won the interrupt before anyone declared the death; the replacement
trained alone from the checkpoint while three live ranks stood still to the job's end). An interrupt for any other
reason (a raise, a spare or a newcomer to seat, a stop) cuts nothing by itself: every member alive finishes its step
and leaves at its boundary.

But the first reason wins the interrupt, and a peer may stop answering just as another reason ends the generation (a
node lost silently while a rank raises, a newcomer asks in or the job is preempted): the leader declares it dead
a heartbeat_timeout later, when its interrupt is taken. A member blocked behind such a peer stood still until
pg_timeout (a stuck peer with a launcher is killed by it after its fence, which closes its connections; a silent
node has none). So the leader then writes the death where the generation's members can wait for it
(keys.released, written by ftcoord.leader.judge when a member of an ended generation is fenced as silent, or declared
dead after another reason won the interrupt), and the watch of a group that outlived its interrupt by `grace_s`
(its member is still in a collective: a healthy one leaves at its next boundary, within a step) waits there, on a
store client of its own opened then, and shuts its group down when a member other than itself is declared dead.
A group that ends first stops the wait (its client is closed): a healthy generation pays no request for it.

gloo only: NCCL's communicator has an abort and a watchdog of its own (ftcoord.wrapper.call.CallWrapper.teardown).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from ftcoord.host import group_sockets
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.keys import DEATH_REASONS
from ftcoord.store.client import wait_get

_REASON = re.compile(r"^([a-z_]+):slot=(\d+)")
_MEMBER_GONE = (*DEATH_REASONS, "rejoin")  # a rejoin: a newer incarnation of the slot took its place (docstring)
_POLL_S = 1.0  # how often the watch looks whether its group was torn down (an interrupt wakes it at once)
_RELEASE_SLICE_S = 30.0  # one wait on keys.released (a torn-down group cuts it at once: its client is closed)


def dead_member(reason: str | None) -> int | None:
    """The slot an interrupt's reason declares dead ("heartbeat_stale:slot=3") or replaced by a newer incarnation
    ("rejoin:slot=3"), or None for any other reason."""
    match = _REASON.match(reason or "")
    return int(match.group(2)) if match and match.group(1) in _MEMBER_GONE else None


class GroupRelease:
    """The watch of one generation's group: shuts its sockets down once the generation is interrupted for the death
    of another member, or another member is declared dead after another reason interrupted it (module docstring).
    `interrupted(timeout)` waits for the generation's interrupt (the interrupt monitor's); `reason()` is its reason;
    `client()` opens a store client of the job's (for the declared death: None waits for none), `grace_s` after the
    interrupt if the group still lives."""

    def __init__(self, slot: int, generation: int, members: tuple[int, ...], sockets: dict[int, str],
                 interrupted: Callable[[float], bool], reason: Callable[[], str | None],
                 client: Callable[[], Any] | None = None, grace_s: float = 2.5) -> None:
        self._generation = generation
        self._others = set(members) - {slot}
        self._sockets = dict(sockets)  # a copy: the training thread clears its own at teardown
        self._interrupted = interrupted
        self._reason = reason
        self._client = client
        self._grace_s = grace_s
        self._store: Any = None  # the client of the wait for a declared death, once opened
        self._done = threading.Event()
        self.released = 0
        """How many sockets this watch shut down (0 until it did)."""
        self._log = get_logger(component="release", slot=slot, generation=generation)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-release-{slot}", daemon=True)

    def start(self) -> GroupRelease:
        self._thread.start()
        return self

    def stop(self) -> None:
        """The group is torn down (or the generation left): nothing to watch (a wait for a declared death is cut)."""
        self._done.set()
        store = self._store
        if store is not None:
            store.close()

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
            if dead_member(reason) in self._others:
                self._cut(reason)
            else:
                self._await_declared_death(reason)
            return  # interrupted: this generation's collectives are over either way

    def _await_declared_death(self, interrupted_by: str | None) -> None:
        """Another reason interrupted the generation: if the group outlives it by grace_s, wait until a member is
        declared dead (keys.released) or the group is torn down."""
        if self._client is None or self._done.wait(self._grace_s):
            return
        self._store = store = self._client()
        try:
            while not self._done.is_set():
                declared = wait_get(store, keys.released(self._generation), _RELEASE_SLICE_S)
                if declared:  # b"": a wake that found no key; None: the slice ended
                    if dead_member(declared.decode()) in self._others:
                        self._cut(declared.decode(), interrupted_by=interrupted_by)
                    return
        except Exception as exc:  # noqa: BLE001 - cut by stop() (its client closed), or the store is away for good
            if not self._done.is_set():
                self._log.warning("release_watch_failed", error=str(exc))
        finally:
            store.close()

    def _cut(self, reason: str, **facts: object) -> None:
        self.released = group_sockets.shut_down(self._sockets)
        self._log.warning("process_group_released_early", reason=reason, sockets=self.released, **facts)
