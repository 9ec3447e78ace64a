"""chaos.proof.samples: the user-loop check fails, by name, on each planted fault in a sample log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.proof.samples import SampleLog, check_samples

pytestmark = pytest.mark.timeout(30)

SIZE, BATCH = 8, 2  # 2 ranks: 2 steps an epoch


def write_run(directory: Path, epochs: int = 2) -> list[dict[str, Any]]:
    """A correct 2-rank run, one file per rank."""
    logs = [SampleLog(directory, slot) for slot in (0, 1)]
    for epoch in range(epochs):
        for s in range(2):
            step = epoch * 2 + s
            for rank, log in enumerate(logs):
                start = s * 4 + rank * BATCH
                log.record(epoch, step, rank, 2, 1, list(range(start, start + BATCH)))
    for log in logs:
        log.close()
    return [json.loads(line) for p in sorted(directory.glob("*.jsonl")) for line in p.read_text().splitlines()]


def rewrite(directory: Path, records: list[dict[str, Any]]) -> None:
    for p in directory.glob("*.jsonl"):
        p.unlink()
    (directory / "samples-0-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_correct_run_passes(tmp_path: Path) -> None:
    write_run(tmp_path)
    check = check_samples(tmp_path, SIZE, 2)
    assert check.passed, check.problems
    assert check.steps == 4 and check.world_sizes == [2] and check.redone == []


@pytest.mark.parametrize("plant, says", [
    ("repeat", "trained more than once"),
    ("skip", "never trained"),
    ("outside", "outside the dataset"),
    ("backwards", "went backwards"),
    ("torn", "is torn, and lines follow it"),
    ("missing epoch", "epoch 1: 8 samples never trained"),
])
def test_each_planted_fault_fails_by_name(tmp_path: Path, plant: str, says: str) -> None:
    records = write_run(tmp_path)
    if plant == "repeat":
        records[1]["ids"] = records[0]["ids"]
    elif plant == "skip":
        records[1]["ids"] = records[1]["ids"][:1]
    elif plant == "outside":
        records[1]["ids"] = [99, 100]
    elif plant == "backwards":
        records[1]["step"], records[1]["mono"] = 0, records[0]["mono"] + 1e-6
        records[0]["step"] = 1
    elif plant == "missing epoch":
        records = [r for r in records if r["epoch"] == 0]
    rewrite(tmp_path, records)
    if plant == "torn":  # a torn line with lines after it: no death explains it
        path = tmp_path / "samples-0-1.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join([*lines[:2], '{"epoch": 1, "st', *lines[2:]]))
    check = check_samples(tmp_path, SIZE, 2)
    assert not check.passed and any(says in p for p in check.problems), check.problems


def test_a_step_redone_by_a_later_generation_counts_once(tmp_path: Path) -> None:
    """A rank that died may have committed a step its peers had not: the next generation trains it again."""
    records = write_run(tmp_path)
    dead = dict(records[-1], generation=1, pid=999, mono=records[-1]["mono"] - 1)  # the dead rank's last step
    for r in records:
        if r["step"] == 3:
            r["generation"] = 2
    rewrite(tmp_path, [*records, dead])
    check = check_samples(tmp_path, SIZE, 2)
    assert check.passed, check.problems
    assert check.redone == [(1, 3)]


def test_no_log_at_all_is_a_failure(tmp_path: Path) -> None:
    check = check_samples(tmp_path, SIZE, 1)
    assert not check.passed and "nothing to check" in check.problems[0]


def test_a_torn_last_line_is_a_death_inside_the_write_and_not_a_gap(tmp_path: Path) -> None:
    """Lines are written before the step's forward pass: a process killed inside its write contributed no
    gradient to that step, which the next generation then trains again."""
    write_run(tmp_path)
    with (tmp_path / "samples-1-999.jsonl").open("w") as f:
        f.write('{"epoch": 1, "step": 3, "ra')
    check = check_samples(tmp_path, SIZE, 2)
    assert check.passed and check.torn_last == 1, check.problems


def test_a_process_may_redo_the_step_its_last_generation_was_interrupted_in(tmp_path: Path) -> None:
    records = write_run(tmp_path)
    again = [dict(r, generation=2, mono=r["mono"] + 100) for r in records if r["step"] == 3]
    for r in records:
        if r["step"] == 3:
            r["ids"] = [0, 1]  # what generation 1 attempted there no longer counts: generation 2 trained it
    rewrite(tmp_path, [*records, *again])
    check = check_samples(tmp_path, SIZE, 2)
    assert check.passed, check.problems
    assert check.redone == [(1, 3)]


def test_a_replacement_that_trains_committed_steps_again_fails(tmp_path: Path) -> None:
    """Generation 1 trained steps 0-3; a replacement's generation 2 starts over at step 2. Every sample still counts
    once (the latest generation wins each step), but steps 2 and 3 were committed by generation 1 before it."""
    records = write_run(tmp_path)
    again = [dict(r, generation=2, pid=999, mono=r["mono"] + 100) for r in records if r["step"] >= 2]
    rewrite(tmp_path, [*records, *again])
    check = check_samples(tmp_path, SIZE, 2)
    assert not check.passed
    assert any("generation 2 started at (epoch, step) (1, 2), below (1, 3), which every rank of generation 1 had "
               "reached" in p for p in check.problems), check.problems


@pytest.mark.parametrize("plant, says", [
    ("overlap", "the ranks' shards overlap: 1 ids in two shards, e.g. [4]"),
    ("rank twice", "rank(s) [0] trained it more than once"),
    ("rank absent", "rank(s) [1] of 2 have no line for it"),
    ("world sizes", "its lines disagree on the world size: [2, 3]"),
])
def test_a_steps_lines_are_one_shard_per_rank(tmp_path: Path, plant: str, says: str) -> None:
    records = write_run(tmp_path)
    step1 = [r for r in records if r["step"] == 1]  # ranks 0 and 1: ids [4, 5] and [6, 7]
    if plant == "overlap":
        step1[1]["ids"] = [4, 7]
    elif plant == "rank twice":
        step1[1]["rank"] = 0
    elif plant == "rank absent":
        records.remove(step1[1])
    elif plant == "world sizes":
        step1[1]["world_size"] = 3
    rewrite(tmp_path, records)
    check = check_samples(tmp_path, SIZE, 2)
    assert not check.passed and any(says in p for p in check.problems), check.problems


def test_a_dying_rank_that_reached_a_step_alone_does_not_raise_the_floor(tmp_path: Path) -> None:
    """Rank 0 alone got through step 2's all-reduce, wrote its line for step 3 and died: its peer had not committed
    step 2, so the next generation starts at step 2, below rank 0's line, and that is right."""
    records = write_run(tmp_path)
    for r in records:
        if r["step"] >= 2:
            r["generation"], r["mono"] = 2, r["mono"] + 100
    ahead = dict(next(r for r in records if r["step"] == 3 and r["rank"] == 0), generation=1, pid=999, mono=50.0)
    rewrite(tmp_path, [*records, ahead])
    check = check_samples(tmp_path, SIZE, 2)
    assert check.passed, check.problems
    assert check.redone == [(1, 3)]


def test_a_relaunch_on_a_new_store_numbers_its_generations_anew(tmp_path: Path) -> None:
    """Launch 1 (generations 1 and 2) stopped at step 2, which both ranks attempted; the relaunch, on a new embedded
    store (another port), starts its own generation 1 at step 2, from the snapshot. Generation numbers repeat; the
    store's address tells them apart, and the relaunch's lines count for step 2."""
    records = write_run(tmp_path)
    for r in records:
        r["generation"] = 1 if r["step"] < 2 else 2
    attempt = [dict(r, pid=900 + r["rank"], ids=[0, 1]) for r in records if r["step"] == 2]  # launch 1's attempt
    relaunch = [dict(r, mono=r["mono"] + 100, generation=1, store="127.0.0.1:40001") for r in records if r["step"] >= 2]
    launch_1 = [r for r in records if r["step"] < 2]
    rewrite(tmp_path, [*launch_1, *attempt, *relaunch])
    check = check_samples(tmp_path, SIZE, 2)
    assert check.passed, check.problems
    assert check.redone == [(1, 2)] and check.world_sizes == [2, 2, 2]
