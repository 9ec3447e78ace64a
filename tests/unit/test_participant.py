"""Participants in threads against a real store: the steady state costs no store op."""

from __future__ import annotations

import threading
import time

import pytest

from ftcoord import Participant, QuorumPolicy, StoreServer, Timing, pausepoints
from ftcoord.errors import JobFailed, JobFinished
from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until

FAST = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0, join_timeout=0.5, barrier_timeout=10.0)


class ExplodingStore:
    """Stands in for the main thread's store client: any call fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"store operation {name!r} on the step path")


def test_two_participants_agree_and_the_step_path_does_no_store_operation(
    store_server: StoreServer, job_id: str
) -> None:
    policy = QuorumPolicy(2)
    parts = [Participant(store_server.address, job_id, slot, policy, FAST).start() for slot in (0, 1)]
    records: dict[int, object] = {}
    threads = [threading.Thread(target=lambda p=p: records.__setitem__(p.slot, p.join(0))) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert records[0] == records[1] and records[0].members == (0, 1)  # type: ignore[attr-defined]

    main_store, main_gens = parts[0].store, parts[0].generations._store
    parts[0].store = parts[0].generations._store = ExplodingStore()  # type: ignore[assignment]
    for _ in range(10_000):  # what a training loop does at every step
        assert not parts[0].interrupted
        parts[0].heartbeat.ping()
    parts[0].store, parts[0].generations._store = main_store, main_gens

    parts[1].interrupt("test")
    wait_until(lambda: parts[0].interrupted, 5, "the interrupt to reach the other participant")
    assert parts[0].monitor.reason == "test"
    for p in parts:
        p.close()


def test_exactly_one_leader_among_participants(store_server: StoreServer, job_id: str) -> None:
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(3), FAST).start() for slot in range(3)]
    try:
        wait_until(lambda: sum(p.leader.is_leader for p in parts) == 1, 5, "a leader")
        assert sum(p.leader.is_leader for p in parts) == 1
    finally:
        for p in parts:
            p.close()


@pytest.mark.timeout(30)
def test_leadership_is_handed_over_on_clean_exit(store_server: StoreServer, job_id: str) -> None:
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST).start() for slot in range(2)]
    wait_until(lambda: any(p.leader.is_leader for p in parts), 5, "a leader")
    leader = next(p for p in parts if p.leader.is_leader)
    other = next(p for p in parts if p is not leader)
    leader.close()
    # A released claim is taken at the next tick, not after a heartbeat timeout.
    wait_until(lambda: other.leader.is_leader, FAST.heartbeat_timeout * 0.8, "the other to lead")
    other.close()


@pytest.mark.timeout(30)
def test_a_replacement_started_during_a_stop_stops_too(store_server: StoreServer, job_id: str) -> None:
    ended: list[str] = []  # slot 1's first incarnation is superseded: its helper watch must not end pytest
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST, on_helper_failure=ended.append)
             .start() for slot in range(2)]
    try:
        join_together(*parts)
        parts[0].monitor.request_stop()  # SIGTERM to one rank: the whole job stops at the next boundary
        wait_until(lambda: parts[1].should_stop, 5, "the stop to reach the other rank")
        # Slot 1 dies before the job has stopped; its replacement starts now and must stop as well.
        replacement = Participant(store_server.address, job_id, 1, QuorumPolicy(2), FAST,
                                  on_helper_failure=ended.append).start()
        parts.append(replacement)
        wait_until(lambda: replacement.should_stop, 3, "the replacement to see the stop in progress")
    finally:
        for p in parts:
            p.close()


def test_an_interrupt_answers_the_reason_that_ended_the_generation(store_server: StoreServer, job_id: str) -> None:
    """The first reason wins, and a later asker learns it (the wrapper reports it as the incident's cause)."""
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST).start() for slot in range(2)]
    try:
        join_together(*parts)
        assert parts[1].interrupt("exception:slot=1:RuntimeError") == "exception:slot=1:RuntimeError"
        assert parts[0].interrupt("exception:slot=0:RuntimeError:closed=1") == "exception:slot=1:RuntimeError"
    finally:
        for p in parts:
            p.close()


@pytest.mark.timeout(30)
def test_a_stop_asked_after_another_reason_won_the_interrupt_stops_every_member_in_the_next_generation(
        store_server: StoreServer, job_id: str) -> None:
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST).start() for slot in range(2)]
    try:
        join_together(*parts)
        parts[1].interrupt("exception:slot=1:RuntimeError")
        wait_until(lambda: all(p.interrupted for p in parts), 5, "both to see the interrupt")
        assert not parts[1].should_stop
        parts[0].monitor.request_stop()  # too late to win generation 1's interrupt
        wait_until(lambda: parts[0].should_stop, 5, "the stop to be carried to the store")
        assert (parts[1].monitor.reason or "").startswith("exception")
        join_together(*parts)
        assert {p.generation for p in parts} == {2}
        # Slot 1 heard of the stop only from the store: with generation 2's record (its leader found the stop as it
        # decided it), so both stop at its first boundary, together, and nobody interrupts it.
        assert parts[1].should_stop, "the stop did not reach the member that missed it"
        assert parts[1].record is not None and parts[1].record.stop
        assert not parts[1].generations.is_interrupted(2), get_or_none(parts[1].store, keys.interrupt(2))
    finally:
        for p in parts:
            p.close()


@pytest.mark.timeout(30)
def test_a_stop_whose_asker_left_reaches_the_members_with_the_next_record(
        store_server: StoreServer, job_id: str) -> None:
    """The members read nothing for a stop at the start of a generation (issue 17): the record of a generation
    decided while a stop is asked carries it, so a stop whose own interrupt lost reaches them though its asker
    is gone."""
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(3), FAST).start()
             for slot in range(3)]
    try:
        wait_until(lambda: parts[0].leader.is_leader, 5, "slot 0 to lead")
        join_together(*parts)
        parts[1].interrupt("exception:slot=1:RuntimeError")
        wait_until(lambda: all(p.interrupted for p in parts), 5, "every member to see the interrupt")
        parts[2].monitor.request_stop()  # too late to win generation 1's interrupt; then its process goes away
        wait_until(lambda: get_or_none(parts[0].store, keys.STOP) is not None, 5, "the stop to reach the store")
        parts[2].close()
        join_together(*parts[:2])
        assert {p.generation for p in parts[:2]} == {2}
        assert all(p.should_stop for p in parts[:2]), "the stop did not reach the members of generation 2"
        assert parts[0].record is not None and parts[0].record.stop
    finally:
        for p in parts:
            p.close()


@pytest.mark.timeout(30)
def test_a_stop_asked_after_the_leader_looked_is_carried_into_the_generation_by_its_asker(
        store_server: StoreServer, job_id: str) -> None:
    """The leader looked for a stop as it decided generation 2, before the stop was asked: the process that asked
    ends generation 2 itself as it watches it, and generation 3 carries the stop to every member."""
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST).start() for slot in range(2)]
    try:
        wait_until(lambda: parts[0].leader.is_leader, 5, "slot 0 to lead")
        join_together(*parts)
        parts[1].interrupt("exception:slot=1:RuntimeError")
        wait_until(lambda: all(p.interrupted for p in parts), 5, "both to see the interrupt")
        gate = pausepoints.hold(pausepoints.JOIN_ANNOUNCED)
        asker = threading.Thread(target=parts[0].join, args=(0,), daemon=True)
        asker.start()
        assert gate.wait_reached(5), "slot 0 never announced itself"
        join_together(parts[1])
        assert parts[1].generation == 2  # decided; the leader looked for a stop before it released generation 1's probe
        wait_until(lambda: get_or_none(parts[1].store, keys.probe(1)) == keys.PROBE_RELEASED.encode(), 5,
                   "the leader to finish its decision")
        parts[0].monitor.request_stop()  # slot 0 is still in generation 1 (interrupted by another reason)
        wait_until(lambda: get_or_none(parts[0].store, keys.STOP) is not None, 5, "the stop to reach the store")
        gate.release()
        asker.join(5)
        assert parts[0].generation == 2
        wait_until(lambda: parts[1].interrupted, 5, "slot 0 to end generation 2")
        assert (get_or_none(parts[1].store, keys.interrupt(2)) or b"").startswith(b"stop:slot=0")
        assert parts[1].should_stop  # its reason is a stop
        join_together(*parts)
        assert {p.generation for p in parts} == {3} and parts[0].record is not None and parts[0].record.stop
        assert not parts[0].generations.is_interrupted(3), "the stop's asker ended a generation that carried it"
    finally:
        for gate in list(pausepoints._gates.values()):
            gate.release()
        for p in parts:
            p.close()


@pytest.mark.timeout(30)
def test_a_fatal_error_written_outside_the_generation_ends_it_and_every_member_fails_as_it_rejoins(
        store_server: StoreServer, job_id: str) -> None:
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST).start() for slot in range(2)]
    try:
        join_together(*parts)
        outsider = parts[0].clone_store()  # a launcher's, or a rank's that is in no generation now
        outsider.compare_set(keys.FATAL, "", "slot 7: FatalError: the dataset is gone")
        wait_until(lambda: all(p.interrupted for p in parts), 5, "the leader to end the generation")
        assert {p.monitor.reason for p in parts} == {"fatal"}
        failures: list[BaseException] = []

        def rejoin(p: Participant) -> None:
            try:
                p.join(0)
            except JobFailed as exc:
                failures.append(exc)

        threads = [threading.Thread(target=rejoin, args=(p,), daemon=True) for p in parts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(failures) == 2 and all("the dataset is gone" in str(f) for f in failures)
    finally:
        for p in parts:
            p.close()


# Slices of a long wait for a record grow 1, 2, 4, 8 s... here: a spare in its fourth slice waits 8 s more.
LONG_SLICES = Timing(heartbeat_interval=1.0, heartbeat_timeout=10.0, join_timeout=0.5, barrier_timeout=60.0)


@pytest.mark.parametrize("end", ["done", "fatal"])
def test_the_end_of_the_job_wakes_a_hot_spare_where_it_waits(store_server: StoreServer, job_id: str, end: str) -> None:
    """A hot spare waits for the next record in slices of up to two heartbeat timeouts (issue 17's store budget);
    it learns that the job ended from that record key at once (keys.ENDED: written by the last member to finish,
    or by the leader that finds the job failed), not at the end of its slice (sabotage: either write removed, the
    spare waited out its first slice, 10 s)."""
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), LONG_SLICES).start()
             for slot in range(3)]
    ended: dict[int, tuple[BaseException, float]] = {}

    def join(p: Participant) -> None:
        try:
            p.join(0)
        except (JobFailed, JobFinished) as exc:
            ended[p.slot] = (exc, time.monotonic())

    try:
        join_together(*parts[:2])
        spare = parts[2]
        threading.Thread(target=join, args=(spare,), daemon=True).start()
        assert spare.link is not None

        link = spare.link
        wait_until(lambda: link.requests()[("trainer", "append")] >= 1 and link.requests()[("trainer", "get")] >= 1,
                   15, "the spare in its wait for the next record (a first slice of 10 s)")
        assert spare.record is None
        started = time.monotonic()
        if end == "done":
            finished = [threading.Thread(target=p.finish, daemon=True) for p in parts[:2]]
            for t in finished:
                t.start()
        else:
            parts[0].clone_store().compare_set(keys.FATAL, "", "slot 7: FatalError: the dataset is gone")
            wait_until(lambda: all(p.interrupted for p in parts[:2]), 5, "the leader to end the generation")
            for p in parts[:2]:
                threading.Thread(target=join, args=(p,), daemon=True).start()
        wait_until(lambda: spare.slot in ended, 6, "the spare to learn that the job ended")
        exc, at = ended[spare.slot]
        assert isinstance(exc, JobFinished if end == "done" else JobFailed), exc
        assert at - started < 3.0, f"the spare learned of the end {at - started:.1f}s after it"
    finally:
        for p in parts:
            p.close()


# The helper watch looks every heartbeat_timeout in case; 30 s here, so only being told ends these in time.
SLOW_BACKSTOP = Timing(heartbeat_interval=0.1, heartbeat_timeout=30.0, join_timeout=0.5, barrier_timeout=60.0)


class BrokenStore:
    def __getattr__(self, name: str) -> object:
        raise RuntimeError("store connection lost")


@pytest.mark.parametrize("helper", ["leader", "heartbeat"])
def test_a_helper_thread_that_dies_tells_the_helper_watch_which_ends_the_process_at_once(
    store_server: StoreServer, job_id: str, helper: str
) -> None:
    ended: list[str] = []
    p = Participant(store_server.address, job_id, 0, QuorumPolicy(1), SLOW_BACKSTOP,
                    on_helper_failure=ended.append).start()
    try:
        wait_until(lambda: p.heartbeat.beats >= 2 and p.leader.is_leader, 10, "slot 0 to beat and lead")
        getattr(p, helper)._store = BrokenStore()
        wait_until(lambda: ended, 5, f"the helper watch to hear that the {helper} thread died")
        assert "store connection lost" in ended[0]
    finally:
        p.close(leaving=False)


def test_a_superseded_incarnation_is_ended_as_soon_as_its_leader_duty_reads_the_newer_one(
    store_server: StoreServer, job_id: str
) -> None:
    ended: list[str] = []
    old = Participant(store_server.address, job_id, 0, QuorumPolicy(1), SLOW_BACKSTOP,
                      on_helper_failure=ended.append).start()
    new = Participant(store_server.address, job_id, 0, QuorumPolicy(1), SLOW_BACKSTOP,
                      on_helper_failure=lambda reason: None).start()
    try:
        wait_until(lambda: ended, 5, "the old incarnation's helper watch to end it")
        assert f"superseded by incarnation {new.incarnation}" in ended[0]
    finally:
        new.close(leaving=False)
        old.close(leaving=False)


def test_a_finished_job_is_shown_with_its_last_generation_not_the_number_its_end_took(
        store_server: StoreServer, job_id: str) -> None:
    """The job's end takes the next number (keys.ENDED, so a waiting spare wakes); `ftcoord status` still shows the
    generation that ran last, its members and its end."""
    from ftcoord.observe.job_view import JobReader

    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), FAST).start() for slot in range(2)]
    try:
        join_together(*parts)
        finished = [threading.Thread(target=p.finish, daemon=True) for p in parts]
        for t in finished:
            t.start()
        for t in finished:
            t.join(10)
        store = parts[0].clone_store()
        assert get_or_none(store, keys.record(2)) == keys.ENDED.encode()
        view = JobReader(store, job_id).read()
        assert (view.generation, view.members, view.state) == (1, [0, 1], "done")
        assert [r["generation"] for r in view.recent] == [1]
    finally:
        for p in parts:
            p.close()
