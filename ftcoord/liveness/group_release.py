"""Releasing a member blocked in a collective with a peer that will never join it.

A peer that stops answering without closing its connections (its node lost power or network, or it is stopped)
blocks its peers' collectives until pg_timeout, deaf to the interrupt. So each member watches its generation while
its group lives (`GroupRelease`, a thread per generation): once the generation is interrupted for the death of another
member (`heartbeat_stale`, `hung`, `gone`: ftcoord.leader.judge) or its replacement (`rejoin`), the group is released
and a collective blocked on that member fails at once (none could complete without it): a gloo group's sockets are
shut down (ftcoord.host.group_sockets; gloo cannot abort), an NCCL group's communicators are aborted (`abort`).
When another reason won the interrupt, a gloo group that outlives it by `grace_s` waits on keys.released, on a client
of its own, for a member declared dead (a peer that raised closed its sockets, which fails their collectives); an
NCCL group that outlives it by `grace_s` is aborted (a peer leaving fails nothing there). Members leave at their next
step boundary, or at the release.
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
    interrupt if the group still lives; `abort()`, when given, releases what sockets cannot (an NCCL group's
    communicators: ProcessGroup.abort), after the sockets."""

    def __init__(self, slot: int, generation: int, members: tuple[int, ...], sockets: dict[int, str],
                 interrupted: Callable[[float], bool], reason: Callable[[], str | None],
                 client: Callable[[], Any] | None = None, grace_s: float = 2.5,
                 abort: Callable[[], None] | None = None) -> None:
        self._generation = generation
        self._others = set(members) - {slot}
        self._sockets = dict(sockets)  # a copy: the training thread clears its own at teardown
        self._interrupted = interrupted
        self._reason = reason
        self._client = client
        self._grace_s = grace_s
        self._abort = abort
        self.aborted = False
        """Whether this watch aborted the group (`abort`): its collectives' results are void from then on."""
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
            elif self._abort is not None:
                # A peer that left an NCCL group (it raised, or was interrupted between two collectives) does not
                # fail its peers' collectives as closed sockets do: a group that outlives the interrupt is aborted.
                if not self._done.wait(self._grace_s):
                    self._cut(reason or "interrupted", outlived_s=self._grace_s)
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
        if self._abort is not None:
            self.aborted = True  # before the abort: a collective it ends must find its result void
            self._abort()
        self._log.warning("process_group_released_early", reason=reason, sockets=self.released,
                          aborted=self.aborted, **facts)
