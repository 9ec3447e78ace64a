"""What a generation change cost, measured by its witness on its own clock (ftcoord.protocol.slot_report)."""

from __future__ import annotations

import pytest

from ftcoord.protocol.slot_report import STALL_BUCKETS, Incident, SlotReport, StallCounts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def trained(report: SlotReport, clock: Clock, steps: range, step_s: float) -> None:
    for step in steps:
        clock.now += step_s
        report.committed(step)
        report.committed(step)  # a second ping of one step counts once


def test_the_heal_source_measures_detection_stall_and_cost() -> None:
    clock = Clock()
    report = SlotReport(slot=3, clock=clock)
    report.joined(1, rank=0, heal_source=0, start_step=0, world_size=2)
    trained(report, clock, range(1, 11), 0.1)
    assert report.status()["steps_per_s"] == pytest.approx(10.0)
    clock.now += 0.3  # the fault, then its detection
    report.left("dead:slot=1", restarts=1)
    clock.now += 0.2
    report.joined(2, rank=0, heal_source=0, start_step=8, world_size=2)  # two committed steps are trained again
    assert report.take_incidents() == []
    trained(report, clock, range(9, 10), 0.1)
    [incident] = report.take_incidents()
    assert incident == Incident(generation=2, previous=1, cause="dead:slot=1", witness=3, world_size=2,
                                detect_s=0.3, stall_s=0.6, lost_steps=2, step_s=0.1, cost_s=0.7)
    assert Incident.from_json(incident.to_json()) == incident
    assert report.status()["in_process_restarts"] == 1
    trained(report, clock, range(10, 20), 0.1)
    assert report.take_incidents() == [], "one incident per generation change"


def test_a_generation_left_before_its_first_commit_keeps_the_step_time_of_the_one_before() -> None:
    """The step time an incident counts is that of the newest commit's generation, taken when it is left (not at
    every commit: a median per step, in every rank). A generation joined and left again before committing anything
    has no window of its own: the one before still measures (sabotage: taking the step time at every join, whatever
    the window holds, gives None here)."""
    clock = Clock()
    report = SlotReport(slot=3, clock=clock)
    report.joined(1, rank=0, heal_source=0, start_step=0, world_size=2)
    trained(report, clock, range(1, 11), 0.2)
    report.left("dead:slot=1", restarts=1)
    report.joined(2, rank=0, heal_source=0, start_step=10, world_size=2)
    clock.now += 0.5
    report.left("dead:slot=2", restarts=2)  # no step committed in generation 2
    report.joined(3, rank=0, heal_source=0, start_step=9, world_size=2)
    trained(report, clock, range(10, 11), 0.2)
    [incident] = report.take_incidents()
    assert incident.generation == 3 and incident.step_s == 0.2 and incident.lost_steps == 1


def test_only_the_heal_source_that_was_training_measures() -> None:
    clock = Clock()
    survivor, fresh = SlotReport(slot=0, clock=clock), SlotReport(slot=1, clock=clock)
    survivor.joined(1, rank=0, heal_source=0, start_step=0, world_size=2)
    trained(survivor, clock, range(1, 5), 0.1)
    survivor.left("dead:slot=1", restarts=1)
    survivor.joined(2, rank=1, heal_source=0, start_step=4, world_size=2)  # not the source: no incident
    fresh.joined(2, rank=0, heal_source=0, start_step=4, world_size=2)  # the source, but never trained
    trained(survivor, clock, range(5, 7), 0.1)
    trained(fresh, clock, range(5, 7), 0.1)
    assert survivor.take_incidents() == [] and fresh.take_incidents() == []


def test_checkpoint_stalls_are_a_cumulative_histogram() -> None:
    counts = StallCounts()
    for seconds in (0.003, 0.2, 0.2, 500.0):
        counts.observe(seconds)
    assert counts.count == 4 and counts.total == pytest.approx(500.403)
    assert counts.buckets[0] == 1 and counts.buckets[STALL_BUCKETS.index(0.25)] == 3
    assert counts.buckets[-2] == 3 and counts.buckets[-1] == 4  # 500 s only in +Inf
    assert counts.add(counts).buckets[-1] == 8
