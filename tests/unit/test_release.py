"""A member blocked in a collective with a peer that stopped answering is released once the leader declares that peer
dead (ftcoord.liveness.group_release), by the interrupt or after another reason's, and only then: real sockets, a thread
blocked in
a receive on one of them, a real store."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ftcoord import StoreServer, Timing, connect, job_store
from ftcoord.host import group_sockets
from ftcoord.leader.judge import Judge
from ftcoord.liveness.group_release import GroupRelease, dead_member
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import SlotFacts
from ftcoord.store.client import get_or_none
from ftcoord.store.link import LinkedStore, StoreLink
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(30)


def test_dead_member_is_read_from_the_reasons_a_leader_writes_for_a_death() -> None:
    assert dead_member("heartbeat_stale:slot=3") == 3
    assert dead_member("hung:slot=12") == 12
    assert dead_member("gone:slot=0") == 0
    assert dead_member("rejoin:slot=3") == 3  # a newer incarnation of slot 3 took the member's place
    for other in ("exception:slot=3:RuntimeError:closed=2", "grow:slot=3", "stop:slot=1",
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


def test_a_member_replaced_releases_a_collective_blocked_on_a_third_peer() -> None:
    """A stuck rank (alive, its connections open, never contributing) and the leader killed 0.3 s later: the
    leader's replacement rejoined and won the interrupt before anyone declared the death, and the members blocked
    on the stuck rank stood still until it was fenced (progress_timeout) or pg_timeout, while the replacement trained
    alone. The replaced member's incarnation is gone: no collective of the generation can complete, so the group is
    cut. Sabotage: with a rejoin not read as a member gone, the receive stays blocked."""
    with blocked_receiver() as (record, returned, thread):
        interrupt = Interrupt()
        release = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason).start()
        interrupt.set("rejoin:slot=2")  # the blocked receive waits on slot 1 (stuck); slot 2 was replaced
        assert returned.wait(5.0), "a collective of a generation whose member was replaced was not released"
        assert release.join(5.0) and release.released == 1


@pytest.mark.parametrize("reason", ["grow:slot=3", "exception:slot=1:RuntimeError", "stop:slot=2",
                                    "heartbeat_stale:slot=0", "heartbeat_stale:slot=7", "rejoin:slot=0",
                                    "rejoin:slot=7"])
def test_other_interrupts_cut_nothing(reason: str) -> None:
    """A grow, a raise (its sockets close by themselves), a stop, this process declared dead or replaced itself (its
    launcher kills it; it is a ghost and exits), a slot not in the generation: every member it waits on is alive, it
    finishes its step and leaves at its boundary."""
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


@contextmanager
def job_link(store_server: StoreServer, job_id: str) -> Iterator[StoreLink]:
    link = StoreLink(store_server.address, job_id)
    try:
        yield link
    finally:
        link.close()


def test_a_death_declared_after_another_reason_releases_a_collective_blocked_on_it(store_server: StoreServer,
                                                                                  job_id: str) -> None:
    """A newcomer's grow won the interrupt while a peer stopped answering (a node partitioned as a replacement node
    comes up): the leader fences the silent peer a heartbeat timeout later and declares it to the generation
    (keys.released); the member still blocked waits there, on a client it opens once its group outlived the interrupt
    by grace_s. Sabotage: without that wait, or with the key not read as a death, the receive stays blocked (until
    pg_timeout in a job)."""
    with blocked_receiver() as (record, returned, thread), job_link(store_server, job_id) as link:
        interrupt = Interrupt()
        release = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason,
                               link.client, grace_s=0.1).start()
        interrupt.set("grow:slot=3")
        assert not returned.wait(0.5), "another reason's interrupt cut the group"
        leader = link.client()
        leader.compare_set(keys.released(5), "", "heartbeat_stale:slot=2")
        assert returned.wait(5.0), "a collective blocked on a member declared dead after the interrupt was not released"
        assert release.join(5.0) and release.released == 1


@pytest.mark.parametrize("declared", ["heartbeat_stale:slot=0", "heartbeat_stale:slot=7"])
def test_a_death_declared_of_this_process_or_a_stranger_cuts_nothing(store_server: StoreServer, job_id: str,
                                                                     declared: str) -> None:
    """This process declared dead itself (it was paused; its launcher kills it), or a slot not in the generation."""
    with blocked_receiver() as (record, returned, thread), job_link(store_server, job_id) as link:
        interrupt = Interrupt()
        release = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason,
                               link.client, grace_s=0.1).start()
        interrupt.set("exception:slot=1:RuntimeError")
        time.sleep(0.3)  # past the grace: the watch waits in the store now
        link.client().compare_set(keys.released(5), "", declared)
        assert release.join(5.0), "the watch did not end after the declared death"
        assert not returned.wait(0.2) and release.released == 0, f"{declared!r} cut the group"


def test_a_group_torn_down_in_time_costs_no_request_and_one_torn_down_later_ends_the_wait(store_server: StoreServer,
                                                                                        job_id: str) -> None:
    """A healthy member leaves at its next boundary, within grace_s of the interrupt: no client is opened. One that
    leaves later (a long step) stops the wait at once: its client is closed, not waited out (a 30 s slice)."""
    with blocked_receiver() as (record, returned, thread), job_link(store_server, job_id) as link:
        opened: list[LinkedStore] = []

        def client() -> LinkedStore:
            opened.append(link.client())
            return opened[-1]

        interrupt = Interrupt()
        quick = GroupRelease(0, 5, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason, client,
                             grace_s=1.0).start()
        interrupt.set("grow:slot=3")
        time.sleep(0.2)
        quick.stop()
        assert quick.join(5.0) and opened == [], "a group torn down within the grace opened a client"
        slow = GroupRelease(0, 6, (0, 1, 2), record, interrupt.fired.wait, lambda: interrupt.reason, client,
                            grace_s=0.1).start()
        wait_until(lambda: opened and opened[0].requests[("release", "get")] >= 1, 5.0, "the wait on keys.released")
        started = time.monotonic()
        slow.stop()
        assert slow.join(5.0) and time.monotonic() - started < 2.0, "the wait outlived its group"
        assert not returned.is_set() and slow.released == 0


# -- the leader's side: where a death declared after another reason is written (ftcoord.leader.judge) -----------------

TIMING = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0, join_timeout=0.3, barrier_timeout=10.0)


def decided(store: object, generation: int, members: tuple[int, ...]) -> GenerationRecord:
    record = GenerationRecord(generation=generation, members=members, incarnations=(1,) * len(members), leader=0,
                              leader_term=1, target_world_size=3)
    store.compare_set(keys.record(generation), "", record.to_json())  # type: ignore[attr-defined]
    return record


def silent(judge: Judge, slots: tuple[int, ...], quiet: int) -> dict[int, SlotFacts]:
    """Facts read twice, a heartbeat timeout apart: `quiet` never beat in between, the others did."""
    t0 = time.monotonic()
    facts = {}
    for at, beat in ((t0, 10), (t0 + TIMING.heartbeat_timeout + 0.1, 11)):
        facts = {s: SlotFacts(s, 1, heartbeat=10 if s == quiet else beat, progress=0, waiting=False, dead=0, left=0,
                              replacing=0) for s in slots}
        judge.observe(facts, at)
    return facts


def test_a_member_fenced_silent_after_its_generation_ended_is_declared_to_that_generation(store_server: StoreServer,
                                                                                        job_id: str) -> None:
    """Generation 3 (slots 0, 1, 2) ended for another reason; generation 4 was decided without 1 (blocked behind 2)
    and 2 (silent). When 2 is fenced as silent, generation 3 (the newest that lists it) is told, not 4. Sabotage:
    without the write, no blocked member of 3 is ever released before pg_timeout."""
    store = job_store(connect(store_server.address), job_id)
    judge = Judge(store, TIMING, None, get_logger())
    decided(store, 3, (0, 1, 2))
    running = decided(store, 4, (0,))
    judge.fence_hung_outsiders(running, silent(judge, (0, 1, 2), quiet=2), term=1, current=4)
    assert get_or_none(store, keys.released(3)) == b"heartbeat_stale:slot=2"
    assert get_or_none(store, keys.released(4)) is None and get_or_none(store, keys.fence(2)) == b"1:1"


def test_a_member_declared_dead_after_another_reason_won_the_interrupt_is_declared_too(store_server: StoreServer,
                                                                                     job_id: str) -> None:
    """The interrupt carries the first reason only: a death found a moment after a rejoin won it is written beside it;
    a death that wins the interrupt needs nothing more (its members read it there)."""
    store = job_store(connect(store_server.address), job_id)
    judge = Judge(store, TIMING, None, get_logger())
    won = decided(store, 5, (0, 1, 2))
    assert judge.interrupt_if_member_dead(won, silent(judge, (0, 1, 2), quiet=2), time.monotonic(), term=1)
    assert get_or_none(store, keys.interrupt(5)) == b"heartbeat_stale:slot=2"
    assert get_or_none(store, keys.released(5)) is None
    lost = decided(store, 6, (0, 1, 2))
    store.compare_set(keys.interrupt(6), "", "rejoin:slot=0")
    assert judge.interrupt_if_member_dead(lost, silent(judge, (0, 1, 2), quiet=1), time.monotonic(), term=1)
    assert get_or_none(store, keys.interrupt(6)) == b"rejoin:slot=0"
    assert get_or_none(store, keys.released(6)) == b"heartbeat_stale:slot=1"
