"""The store's load stays flat in the job's size: requests per process per second, keys per generation.

Real store server, real Participants (threads); the counts are the requests each process's clients sent
(ftcoord.store_link counts them, a timed-out wait as two, a get as two: what the server handles).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from ftcoord import StoreServer, keys
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.decisions import TOMBSTONE_SPAN, forget
from ftcoord.participant import Participant
from ftcoord.record import GenerationRecord
from ftcoord.store_link import StoreLink
from tests.helpers.joining import join_together

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


def _generation(store: object, generation: int, world: int) -> None:
    """What a generation of `world` members leaves in the store: its record, join list and counter, arrivals,
    addresses, evidence, interrupt, probe, finish count, and gloo's rendezvous keys (8 bytes per peer each)."""
    record = GenerationRecord(generation=generation, members=tuple(range(world)), incarnations=(1,) * world,
                              leader=0, leader_term=1, target_world_size=world)
    store.compare_set(keys.record(generation), "", record.to_json())
    for slot in range(world):
        store.append(keys.joiners(generation), f'{{"slot": {slot}}}\n')
        store.add(keys.join_count(generation), 1)
        store.add(keys.arrived(generation), 1)
        store.append(keys.addresses(generation), f"{slot} 127.0.0.1:{40000 + slot}\n")
        store.set(keys.gloo_rendezvous(generation, slot), b"\0" * 8 * world)
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
