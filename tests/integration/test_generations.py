"""The global-iteration design note's scenarios, with real processes and a real store."""

from __future__ import annotations

import pytest

from tests.helpers.cluster import Job


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
