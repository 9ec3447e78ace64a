"""The run's lineage: which generation's commit of each step the final model carries.

A step may be committed more than once: by a generation cut short and by the one that re-ran it after a rollback,
or on two branches, when a generation started from an older state than another had reached. The highest-numbered
generation is not always the one that counts: its branch may have been abandoned. So the lineage is read backward
from the last step. The generation that committed it started at its start_step from its heal source's state, which
is, in the source process's own ledger, its last commit before that generation (of step start_step - 1), or the
start of a generation it began since without committing (resolved the same way), or, when it loaded a checkpoint,
the generation that saved that checkpoint. That generation carries the steps before, and so on down to step 0. A
step the walk cannot place (a ledger without those facts) falls back to the highest generation that committed it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

_MAX_DEPTH = 10_000  # generations a walk may pass through (a guard against a cycle in a damaged ledger)


class _Ledger:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.steps: dict[int, set[int]] = defaultdict(set)  # generation -> steps it committed
        self.lines: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)  # generation -> rank -> its line
        self.history: dict[int, list[dict[str, Any]]] = defaultdict(list)  # pid -> its step and generation lines
        self.saves: list[dict[str, Any]] = []  # checkpoint lines (the generation that saved, the step)
        for r in sorted(records, key=lambda r: r.get("mono", 0.0)):
            kind = r.get("kind")
            if kind == "step":
                self.steps[r["generation"]].add(r["step"])
                self.history[r.get("pid", -1)].append(r)
            elif kind == "generation":
                self.lines[r["generation"]][r["rank"]] = r
                self.history[r.get("pid", -1)].append(r)
            elif kind == "checkpoint" and r.get("generation") is not None:
                self.saves.append(r)

    def start(self, generation: int) -> int | None:
        starts = {line.get("start_step") for line in self.lines[generation].values()}
        return starts.pop() if len(starts) == 1 and None not in starts else None

    def source_of(self, generation: int, start: int, depth: int = 0) -> int | None:
        """The generation whose commit of step `start - 1` the state `generation` started from came from."""
        ranks = self.lines[generation]
        first = ranks.get(0) or next(iter(ranks.values()), None)
        if first is None or depth > _MAX_DEPTH:
            return None
        line = ranks.get(first.get("heal_source")) or first  # every rank's line names the same source
        if line.get("loaded_from"):
            saves = [s for s in self.saves if s.get("step") == start and s["mono"] < line["mono"]]
            return saves[-1]["generation"] if saves else None
        before = [r for r in self.history[line.get("pid", -1)] if r["mono"] < line["mono"]]
        if not before:
            return None
        last = before[-1]
        if last["kind"] == "step":
            return last["generation"] if last["step"] == start - 1 else None
        if last.get("start_step") == start:  # began a generation since, and committed nothing in it
            return self.source_of(last["generation"], start, depth + 1)
        return None


def effective_generations(records: list[dict[str, Any]]) -> dict[int, int]:
    """step -> the generation whose commit of it the final model carries (module docstring), for every committed
    step."""
    ledger = _Ledger(records)
    committed: dict[int, int] = {}
    for generation, steps in ledger.steps.items():
        for step in steps:
            committed[step] = max(committed.get(step, generation), generation)
    if not committed:
        return {}
    effective: dict[int, int] = {}
    upper = max(committed) + 1
    current: int | None = committed[upper - 1]
    for _ in range(_MAX_DEPTH):
        if current is None:
            break
        start = ledger.start(current)
        if start is None or start >= upper:
            break
        for step in range(max(start, 0), upper):
            if step in ledger.steps[current]:
                effective[step] = current
        if start <= 0:
            break
        current, upper = ledger.source_of(current, start), start
    return {step: effective.get(step, highest) for step, highest in committed.items()}
