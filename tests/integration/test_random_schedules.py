"""Randomized fault schedules across 4-8 real processes: the protocol's invariants hold.

Every schedule is reproducible from its seed. Faults: SIGKILL with the launcher's fast
path (marked dead), SIGKILL with no one telling the store, killing the leader, SIGSTOP
and SIGCONT, and restarts of dead slots at random moments (racing the next generation).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from tests.helpers.cluster import Job, Member

SEEDS = range(int(os.environ.get("FTCOORD_RANDOM_SEEDS", "24")))  # more: a soak run


def _leader_slot(job: Job) -> int:
    return int(job.client.get("leader").decode().split(":")[1])


def _run_schedule(job: Job, rng: random.Random, n: int) -> None:
    live: dict[int, Member] = {}
    for slot in range(n):
        live[slot] = job.start(slot, wait=False)
    for member in live.values():
        job.wait_started(member)
    job.wait_record(lambda r: len(r["members"]) == n, 30, f"all {n} processes in a generation")
    dead: set[int] = set()
    stopped: set[int] = set()
    for _ in range(rng.randint(4, 8)):
        action = rng.choice(["kill", "kill_unmarked", "kill_leader", "restart", "restart", "hang", "resume"])
        running = sorted(s for s in live if s not in dead and s not in stopped)
        if action in ("kill", "kill_unmarked", "kill_leader") and len(running) > 1:
            slot = _leader_slot(job) if action == "kill_leader" else rng.choice(running)
            if slot in dead:
                continue
            job.kill(live[slot], mark=action != "kill_unmarked")
            stopped.discard(slot)
            dead.add(slot)
        elif action == "restart" and dead:
            slot = rng.choice(sorted(dead))
            live[slot] = job.start(slot)
            dead.discard(slot)
        elif action == "hang" and len(running) > 1:
            slot = rng.choice(running)
            os.kill(live[slot].pid, signal.SIGSTOP)
            stopped.add(slot)
        elif action == "resume" and stopped:
            slot = rng.choice(sorted(stopped))
            os.kill(live[slot].pid, signal.SIGCONT)
            stopped.discard(slot)
        # Schedule jitter (fault timing, not synchronisation): faults land at any moment,
        # mid-decision included.
        time.sleep(rng.uniform(0.0, 0.6))
    for slot in stopped:
        os.kill(live[slot].pid, signal.SIGCONT)
    for slot in sorted(dead):
        live[slot] = job.start(slot)
    incarnations = {slot: m.incarnation for slot, m in live.items()}
    job.wait_record(
        lambda r: sorted(r["members"]) == list(range(n))
        and all(incarnations[s] == i for s, i in zip(r["members"], r["incarnations"], strict=True)),
        60, f"all {n} slots back in one generation",
    )
    codes = job.finish(timeout=60)
    assert set(codes.values()) == {0}, f"exit codes {codes}"


def check_invariants(events: list[dict], marks: list[tuple[int, int, float]]) -> None:
    """Same record for a generation everywhere, increasing generations, live members."""
    records = [e for e in events if e["kind"] == "record"]
    by_generation: dict[int, set[str]] = {}
    for event in records:
        by_generation.setdefault(event["record"]["generation"], set()).add(
            json.dumps(event["record"], sort_keys=True))
    forks = {g: texts for g, texts in by_generation.items() if len(texts) > 1}
    assert not forks, f"processes saw different records for the same generation: {forks}"

    per_process: dict[int, list[int]] = {}
    for event in records:
        per_process.setdefault(event["pid"], []).append(event["record"]["generation"])
    for pid, generations in per_process.items():
        assert generations == sorted(set(generations)), f"pid {pid} saw generations {generations}"

    for texts in by_generation.values():
        record = json.loads(next(iter(texts)))
        for slot, inc in zip(record["members"], record["incarnations"], strict=True):
            for mark_slot, mark_inc, marked_at in marks:
                assert not (mark_slot == slot and mark_inc == inc and marked_at < record["liveness_read_at"]), (
                    f"generation {record['generation']} lists slot {slot} incarnation {inc}, "
                    f"which was marked dead before the leader read liveness"
                )
            assert (slot, inc) in {tuple(c) for c in record["considered"]}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_fault_schedule_never_forks_or_deadlocks(make_job, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(4, 8)
    job: Job = make_job(target=n, min_world_size=1)
    try:
        _run_schedule(job, rng, n)
    finally:
        check_invariants(job.events(), job.marks)


def _record(generation: int, members: list[int], read_at: float = 10.0) -> dict:
    return {"kind": "record", "pid": 1, "record": {
        "generation": generation, "members": members, "incarnations": [1] * len(members),
        "considered": [[m, 1] for m in members], "liveness_read_at": read_at}}


def test_invariant_check_catches_a_forked_generation() -> None:
    other = {**_record(2, [0, 1]), "pid": 2}
    other["record"] = {**other["record"], "members": [0, 2]}
    with pytest.raises(AssertionError, match="different records"):
        check_invariants([_record(1, [0, 1]), _record(2, [0, 1]), other], [])


def test_invariant_check_catches_a_generation_going_backwards() -> None:
    with pytest.raises(AssertionError, match="saw generations"):
        check_invariants([_record(2, [0, 1]), _record(1, [0, 1])], [])


def test_invariant_check_catches_a_member_known_dead_before_the_decision() -> None:
    with pytest.raises(AssertionError, match="marked dead before"):
        check_invariants([_record(1, [0, 1], read_at=10.0)], [(1, 1, 9.0)])
