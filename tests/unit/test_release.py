"""A member blocked in a collective with a peer that stopped answering is released once the leader declares that peer
dead (ftcoord.release), and only then: real sockets, a thread blocked in a receive on one of them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ftcoord import group_sockets
from ftcoord.release import GroupRelease, dead_member

pytestmark = pytest.mark.timeout(30)


def test_dead_member_is_read_from_the_reasons_a_leader_writes_for_a_death() -> None:
    assert dead_member("heartbeat_stale:slot=3") == 3
    assert dead_member("hung:slot=12") == 12
    assert dead_member("gone:slot=0") == 0
    for other in ("exception:slot=3:RuntimeError:closed=2", "rejoin:slot=3", "grow:slot=3", "stop:slot=1",
                  "closed:probe", "fatal", "superseded", "", None):
        assert dead_member(other) is None, other


@contextmanager
def blocked_receiver() -> Iterator[tuple[dict[int, str], threading.Event, threading.Thread]]:
    """A connection opened the way a group's are (recorded), and a thread blocked in a receive on it, as a member
    blocked in a collective whose peer never sends: (the record, set when the receive returned, the thread)."""
    listener = socket.create_server(("127.0.0.1", 0))
    record: dict[int, str] = {}
    with group_sockets.opened_by(record):
        ours = socket.create_connection(listener.getsockname())
    silent_peer, _ = listener.accept()  # never sends: a stopped process
    returned = threading.Event()

    def receive() -> None:
        ours.recv(1)
        returned.set()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    try:
        yield record, returned, thread
    finally:
        for s in (ours, silent_peer, listener):
            s.close()


class Interrupt:
    """The interrupt monitor's two answers: whether the generation was interrupted (waiting), and why."""

    def __init__(self) -> None:
        self.fired = threading.Event()
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        self.reason = reason
        self.fired.set()


def test_a_member_declared_dead_releases_a_collective_blocked_on_it() -> None:
    """Sabotage: without the watch (or with a reason it does not read as a death), the receive stays blocked."""
    with blocked_receiver() as (record, returned, thread):
        interrupt = Interrupt()
        release = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason).start()
        assert not returned.wait(0.3), "released before any interrupt"
        interrupt.set("heartbeat_stale:slot=2")
        assert returned.wait(5.0), "a collective blocked on a member declared dead was not released"
        assert release.join(5.0) and release.released == 1  # counted once the shutdown returned (after the release)


@pytest.mark.parametrize("reason", ["grow:slot=3", "exception:slot=1:RuntimeError", "heartbeat_stale:slot=0",
                                    "heartbeat_stale:slot=7"])
def test_other_interrupts_cut_nothing(reason: str) -> None:
    """A grow, a raise (its sockets close by themselves), this process declared dead itself (its launcher kills it),
    a slot not in the generation: every member it waits on is alive, it finishes its step and leaves at its boundary."""
    with blocked_receiver() as (record, returned, thread):
        interrupt = Interrupt()
        release = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason).start()
        interrupt.set(reason)
        assert release.join(5.0), "the watch did not end after its generation's interrupt"
        assert not returned.wait(0.2) and release.released == 0, f"{reason!r} cut the group"


def test_a_group_torn_down_is_no_longer_watched() -> None:
    """The training thread left the generation (teardown): a later interrupt is another generation's business, and
    the descriptors may name another group's sockets by then."""
    with blocked_receiver() as (record, returned, thread):
        interrupt = Interrupt()
        release = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason).start()
        release.stop()
        assert release.join(5.0), "the watch outlived its group"
        interrupt.set("heartbeat_stale:slot=2")
        assert not returned.wait(0.2) and release.released == 0
