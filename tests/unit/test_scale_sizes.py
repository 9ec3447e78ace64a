"""`chaos bench --scale`: how a size is laid out in processes; a size that cannot fit in this machine's memory or
thread limits is refused up front, said, and counted as a missed target (never a silent pass, never an
out-of-memory kill halfway through)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest

from chaos.scale.bench import between_advances
from chaos.scale.layout import DoesNotFit, Machine, WorkerMemory, layout, per_process, worker_processes
from chaos.scale.report import markdown, targets_missed
from ftcoord import Timing

pytestmark = pytest.mark.timeout(60)

MEASURED = WorkerMemory(process_mb=294, participant_mb=0.4, shared_mb=374)  # torch 2.14.1, this machine
CORES = 0.0001  # so that these tests are about memory, threads and connections


def machine(available_mb: float = 22_000, free_tasks: int = 30_000, open_files: int = 20_000,
            cores: int = 64) -> Machine:
    return Machine(available_mb, free_tasks, open_files, cores)


def test_the_worker_processes_are_the_leader_the_bulk_and_two_victims() -> None:
    assert worker_processes(64) == 4  # 0 | 1-61 | 62 | 63
    assert worker_processes(1024) == 19
    assert worker_processes(4096) == 67
    assert worker_processes(4096, 256) == 3 + 16


def test_the_fewest_participants_per_process_that_fit_are_used() -> None:
    assert per_process(1024, MEASURED, machine(22_000, 30_000, 20_000), CORES) == 64
    # 67 processes of 294 MB each would not fit in 22 GB; 35 of them do
    assert per_process(4096, MEASURED, machine(22_000, 30_000, 20_000), CORES) == 128
    assert per_process(4096, MEASURED, machine(12_000, 30_000, 20_000), CORES) == 256


def test_a_size_whose_participants_would_take_the_machines_cores_at_steady_state_is_refused() -> None:
    # measured here: 0.246 of a core for 1,024 participants at steady state; 4,096 at that rate (49% of the cores)
    # were started once and aborted in start-up
    assert per_process(1024, MEASURED, machine(cores=2), 0.246 / 1024, measured_at=1024) == 64
    with pytest.raises(DoesNotFit, match=r"4096 participants would keep ~1.0 of this machine's 2 cores busy .* "
                                         r"measured at 1024.* more than the 40%"):
        per_process(4096, MEASURED, machine(cores=2), 0.246 / 1024, measured_at=1024)
    assert per_process(4096, MEASURED, machine(cores=8), 0.246 / 1024, measured_at=1024) == 128  # 12% of 8 cores
    assert layout(4096, MEASURED, machine(cores=2)) == 128  # its floor alone is laid out as it would have been
    with pytest.raises(DoesNotFit, match=r"this machine's usual"):  # nothing measured yet: the usual cost
        per_process(4096, MEASURED, machine(cores=2))


def test_participants_run_as_events_may_take_more_of_the_cores_than_threads() -> None:
    # 4,096 as events at a heartbeat every 2 s: 0.261 of a core for 1,024 at steady state, 52% of 2 cores at that
    # rate; they formed and advanced. As threads, 49% never formed.
    cost = 0.261 / 1024
    assert per_process(4096, MEASURED, machine(cores=2), cost, measured_at=1024, participants="events") == 128
    with pytest.raises(DoesNotFit, match=r"more than the 40% they may take as threads"):
        per_process(4096, MEASURED, machine(cores=2), cost, measured_at=1024, participants="threads")
    # the default timing's steady state (0.47 ms a second each): ~1.9 of 2 cores, refused either way
    with pytest.raises(DoesNotFit, match=r"~1.9 of .* 2 cores .* more than the 60% they may take as events"):
        per_process(4096, MEASURED, machine(cores=2), 0.00047, measured_at=1024, participants="events")


def test_shared_library_pages_are_counted_once_not_per_process() -> None:
    need = MEASURED.need_mb(4096, 64)
    assert need < 67 * (294 + 374)  # what a sum of the workers' RSS would say
    assert need == pytest.approx(67 * 294 + 4096 * 0.4 + 374 + 1536)


def test_a_size_that_does_not_fit_says_what_it_needs_and_what_to_do() -> None:
    with pytest.raises(DoesNotFit) as caught:
        per_process(4096, MEASURED, machine(6_000, 30_000, 20_000), CORES)
    reason = str(caught.value)
    assert "4096 participants need ~" in reason and "at 512 per process" in reason
    assert "11 worker processes x 294 MB" in reason and "5.9 GiB is available" in reason
    assert "leave it out of --sizes" in reason


def test_a_size_with_more_threads_than_the_kernel_allows_is_refused() -> None:
    with pytest.raises(DoesNotFit, match=r"4096 participants need ~24576 threads .* allows 20000 more"):
        per_process(4096, MEASURED, machine(100_000, 20_000, 20_000), CORES)


def test_a_size_with_more_connections_than_the_store_may_hold_is_refused() -> None:
    with pytest.raises(DoesNotFit, match=r"4096 participants need ~16448 connections .* may open 16000 files"):
        per_process(4096, MEASURED, machine(100_000, 100_000, 16_000), CORES)


def test_the_memory_of_a_live_process_is_read_private_and_shared_apart() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys, torch; print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        measured = WorkerMemory.measured(child.pid, [])
        assert measured.process_mb > 100 and measured.shared_mb > 100  # torch: own pages, libraries
        assert measured.participant_mb == 0.1  # no bulk worker to measure it on: the floor
    finally:
        child.kill()
        child.wait()


def test_a_size_not_measured_is_a_missed_target_and_a_row_of_the_table() -> None:
    results = [{"participants": 4096, "not_measured": "4096 participants need ~36.9 GiB"}]
    misses = targets_missed(results)
    assert misses == ["N=4096: not measured: 4096 participants need ~36.9 GiB"]
    text = markdown(results, misses)
    assert "| 4096 | not measured: 4096 participants need ~36.9 GiB |" in text
    assert text.rstrip().endswith("missed: " + misses[0])


def test_a_size_too_big_to_simulate_with_nothing_smaller_measured_says_why_its_floor_was_not_measured_either(
) -> None:
    from chaos.scale.bench import _floor_beyond

    result = {"participants": 4096, "not_measured": "4096 participants would keep ~1.8 of this machine's 2 cores busy",
              **_floor_beyond(4096, MEASURED, 3, [], "events")}
    misses = targets_missed([result])
    assert misses == ["N=4096: not measured: 4096 participants would keep ~1.8 of this machine's 2 cores busy"]
    assert ("- N=4096: not simulated (above), nor its floor: no smaller size was measured before it, to size its "
            "record by: put one first in --sizes") in markdown([result], misses)


def test_a_slow_change_says_who_was_late_where_they_waited_and_why_an_unasked_change_came() -> None:
    from chaos.scale.report import _slow_lines

    result = {"participants": 1024, "stragglers": [
        {"generation": 16, "phase": "announce", "after_s": 3.3, "count": 114, "workers": [1, 65], "slots": [2, 8],
         "threads": {"ftcoord-monitor-2": ["/x/threading.py:1002 _bootstrap", "/x/ftcoord/store.py:179 woken"],
                     "state-2": {"generation": 16, "fired": True}}},
        {"generation": 17, "phase": "slow", "took_s": 7.8, "latest_by_worker": {0: 0.5, 65: 7.8, 129: 7.7}}],
        "unasked_changes": [{"generation": 5, "to": 7, "reasons": {5: "dead:slot=3", 6: "grow:slot=3"}}]}
    lines = _slow_lines(result)
    assert lines[0].startswith("- N=1024: after generation 16, 114 participant(s) had not announced themselves 3.3 s")
    assert lines[0].endswith("their threads were in: store.py:179 woken")
    assert lines[1] == ("- N=1024: the change to generation 17 took 7.8 s; latest by worker: slots from 65: 7.8 s, "
                        "slots from 129: 7.7 s, slots from 0: 0.5 s")
    assert lines[2] == "- N=1024: unasked change after generation 5: {5: 'dead:slot=3', 6: 'grow:slot=3'}"


def test_advances_begin_at_any_moment_of_the_leaders_round() -> None:
    """A fixed pause between advances began every one at the same moment of the leader's round (its read of every
    slot, at 1,024 participants): the figures measured that moment alone, where a fault comes at any."""
    timing = Timing()
    rng = random.Random(1024)
    gaps = [between_advances(rng, timing) for _ in range(200)]
    assert all(0.5 <= gap <= 0.5 + 2 * timing.tick for gap in gaps)
    quarters = Counter(int((gap - 0.5) // (timing.tick / 2)) for gap in gaps)
    assert set(quarters) == {0, 1, 2, 3}, f"the gaps do not cover two ticks: {sorted(quarters.items())}"
