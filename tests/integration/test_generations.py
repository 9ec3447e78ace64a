"""The global-iteration design note's scenarios, with real processes and a real store."""

from __future__ import annotations

import pytest

from tests.helpers.cluster import Job
from tests.helpers.wait import wait_until


def members_of(record: dict) -> list[int]:
    return list(record["members"])


def test_all_present_decide_generation_one_with_everyone(make_job) -> None:
    job: Job = make_job(target=3)
    for slot in range(3):
        job.start(slot)
    record = job.wait_record(lambda r: True, 20, "generation 1")
    assert record["generation"] == 1
    assert members_of(record) == [0, 1, 2]
    assert set(job.finish().values()) == {0}


def test_crashed_rank_is_excluded_then_catches_up_after_restart(make_job) -> None:
    job: Job = make_job(target=3)
    m = [job.start(slot) for slot in range(3)]
    job.wait_record(lambda r: r["members"] == [0, 1, 2], 20, "all three in generation 1")
    job.kill(m[1])
    shrunk = job.wait_record(lambda r: r["members"] == [0, 2], 20, "survivors advancing without slot 1")
    restarted = job.start(1)
    grown = job.wait_record(lambda r: r["members"] == [0, 1, 2] and r["generation"] > shrunk["generation"],
                            20, "the restarted slot to catch up")
    assert grown["incarnations"][1] == restarted.incarnation
    codes = job.finish()
    assert codes[restarted.pid] == 0 and codes[m[0].pid] == 0 and codes[m[2].pid] == 0


def test_restart_before_leader_advanced_rejoins_without_deadlock(make_job) -> None:
    """The note's race: the crashed rank is back before anyone noticed it died."""
    job: Job = make_job(target=3)
    m = [job.start(slot) for slot in range(3)]
    first = job.wait_record(lambda r: r["members"] == [0, 1, 2], 20, "generation 1")
    job.kill(m[1], mark=False)  # no launcher: nobody tells the store
    back = job.start(1)  # back well inside heartbeat_timeout
    record = job.wait_record(lambda r: r["generation"] > first["generation"], 20, "the next generation")
    # The newcomer interrupted the old generation itself (its slot was a member), so the
    # next record already has it, with its new incarnation: no shrink-then-grow.
    assert record["members"] == [0, 1, 2]
    assert record["incarnations"][1] == back.incarnation
    assert record["generation"] == first["generation"] + 1
    assert set(job.finish().values()) == {0}


def test_late_joiner_of_a_decided_generation_moves_on_and_interrupts(make_job) -> None:
    """A process whose generation was decided without it joins the next one."""
    job: Job = make_job(target=3, min_world_size=2)
    job.start(0)
    job.start(1)
    partial = job.wait_record(lambda r: r["members"] == [0, 1], 20, "a partial generation of two")
    late = job.start(2)
    grown = job.wait_record(lambda r: r["members"] == [0, 1, 2], 20, "the late process to be let in")
    assert grown["generation"] > partial["generation"]
    assert grown["incarnations"][2] == late.incarnation
    assert set(job.finish().values()) == {0}


def _leader(job: Job) -> tuple[int, int, int]:
    term, slot, inc = job.client.get("leader").decode().split(":")
    return int(term), int(slot), int(inc)


@pytest.mark.parametrize("marked", [True, False], ids=["launcher-marks-dead", "heartbeat-timeout"])
def test_killed_leader_is_replaced_and_generation_advances(make_job, marked: bool) -> None:
    job: Job = make_job(target=3)
    m = [job.start(slot) for slot in range(3)]
    first = job.wait_record(lambda r: r["members"] == [0, 1, 2], 20, "generation 1")
    term, leader_slot, _ = _leader(job)
    job.kill(m[leader_slot], mark=marked)
    survivors = sorted({0, 1, 2} - {leader_slot})
    record = job.wait_record(lambda r: r["members"] == survivors, 20, "survivors to advance")
    assert record["generation"] == first["generation"] + 1
    assert record["leader"] != leader_slot
    assert record["leader_term"] > term
    new_term, new_slot, _ = _leader(job)
    assert new_term > term and new_slot in survivors
    assert {job.finish()[m[s].pid] for s in survivors} == {0}


def test_partial_quorum_after_join_timeout(make_job) -> None:
    job: Job = make_job(target=4, min_world_size=2, join_timeout=0.8)
    for slot in range(3):
        job.start(slot)
    record = job.wait_record(lambda r: True, 20, "a partial generation")
    assert record["members"] == [0, 1, 2]
    # The leader logs its decision after the record write the wait saw (CI, once: read before it was written).
    log = wait_until(lambda: [e for m in job.members for e in _log(m) if e.get("event") == "generation_decided"], 10,
                     "the leader to log its decision")
    assert log[0]["partial"] is True
    assert set(job.finish().values()) == {0}


def test_partial_quorum_trims_to_a_divisor_of_the_global_batch(make_job) -> None:
    job: Job = make_job(target=4, min_world_size=1)
    job.extra_args = ["--global-batch", "8"]
    for slot in range(3):
        job.start(slot)
    record = job.wait_record(lambda r: True, 20, "a partial generation")
    assert record["members"] == [0, 1]  # 3 does not divide 8: the third is a hot spare
    assert record["spares"] == [2]
    assert set(job.finish().values()) == {0}


def test_hot_spare_fills_a_dead_slot(make_job) -> None:
    job: Job = make_job(target=2)
    m = [job.start(slot) for slot in range(3)]  # slot 2 is the spare
    first = job.wait_record(lambda r: True, 20, "generation 1")
    assert first["members"] == [0, 1]
    spare_slot = [s for s in (0, 1, 2) if s not in first["members"]][0]
    victim = first["members"][1]
    job.kill(m[victim])
    record = job.wait_record(lambda r: r["generation"] > first["generation"], 20, "the spare to step in")
    assert sorted(record["members"]) == sorted({0, 1, 2} - {victim})
    assert spare_slot in record["members"]
    assert len(record["members"]) == 2
    codes = job.finish()
    assert {codes[m[s].pid] for s in (0, 1, 2) if s != victim} == {0}


def test_too_few_processes_fail_every_process_with_a_clear_error(make_job) -> None:
    job: Job = make_job(target=3, min_world_size=3, barrier_timeout=2.0)
    m = [job.start(slot) for slot in range(2)]
    wait_until(lambda: all(not job.alive(x) for x in m), 20, "both processes to give up")
    codes = job.finish()
    assert codes[m[0].pid] == 3 and codes[m[1].pid] == 3
    errors = [e["error"] for e in job.events() if e["kind"] == "quorum_timeout"]
    assert len(errors) == 2
    assert "only 2 live process(es)" in errors[0] and "min_world_size is 3" in errors[0]


def _log(member) -> list[dict]:
    import json

    path = member.events.with_suffix(".log.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_hung_process_is_declared_dead_after_heartbeat_timeout_and_not_before(make_job) -> None:
    import os
    import signal
    import time

    timeout, interval = 1.5, 0.1
    job: Job = make_job(target=3, heartbeat_timeout=timeout, heartbeat_interval=interval)
    m = [job.start(slot) for slot in range(3)]
    first = job.wait_record(lambda r: r["members"] == [0, 1, 2], 20, "generation 1")
    _, leader_slot, _ = _leader(job)
    victim = m[(leader_slot + 1) % 3]
    stopped_at = time.monotonic()
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        key = f"gen/{first['generation']}/interrupt"
        wait_until(lambda: job.client.check([key]), timeout * 4, "the hung process to be declared dead")
        detected = time.monotonic() - stopped_at
        tick = min(interval / 2, 0.25)
        # The last beat may have come up to one interval before the stop.
        assert detected >= timeout - interval - tick, f"declared dead after only {detected:.2f}s"
        assert detected <= timeout + interval + 3 * tick + 0.5, f"took {detected:.2f}s"
        survivors = sorted({0, 1, 2} - {victim.slot})
        job.wait_record(lambda r: r["members"] == survivors, 20, "survivors to continue")
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    # Woken up, it notices it was left out and rejoins; the job ends cleanly.
    job.wait_record(lambda r: r["members"] == [0, 1, 2] and r["generation"] > 2, 20, "the woken process to rejoin")
    assert set(job.finish().values()) == {0}
