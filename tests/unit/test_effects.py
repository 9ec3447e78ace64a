"""Holding a run to its scenario (chaos.effects): a planned fault that found nobody says why."""

from __future__ import annotations

from typing import Any

from chaos.effects import fault_problems
from chaos.scenario import parse

SCENARIO = """
name = "effects"
description = "a fault aimed at a rank the world lacks, and one at a slot"
[job]
nproc = 4
steps = 40
dataset = "synthetic:768"

[[faults]]
kind = "raise"
rank = 3
step = 20

[[faults]]
kind = "kill"
slot = 1
step = 30
"""


def steps(world_size: int, first: int, last: int) -> list[dict[str, Any]]:
    return [{"kind": "step", "step": s, "world_size": world_size, "generation": 1, "mono": float(s)}
            for s in range(first, last + 1)]


def test_a_rank_fault_at_a_step_trained_by_a_smaller_world_says_so() -> None:
    problems = fault_problems(parse(SCENARIO), [], steps(4, 0, 9) + steps(2, 10, 40), [])
    assert problems == [
        "planned fault raise at step 20 (rank 3) never fired: step 20 was committed at world size 2 only, with no "
        "rank 3 (aim at a rank below the world size the job keeps)",
        "planned fault kill at step 30 (slot 1) never fired"]


def test_a_rank_fault_whose_step_was_never_committed_says_so() -> None:
    problems = fault_problems(parse(SCENARIO), [], steps(4, 0, 15), [])
    assert problems[0] == "planned fault raise at step 20 (rank 3) never fired: step 20 was never committed"


def test_a_rank_fault_whose_rank_existed_gives_no_reason_it_cannot_know() -> None:
    problems = fault_problems(parse(SCENARIO), [], steps(4, 0, 40), [])
    assert problems[0] == "planned fault raise at step 20 (rank 3) never fired"


def test_a_fault_whose_step_another_fault_ended_first_says_so() -> None:
    """Two in-rank faults for one rank at one step: the first ends that rank's step, its peers commit it, and the
    step is not run again (mixed schedule H, drawn at random: a raise-midstep and a kill-midstep at step 34)."""
    scenario = parse(SCENARIO.replace('kind = "kill"\nslot = 1\nstep = 30',
                                      'kind = "kill-midstep"\nrank = 3\nstep = 20'))
    problems = fault_problems(scenario, [{"index": 0, "kind": "raise", "mono": 20.0}], steps(4, 0, 40), [])
    assert problems[-1] == (
        "planned fault kill-midstep at step 20 (rank 3) never fired: raise at the same step and target fired first "
        "and ended that step there, and a step its peers committed is not run again (plan one in-rank fault per "
        "target and step)")


def test_a_store_fault_while_the_job_stands_still_is_held_to_training_on() -> None:
    """A store restart 0.5 s after a node stopped answering (mixed schedule S3): the members stood in a collective with
    the silent node, so no step could be committed while the store was away. The run trained on after both: no
    problem. Alone, the same store fault is still held to steps committed while the store is away."""
    scenario = parse(SCENARIO.replace('kind = "raise"\nrank = 3\nstep = 20',
                                      'kind = "store-restart"\nstep = 20\nduration = 1.0'))
    partition = {"index": 1, "kind": "kill", "mono": 30.5}  # stands for the fault the job stood still behind
    store = {"index": 0, "kind": "store-restart", "mono": 31.0}
    still = steps(4, 0, 30) + [{**r, "mono": r["mono"] + 10, "generation": 2} for r in steps(4, 31, 39)]
    assert fault_problems(scenario, [partition, store], still, []) == []
    alone = fault_problems(scenario, [store, {**partition, "mono": 35.5}], still, [])
    assert alone == ["planned fault store-restart at step 20 (slot 0) had no effect: expected steps are committed "
                     "while the store is away (the step path needs no store) after it"]
