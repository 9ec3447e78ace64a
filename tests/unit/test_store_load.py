"""The store's load stays flat in the job's size: requests per process per second, keys per generation.

Real store server, real Participants (threads); the counts are the requests each process's clients sent
(ftcoord.store.link counts them, a timed-out wait as two, a get as two: what the server handles).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from ftcoord import StoreServer
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.protocol import keys
from ftcoord.protocol.generations import TOMBSTONE_SPAN, forget
from ftcoord.protocol.record import GenerationRecord
from ftcoord.store.link import StoreLink
from ftcoord.wrapper.participant import Participant
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(120)


def _requests(participant: Participant) -> Counter[tuple[str, str]]:
    assert participant.link is not None
    return participant.link.requests()


def test_a_participant_at_steady_state_sends_at_most_two_requests_per_heartbeat_interval(
        store_server: StoreServer, job_id: str) -> None:
    """Issue 17's budget, at the default timing: every process but the leader stays within 2 / heartbeat_interval
    (it was ~85/s: each read every slot's keys 4 times a second and waited on two keys in short slices), and the
    leader's own load does not grow per member."""
    timing = Timing()
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(6), timing).start() for slot in range(6)]
    try:
        join_together(*parts, timeout=30)
        assert all(p.generation == 1 for p in parts)

        def train() -> None:  # progress, as a training loop makes it (a local increment)
            while not stop.is_set():
                for p in parts:
                    p.heartbeat.ping()
                    p.report.committed(p.report.step + 1)
                stop.wait(0.05)

        stop = threading.Event()
        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        time.sleep(2 * timing.heartbeat_interval)  # every thread in its steady state
        before = [_requests(p) for p in parts]
        started = time.monotonic()
        time.sleep(12.0)  # longer than the slowest periodic request (the monitor's 10 s wait)
        elapsed = time.monotonic() - started
        rates = [sum((_requests(p) - b).values()) / elapsed for p, b in zip(parts, before, strict=True)]
        stop.set()
        budget = 2 / timing.heartbeat_interval
        leader = next(i for i, p in enumerate(parts) if p.leader.is_leader)
        followers = [round(r, 2) for i, r in enumerate(rates) if i != leader]
        assert max(followers) <= budget, f"requests per second of each follower: {followers}; budget {budget}"
        assert rates[leader] <= 40, f"the leader sent {rates[leader]:.1f} requests per second"
    finally:
        for p in parts:
            p.close()


def test_a_member_announces_itself_in_one_request_as_it_rejoins(store_server: StoreServer, job_id: str) -> None:
    """A member of an interrupted generation rejoins with one request before its wait for the record: the announcement
    (an append; its lines are the count the leader polls). A counter beside the list cost every member a second
    request on the advance's critical path (issue 17); the monitor, heartbeat and leader threads are not counted."""
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), Timing()).start() for slot in range(2)]
    try:
        join_together(*parts, timeout=30)
        assert all(p.generation == 1 for p in parts)
        parts[0].interrupt("test")
        wait_until(lambda: all(p.interrupted for p in parts), 10, "both members to see the interrupt")
        before = [_requests(p) for p in parts]
        join_together(*parts, timeout=30)
        assert all(p.generation == 2 for p in parts)
        for p, b in zip(parts, before, strict=True):
            sent = {op: n for (role, op), n in (_requests(p) - b).items() if role == "trainer"}
            assert sent.get("append") == 1 and "add" not in sent, f"slot {p.slot}'s rejoin sent {sent}"
    finally:
        for p in parts:
            p.close()


def _generation(store: object, generation: int, world: int) -> None:
    """What a generation of `world` members leaves in the store: its record, join list, arrivals,
    addresses, evidence, interrupt, probe, finish count, and gloo's rendezvous keys (keys.gloo_rendezvous)."""
    record = GenerationRecord(generation=generation, members=tuple(range(world)), incarnations=(1,) * world,
                              leader=0, leader_term=1, target_world_size=world)
    store.compare_set(keys.record(generation), "", record.to_json())
    for slot in range(world):
        store.append(keys.joiners(generation), f'{{"slot": {slot}}}\n')
        store.add(keys.arrived(generation), 1)
        store.append(keys.addresses(generation), f"{slot} 127.0.0.1:{40000 + slot}\n")
        store.set(keys.gloo_rendezvous(generation, slot), b"\0" * 154)
    for key in (keys.all_arrived, keys.interrupt, keys.probe, keys.evidence, keys.finished):
        store.set(key(generation), "1")


def test_the_store_does_not_grow_with_generations(job_id: str) -> None:
    """Every key a generation leaves is deleted when it is forgotten, the process group's rendezvous keys included
    (gloo's: never deleted before, ~8 W^2 bytes a generation), and tombstones end TOMBSTONE_SPAN generations later
    (sabotage: without either deletion, the count grows every generation)."""
    server = StoreServer("127.0.0.1", 0)  # its own: num_keys counts every key of the server
    link = StoreLink(server.address, job_id)
    store = link.connect()
    counts = {}
    last = TOMBSTONE_SPAN + 60
    for generation in range(1, last + 1):
        _generation(store, generation, world=8)
        forget(store, generation - 4)  # the leader keeps the newest four
        if generation in (TOMBSTONE_SPAN + 10, last):
            counts[generation] = store.num_keys()
    link.close()
    server.close()
    assert counts[last] == counts[TOMBSTONE_SPAN + 10], f"keys after each number of generations: {counts}"


@pytest.mark.slow  # a load measured over 30 s; a member's budget at steady state is in the default set
def test_a_hot_spare_waiting_for_its_turn_stays_within_the_budget_too(store_server: StoreServer, job_id: str) -> None:
    """A hot spare waits for a record for as long as the job runs (hours). It sent ~8 requests a second, twice the
    budget: it looked at the job's end (fatal, done, stopped) and at the running generation after every 2 s slice of
    its wait, and at the leader as often as the leader's deputies. The job's end now wakes it where it waits
    (keys.ENDED in the record it waits for), so its slices grow to two heartbeat timeouts and the rest is looked at
    once per slice; and the generation's own deputies watch its leader (ftcoord.leader.cadence)."""
    timing = Timing(heartbeat_interval=0.25, heartbeat_timeout=2.5)  # the defaults halved: budget and rates double
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(3), timing).start() for slot in range(6)]
    try:
        join_together(*parts[:3], timeout=30)
        for p in parts[3:]:
            threading.Thread(target=p.join, args=(0,), daemon=True).start()
        wait_until(lambda: all(p.generations.current() >= 1 for p in parts), 10, "generation 1")
        time.sleep(3 * timing.heartbeat_interval)
        spares = [p for p in parts if p.record is None]
        assert len(spares) == 3, [p.generation for p in parts]
        time.sleep(8.0)  # the spares' waits out of their first slices (2.5 and 5 s)
        before = [_requests(p) for p in spares]
        started = time.monotonic()
        time.sleep(10.0)  # two of their longest slices
        elapsed = time.monotonic() - started
        spent = [(_requests(p) - b) for p, b in zip(spares, before, strict=True)]
        rates = [round(sum(s.values()) / elapsed, 2) for s in spent]
        budget = 2 / timing.heartbeat_interval
        assert max(rates) <= budget, f"requests per second of each spare: {rates}; budget {budget}; {spent}"
    finally:
        for p in parts:
            p.close()


def test_a_member_whose_record_comes_late_only_waits_for_it(store_server: StoreServer, job_id: str) -> None:
    """A member that announced itself waits for the record, and what could end that wait otherwise (the job's end
    written by a process that died before marking it, a forgotten generation, no leader deciding) is a fallback
    looked at between slices. The first slice was one heartbeat interval: every member whose record came later
    (a leader waiting for a missing member; 4,096 members announcing on 2 cores) made those looks, twice, in the
    rush of the decision (chaos bench --scale at 4,096: the leader decided 2 s after the last announcement). Here
    the record comes 3 s (six intervals) after the announcement; the member's trainer sends what a member whose
    record came at once sends (sabotage: a first slice of one interval sends three rounds of looks)."""
    timing = Timing()
    first = Participant(store_server.address, job_id, 0, QuorumPolicy(2, min_world_size=2), timing).start()
    second = Participant(store_server.address, job_id, 1, QuorumPolicy(2, min_world_size=2), timing).start()
    try:
        before = [_requests(first), _requests(second)]
        joining = threading.Thread(target=first.join, args=(0,), daemon=True)
        joining.start()
        time.sleep(6 * timing.heartbeat_interval)  # no quorum: the record waits for the second member
        assert first.record is None
        second.join(0)  # its record comes at once
        joining.join(10)
        assert first.generation == second.generation == 1
        late, prompt = ({op: n for (role, op), n in (_requests(p) - b).items() if role == "trainer"}
                        for p, b in zip((first, second), before, strict=True))
        assert late == prompt, f"the join sent {late} when its record came late, {prompt} when it came at once"
    finally:
        first.close()
        second.close()


def test_a_rejoin_that_waits_past_its_first_slice_reads_no_record_of_the_interrupted_generation(
        store_server: StoreServer, job_id: str) -> None:
    """Past its first slice a waiting member starts its deadline once the generation before ended: a `check` of its
    interrupt answers that for a rejoin, where the record of that generation (every member's slot, incarnation and
    step: kilobytes at thousands of members) was read first (sabotage: the record read before the check)."""
    timing = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0)  # a first slice of 1 s
    policy = QuorumPolicy(2, min_world_size=2)
    first, second = (Participant(store_server.address, job_id, slot, policy, timing).start() for slot in range(2))
    try:
        join_together(first, second, timeout=30)
        assert first.generation == second.generation == 1
        first.interrupt("test")
        wait_until(lambda: first.interrupted and second.interrupted, 10, "both members to see the interrupt")
        before = _requests(first)
        joining = threading.Thread(target=first.join, args=(0,), daemon=True)
        joining.start()
        wait_until(lambda: _requests(first)[("trainer", "cancel_wait")] > before[("trainer", "cancel_wait")], 10,
                   "the rejoin's first slice to run out (the record waits for the second member)")
        assert first.generation == 1
        second.join(0)
        joining.join(10)
        assert first.generation == second.generation == 2
        sent = {op: n for (role, op), n in (_requests(first) - before).items() if role == "trainer"}
        assert sent.get("check", 0) >= 1, f"the rejoin looked at nothing past its first slice: {sent}"
        # Past the slice: three looks at the job's end (fatal, done, stopped: ftcoord.store.client.get_or_none, a
        # compare_set
        # each) and the check; a read of the record before would be a fourth compare_set.
        assert sent.get("compare_set") == 3, f"the rejoin read more than the job's end past its slice: {sent}"
    finally:
        first.close()
        second.close()
