"""Exactly once for a user's own loop: a sample log the loop writes, and the check that reads it.

For every step it attempts, **before** the forward pass, the loop records the ids its rank's batch holds, as the
dataset returned them: `SampleLog(directory, slot).record(epoch, step, rank, world_size, generation, ids)`, one file
per process. A committed step went through an all-reduce every rank had contributed to, so every rank's line exists.
A line for step s also means its rank committed every step before s. `check_samples` (`chaos check-samples DIR
--size N --epochs E`) proves from the lines alone: every sample of every epoch trained exactly once (a step trained
again by a later generation counts there: `redone`); no generation starts below a step every rank of an earlier one
reached; each step's lines are one per rank of one world size, shards disjoint; no process goes backwards. A torn
line inside a file is a problem; a torn last line is a death inside its write (`torn_last`). Generations are told
apart by store address and number (a relaunch on a new embedded store numbers anew; a store that lost its state at
the same address is not told apart). A relaunch from an older snapshot fails the check.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftcoord.env import STORE_ENV
from training.ledger import files_under


class SampleLog:
    """One JSON line per attempted step, written with one write() (a SIGKILL loses no whole line)."""

    def __init__(self, directory: str | Path, slot: int) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"samples-{slot}-{os.getpid()}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.slot = slot
        self._store = os.environ.get(STORE_ENV, "")

    def record(self, epoch: int, step: int, rank: int, world_size: int, generation: int, ids: list[int]) -> None:
        """One step's line (the store's address comes from the launcher's FTCOORD_STORE: generation numbers are the
        store's)."""
        line = json.dumps({"epoch": epoch, "step": step, "rank": rank, "world_size": world_size,
                           "generation": generation, "slot": self.slot, "pid": os.getpid(), "store": self._store,
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
    _number_lives(records)
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    per_process: dict[tuple[int, int], list[tuple[Generation, int, int]]] = defaultdict(list)
    generations: dict[Generation, int] = {}
    last_generation: dict[tuple[int, int], Generation] = {}
    for r in records:
        per_process[(r["slot"], r["pid"])].append((r["_generation"], r["epoch"], r["step"]))
        generations[r["_generation"]] = r["world_size"]
        position = (r["epoch"], r["step"])
        last_generation[position] = max(last_generation.get(position, r["_generation"]), r["_generation"])
    check.redone = sorted({(r["epoch"], r["step"]) for r in records
                           if r["_generation"] < last_generation[(r["epoch"], r["step"])]})
    for r in records:
        if r["_generation"] == last_generation[(r["epoch"], r["step"])]:
            per_epoch[r["epoch"]].update(r["ids"])
    check.steps = len(last_generation)
    check.world_sizes = [generations[g] for g in sorted(generations)]
    _check_generations_follow_on(records, generations, check)
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


Generation = tuple[int, int]
"""(life, number): a generation of one store's numbering. A relaunch on a new store (an embedded one, on another
port) numbers its generations from 1 again: another life, ordered by when its first line was written."""


def _number_lives(records: list[dict[str, Any]]) -> None:
    """Set each record's `_generation` from its store's address (`store`) and its number."""
    lives: dict[str, int] = {}
    for r in records:
        r["_generation"] = (lives.setdefault(r.get("store", ""), len(lives)), r["generation"])


def _check_generations_follow_on(records: list[dict[str, Any]], world: dict[Generation, int],
                                 check: SampleCheck) -> None:
    """A line for step s means its rank committed every step before s. So once every rank of a generation wrote
    its line for s, no later generation may start below s: it would train again steps all of them had committed.
    `world`: each generation's world size."""
    first: dict[Generation, tuple[int, int]] = {}
    ranks: dict[tuple[Generation, tuple[int, int]], set[int]] = defaultdict(set)
    for r in records:
        position = (r["epoch"], r["step"])
        first[r["_generation"]] = min(first.get(r["_generation"], position), position)
        ranks[(r["_generation"], position)].add(r["rank"])
    reached: dict[Generation, tuple[int, int]] = {}
    for (generation, position), who in ranks.items():
        if who >= set(range(world[generation])):
            reached[generation] = max(reached.get(generation, position), position)
    floor: tuple[tuple[int, int], Generation] | None = None
    for generation in sorted(first):
        if floor is not None and first[generation] < floor[0]:
            check.problems.append(
                f"generation {generation[1]} started at (epoch, step) {first[generation]}, below {floor[0]}, which "
                f"every rank of generation {floor[1][1]} had reached: steps they had all committed were trained again")
        if generation in reached and (floor is None or reached[generation] > floor[0]):
            floor = (reached[generation], generation)


def _check_shards(records: list[dict[str, Any]], last_generation: dict[tuple[int, int], Generation],
                  check: SampleCheck) -> None:
    """Each step's lines in the generation that trained it: one per rank of one world size, shards disjoint."""
    lines: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        position = (r["epoch"], r["step"])
        if r["_generation"] == last_generation[position]:
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
