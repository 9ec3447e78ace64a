"""`chaos bench --scale`: a size that cannot fit in this machine's memory is refused up front, said, and counted
as a missed target (never a silent pass, never an out-of-memory kill halfway through)."""

from __future__ import annotations

import pytest

from chaos.bench_scale import does_not_fit, markdown, targets_missed, worker_processes

pytestmark = pytest.mark.timeout(30)


def test_the_worker_processes_are_the_leader_the_bulk_and_two_victims() -> None:
    assert worker_processes(64) == 4  # 0 | 1-61 | 62 | 63
    assert worker_processes(1024) == 19
    assert worker_processes(4096) == 67


def test_a_size_that_does_not_fit_says_what_it_needs_and_what_to_do() -> None:
    reason = does_not_fit(4096, worker_rss_mb=540, available_mb=22_000)
    assert reason is not None
    assert "4096 participants need ~" in reason and "67 worker processes x 540 MB" in reason
    assert "21.5 GiB is available" in reason and "leave it out of --sizes" in reason
    assert does_not_fit(1024, worker_rss_mb=540, available_mb=22_000) is None


def test_a_size_not_measured_is_a_missed_target_and_a_row_of_the_table() -> None:
    results = [{"participants": 4096, "not_measured": "4096 participants need ~36.9 GiB"}]
    misses = targets_missed(results)
    assert misses == ["N=4096: not measured: 4096 participants need ~36.9 GiB"]
    text = markdown(results, misses)
    assert "| 4096 | not measured: 4096 participants need ~36.9 GiB |" in text
    assert text.rstrip().endswith("missed: " + misses[0])
