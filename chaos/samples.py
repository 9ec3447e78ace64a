"""Exactly once for a user's own loop: a sample log the loop writes, and the check that reads it.

The loop records, for every step it committed, the ids of the samples this rank trained (what the
batch held, as the dataset returned them, not what a sampler says it handed out):

    log = SampleLog(directory, slot)          # one file per process: samples-<slot>-<pid>.jsonl
    log.record(epoch, step, rank, world_size, generation, ids)

`check_samples(directory, size, epochs)` then proves, from those lines alone, that every sample of
every epoch was trained exactly once (no repeat, no skip, no id outside the dataset), that no
process's step or epoch ever went backwards, and names each problem. A step recorded in two
generations was redone: a rank that died may have committed a step its peers had not (it got the
all-reduce's last bytes, they did not), and the next generation trains that step again from the
survivors' state. The later generation's lines are the ones the model kept; `redone` counts such
steps (at most one per fault). A torn line (a process killed
inside its write) is a problem: the evidence for that step is incomplete. `chaos check-samples DIR
--size N --epochs E` is the same check from the command line.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.ledger import files_under


class SampleLog:
    """One JSON line per committed step, written with one write() (a SIGKILL loses no whole line)."""

    def __init__(self, directory: str | Path, slot: int) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"samples-{slot}-{os.getpid()}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.slot = slot

    def record(self, epoch: int, step: int, rank: int, world_size: int, generation: int, ids: list[int]) -> None:
        line = json.dumps({"epoch": epoch, "step": step, "rank": rank, "world_size": world_size,
                           "generation": generation, "slot": self.slot, "pid": os.getpid(),
                           "mono": time.monotonic(), "ids": [int(i) for i in ids]})
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class SampleCheck:
    problems: list[str] = field(default_factory=list)
    steps: int = 0
    """Distinct global steps seen."""
    redone: list[tuple[int, int]] = field(default_factory=list)
    """(epoch, step) of each step trained again by a later generation."""
    world_sizes: list[int] = field(default_factory=list)
    """The world size of each generation, in order."""
    trained_per_epoch: dict[int, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems


def read_samples(directory: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every complete line under a directory, in time order, and a problem for each torn one."""
    records, problems = [], []
    for path in files_under(directory, "samples-*.jsonl"):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(keepends=True), 1):
            try:
                if not line.endswith("\n"):
                    raise ValueError("no newline")
                records.append(json.loads(line))
            except ValueError:
                problems.append(f"{path.name} line {number} is torn: that step's evidence is incomplete")
    return sorted(records, key=lambda r: r["mono"]), problems


def check_samples(directory: str | Path, size: int, epochs: int) -> SampleCheck:
    """Every sample of every epoch exactly once, positions never backwards; see the module docstring."""
    records, problems = read_samples(directory)
    check = SampleCheck(problems)
    if not records:
        check.problems.append(f"no sample log under {directory}: nothing to check (did the loop write one?)")
        return check
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    per_process: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    generations: dict[int, int] = {}
    last_generation: dict[tuple[int, int], int] = {}
    for r in records:
        per_process[(r["slot"], r["pid"])].append((r["epoch"], r["step"]))
        generations[r["generation"]] = r["world_size"]
        position = (r["epoch"], r["step"])
        last_generation[position] = max(last_generation.get(position, r["generation"]), r["generation"])
    check.redone = sorted({(r["epoch"], r["step"]) for r in records
                           if r["generation"] < last_generation[(r["epoch"], r["step"])]})
    for r in records:
        if r["generation"] == last_generation[(r["epoch"], r["step"])]:
            per_epoch[r["epoch"]].update(r["ids"])
    check.steps = len(last_generation)
    check.world_sizes = [generations[g] for g in sorted(generations)]
    for (slot, pid), positions in per_process.items():
        back = [(a, b) for a, b in zip(positions, positions[1:], strict=False) if b <= a]
        if back:
            check.problems.append(f"slot {slot} (pid {pid}) went backwards: (epoch, step) {back[0][0]} then "
                                  f"{back[0][1]}")
    for epoch in range(epochs):
        seen = per_epoch.get(epoch, Counter())
        check.trained_per_epoch[epoch] = sum(seen.values())
        repeated = sorted(i for i, n in seen.items() if n > 1)
        missing = sorted(set(range(size)) - set(seen))
        outside = sorted(i for i in seen if not 0 <= i < size)
        for what, ids in (("trained more than once", repeated), ("never trained", missing),
                          ("outside the dataset", outside)):
            if ids:
                check.problems.append(f"epoch {epoch}: {len(ids)} samples {what}, e.g. {ids[:5]}")
    extra = sorted(set(per_epoch) - set(range(epochs)))
    if extra:
        check.problems.append(f"samples trained in epochs {extra}, beyond the {epochs} expected")
    return check
