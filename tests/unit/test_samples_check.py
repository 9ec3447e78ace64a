"""chaos.samples: the user-loop check fails, by name, on each planted fault in a sample log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.samples import SampleLog, check_samples

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
    ("torn", "is torn"),
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
    if plant == "torn":
        with (tmp_path / "samples-0-1.jsonl").open("a") as f:
            f.write('{"epoch": 1, "st')
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
