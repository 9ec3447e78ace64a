"""Exactly once for a user's own loop: a sample log the loop writes, and the check that reads it.

For every step it attempts, **before** the forward pass, the loop records the ids its rank's batch holds, as the
dataset returned them: `SampleLog(directory, slot).record(epoch, step, rank, world_size, generation, ids)`, one file
per process. A committed step went through an all-reduce every rank had contributed to, so every rank's line exists.
Only the step a generation was interrupted in is trained again, by the next generation, whose lines count (`redone`).
`check_samples` (`chaos check-samples DIR --size N --epochs E`) proves from the lines alone: every sample of every
epoch trained exactly once; no generation starts before the step its predecessor was interrupted in; each step's
lines are one per rank of one world size, whose shards do not overlap; no process's position goes backwards. A torn
line inside a file is a problem; a torn last line is a death inside its write, before the forward pass (`torn_last`).
A relaunch from an older snapshot trains steps again: the lines cannot show that the state was rolled back, so it fails.
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
    """One JSON line per attempted step, written with one write() (a SIGKILL loses no whole line)."""

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
    torn_last: int = 0
    """Files whose last line is torn: processes that died inside the write."""
    world_sizes: list[int] = field(default_factory=list)
    """The world size of each generation, in order."""
    trained_per_epoch: dict[int, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems


def read_samples(directory: str | Path) -> tuple[list[dict[str, Any]], list[str], int]:
    """Every complete line under a directory, in time order, a problem for each torn line inside a file,
    and how many files end in a torn line (see the module docstring)."""
    records, problems, torn_last = [], [], 0
    for path in files_under(directory, "samples-*.jsonl"):
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        for number, line in enumerate(lines, 1):
            try:
                if not line.endswith("\n"):
                    raise ValueError("no newline")
                records.append(json.loads(line))
            except ValueError:
                if number == len(lines):
                    torn_last += 1
                else:
                    problems.append(f"{path.name} line {number} is torn, and lines follow it: only a death "
                                    f"inside the last write tears a line")
    return sorted(records, key=lambda r: r["mono"]), problems, torn_last


def check_samples(directory: str | Path, size: int, epochs: int) -> SampleCheck:
    """Every sample of every epoch exactly once, positions never backwards; see the module docstring."""
    records, problems, torn_last = read_samples(directory)
    check = SampleCheck(problems, torn_last=torn_last)
    if not records:
        check.problems.append(f"no sample log under {directory}: nothing to check (did the loop write one?)")
        return check
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    per_process: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    generations: dict[int, int] = {}
    last_generation: dict[tuple[int, int], int] = {}
    for r in records:
        per_process[(r["slot"], r["pid"])].append((r["generation"], r["epoch"], r["step"]))
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
    _check_generations_follow_on(records, check)
    _check_shards(records, last_generation, check)
    for (slot, pid), positions in per_process.items():
        back = [(a, b) for a, b in zip(positions, positions[1:], strict=False)
                if b[1:] < a[1:] or (b[1:] == a[1:] and b[0] <= a[0])]
        if back:
            (_, *was), (_, *then) = back[0]
            check.problems.append(f"slot {slot} (pid {pid}) went backwards: (epoch, step) {tuple(was)} then "
                                  f"{tuple(then)}")
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


def _check_generations_follow_on(records: list[dict[str, Any]], check: SampleCheck) -> None:
    """A generation starts at the step its predecessor was interrupted in (its last attempted step), or after it:
    one that starts before trains again steps a member had committed."""
    spans: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
    for r in records:
        position = (r["epoch"], r["step"])
        first, last = spans.get(r["generation"], (position, position))
        spans[r["generation"]] = (min(first, position), max(last, position))
    order = sorted(spans)
    for before, after in zip(order, order[1:], strict=False):
        if spans[after][0] < spans[before][1]:
            check.problems.append(
                f"generation {after} started at (epoch, step) {spans[after][0]}, before {spans[before][1]}, the "
                f"step generation {before} was interrupted in: steps committed before it were trained again")


def _check_shards(records: list[dict[str, Any]], last_generation: dict[tuple[int, int], int],
                  check: SampleCheck) -> None:
    """Each step's lines in the generation that trained it: one per rank of one world size, shards disjoint."""
    lines: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        position = (r["epoch"], r["step"])
        if r["generation"] == last_generation[position]:
            lines[position].append(r)
    for (epoch, step), found in sorted(lines.items()):
        where = f"epoch {epoch} step {step} (generation {found[0]['generation']})"
        sizes = sorted({r["world_size"] for r in found})
        if len(sizes) > 1:
            check.problems.append(f"{where}: its lines disagree on the world size: {sizes}")
            continue
        ranks = Counter(r["rank"] for r in found)
        twice = sorted(rank for rank, n in ranks.items() if n > 1)
        absent = sorted(set(range(sizes[0])) - set(ranks))
        if twice:
            check.problems.append(f"{where}: rank(s) {twice} trained it more than once")
        if absent:
            check.problems.append(f"{where}: rank(s) {absent} of {sizes[0]} have no line for it, yet it was "
                                  f"committed (no later generation trained it again)")
        owner: dict[int, int] = {}
        shared = sorted({i for r in found for i in r["ids"] if owner.setdefault(i, r["rank"]) != r["rank"]})
        if shared:
            check.problems.append(f"{where}: the ranks' shards overlap: {len(shared)} ids in two shards, e.g. "
                                  f"{shared[:5]}")
