"""Holding a run to its scenario: every planned fault fired at a live process and had its effect.

A fault that was planned but never reached a process, or reached one and changed nothing, proves nothing about
recovery: the run fails, with the reason. EFFECTS states what each kind must cause, read from the run's own ledger
after the moment the fault was injected: a newer generation commits a step (kills, hangs, raises, a lost node), a
step is committed after it (pauses, a standby's or a launcher's fault), steps are committed while the store is away
(store faults), and so on. A store fault that came while the job stood still behind an earlier fault, or that a
later stopping fault cut short (within two step times, no step between), is held to the job training on after it.
A kill or hang that hit a hot spare (a slot not training then; a leader may be one) is held to its launcher
replacing it; aim faults at a rank (`rank = r`) to hit whoever trains as rank r.
"""

from __future__ import annotations

import statistics
from typing import Any

from chaos.scenario import IN_RANK_ACTIONS, Scenario, ends_first

NEW_GENERATION = "a newer generation commits a step"
FULL_SIZE = "a step is committed at the full world size"
STOP_AND_RESUME = "the job stops at a step boundary, then resumes"
RESUME_FROM_CHECKPOINT = "the relaunched job resumes from a checkpoint"
NOTHING = "nothing: the job trains on (a slow rank is not a fault)"
TRAINS_ON = "the job trains on: a step is committed after it"
SPARE_REPLACED = "its launcher replaces the hot spare it hit"
TRAINS_THROUGH = "steps are committed while the store is away (the step path needs no store)"

EFFECTS = {"kill": NEW_GENERATION, "kill-boundary": NEW_GENERATION, "kill-midstep": NEW_GENERATION,
           "kill-midreduce": NEW_GENERATION, "kill-follower": NEW_GENERATION,
           "raise": NEW_GENERATION, "raise-midstep": NEW_GENERATION,
           "kill-leader": NEW_GENERATION, "hang": NEW_GENERATION, "early-restart": NEW_GENERATION,
           "lose": NEW_GENERATION, "partition": NEW_GENERATION, "replace": FULL_SIZE, "preempt": STOP_AND_RESUME,
           "ckpt-crash": RESUME_FROM_CHECKPOINT, "slow": NOTHING, "stuck": NEW_GENERATION,
           "pause": TRAINS_ON, "pause-leader": TRAINS_ON, "store-restart": TRAINS_THROUGH,
           "store-hang": TRAINS_THROUGH, "kill-standby": TRAINS_ON, "pause-standby": TRAINS_ON,
           "pause-launcher": TRAINS_ON, "cut": NEW_GENERATION, "cut-data": NEW_GENERATION, "cut-control": TRAINS_ON}


def fault_problems(scenario: Scenario, events: list[dict[str, Any]], records: list[dict[str, Any]],
                   started: list[dict[str, Any]]) -> list[str]:
    """Planned faults that never fired, fired at nothing, or had no effect.

    Args:
        started: the launchers' `child_started` events (a replaced spare shows there).
    """
    problems = []
    for index, planned in enumerate(scenario.faults):
        target = f"rank {planned.rank}" if planned.rank is not None else f"slot {planned.slot}"
        name = f"{planned.kind} at step {planned.step} ({target})"
        matching = [e for e in events if e.get("index") == index]
        if not matching:
            why = _ended_first(index, scenario, events) or _why_not_fired(planned.rank, planned.step, records)
            problems.append(f"planned fault {name} never fired{why}")
            continue
        event = matching[0]
        if not event.get("fired", True):
            problems.append(f"planned fault {name} did not reach a live process: {event.get('note') or 'no target'}")
            continue
        effect = EFFECTS[planned.kind]
        if effect == TRAINS_THROUGH and (_standing_still(event, events, records)
                                         or _cut_short(event, events, records, scenario)):
            effect = TRAINS_ON
        if event.get("member") is False and effect != TRAINS_ON:
            effect = SPARE_REPLACED
        if effect == SPARE_REPLACED:
            if not any(e["slot"] == event["slot"] and e["mono"] > event["mono"] for e in started):
                problems.append(f"planned fault {name} hit slot {event['slot']}, a hot spare, and {effect} never "
                                f"happened")
        elif effect == NEW_GENERATION:
            if not _caused_change(event, events, records, _targets(scenario, planned.kind, event.get("slot"))):
                problems.append(f"planned fault {name}, fired at step {fired_step(event, records)}, had no effect: "
                                f"expected {effect} after it, its leader naming the slot the fault hit as the cause")
        elif not _had_effect(effect, event, records, scenario.job.nproc, planned.duration):
            problems.append(f"planned fault {name}, fired at step {fired_step(event, records)}, had no effect: "
                            f"expected {effect} after it")
    return problems


def fired_step(event: dict[str, Any], records: list[dict[str, Any]]) -> int:
    """The step at which a fault really fired: the steps committed by then (its plan's `step` counts the same way:
    an outside fault fires once that many are committed, an in-rank one at that step's boundary or inside it)."""
    return 1 + max((r["step"] for r in records if r["kind"] == "step" and r["mono"] <= event["mono"]), default=-1)


NODE_KINDS = ("lose", "partition", "replace", "cut", "cut-data", "cut-control")
"""Faults that hit a whole node: every slot of the node is their target."""


def _targets(scenario: Scenario, kind: str, slot: int | None) -> set[int]:
    """The slots a fault hit: the slot its event names, or every slot of that slot's node."""
    if slot is None:
        return set()
    if kind in NODE_KINDS:
        return set(scenario.job.node_slots[scenario.job.node_of(slot)])
    return {slot}


def _caused_change(event: dict[str, Any], events: list[dict[str, Any]], records: list[dict[str, Any]],
                   targets: set[int]) -> bool:
    """A generation that started after the fault names one of its targets among its culprits (the slots its leader
    found had ended the generation before: ftcoord.leader.attribution), and a step is committed from it on. Any new
    generation is not enough: a fault ridden through would be credited with the next fault's effect. Nor is a change
    the fault's when a later fault that ends generations hit another process of the same target before the change
    began: that change is the later one's (a store fault, a pause or a second signal to the same process takes
    nothing)."""
    at = event["mono"]
    started: dict[int, float] = {}
    culprits: dict[int, set[int]] = {}
    for r in records:
        if r["kind"] == "generation" and r["mono"] > at:
            started[r["generation"]] = min(r["mono"], started.get(r["generation"], r["mono"]))
            culprits.setdefault(r["generation"], set()).update(r.get("culprits") or ())
    named = [g for g in sorted(started) if culprits[g] & targets]
    if not named:
        return False
    first = named[0]
    if any(e is not event and e.get("fired", True) and at < e["mono"] < started[first]
           and EFFECTS.get(e.get("kind", "")) == NEW_GENERATION and e.get("slot") in targets & culprits[first]
           and (e.get("pid") is None or e.get("pid") != event.get("pid")) for e in events):
        return False  # a later fault's change
    return any(r["kind"] == "step" and r["mono"] > at and r["generation"] >= first for r in records)


def _standing_still(event: dict[str, Any], events: list[dict[str, Any]], records: list[dict[str, Any]]) -> bool:
    """The job stood still when `event` fired: an earlier fault that fired had no step committed after it yet, beyond
    the steps committed when it fired (an in-rank fault at a boundary fires as its own rank commits step s - 1; its
    peers' records of s - 1 come a moment later, and are no step after it)."""
    at = event["mono"]
    for earlier in events:
        if not earlier.get("fired", True) or not earlier["mono"] < at:  # (`event` itself is not earlier)
            continue
        done = max((r["step"] for r in records if r["kind"] == "step" and r["mono"] <= earlier["mono"]), default=-1)
        if not any(r["kind"] == "step" and earlier["mono"] < r["mono"] < at and r["step"] > done for r in records):
            return True
    return False


NOT_STOPPING = ("kill-standby", "pause-standby", "pause-launcher", "store-restart", "store-hang")
"""Faults that leave a step's path as it is: the job trains on through them (a store fault does, by design). A slow
step stops it for its duration: for a store fault as long as it or longer."""


def _cut_short(event: dict[str, Any], events: list[dict[str, Any]], records: list[dict[str, Any]],
               scenario: Scenario) -> bool:
    """A fault that stops training fired within two step times after `event` (a store fault), with no step committed
    between: the store fault had no step in which to show training through (module docstring)."""
    outage = scenario.faults[event["index"]].duration
    at = event["mono"]
    first_commit: dict[int, float] = {}
    for r in records:
        if r["kind"] == "step" and r["mono"] <= at:
            first_commit[r["step"]] = min(r["mono"], first_commit.get(r["step"], r["mono"]))
    recent = sorted(first_commit.values())[-21:]
    if len(recent) < 2:
        return False  # no step time to judge by: held to training through
    step_s = statistics.median(b - a for a, b in zip(recent, recent[1:], strict=False))
    for other in events:
        if other is event or not other.get("fired", True) or other.get("kind") in NOT_STOPPING:
            continue
        if other.get("kind") == "slow" and scenario.faults[other["index"]].duration < outage:
            continue
        if at <= other["mono"] < at + 2 * step_s and not any(
                r["kind"] == "step" and at < r["mono"] < other["mono"] for r in records):
            return True
    return False


def _ended_first(index: int, scenario: Scenario, events: list[dict[str, Any]]) -> str:
    """Why an in-rank fault never fired when another in-rank fault for the same target and step did: the first ended
    that process's step, its peers committed the step, and no one runs a committed step again."""
    planned = scenario.faults[index]
    if not planned.in_rank:
        return ""
    for other_index, other in enumerate(scenario.faults):
        same_target = other.rank == planned.rank and (other.rank is not None or other.slot == planned.slot)
        if other_index == index or not other.in_rank or not same_target or not any(
                e.get("index") == other_index for e in events):
            continue
        if other.step == planned.step:
            return (f": {other.kind} at the same step and target fired first and ended that step there, and a step "
                    f"its peers committed is not run again (plan one in-rank fault per target and step)")
        if other.step == planned.step - 1 and ends_first(IN_RANK_ACTIONS[other.kind][1],
                                                           IN_RANK_ACTIONS[planned.kind][1]):
            return (f": {other.kind} at step {other.step} fired first, inside that step, which its peers committed "
                    f"without it, so nobody holding that target passed the boundary of step {planned.step} "
                    f"(plan a boundary fault at least two steps after an in-step fault of the same target)")
    return ""


def _why_not_fired(rank: int | None, step: int, records: list[dict[str, Any]]) -> str:
    """Why an in-rank fault aimed at `rank` found nobody at `step`, when the ledger says: the step was never
    committed, or only by a world too small to have that rank (an elastic job, shrunk then)."""
    if rank is None:
        return ""
    worlds = sorted({r["world_size"] for r in records if r["kind"] == "step" and r["step"] == step})
    if not worlds:
        return f": step {step} was never committed"
    if worlds[-1] <= rank:
        return (f": step {step} was committed at world size {' and '.join(map(str, worlds))} only, with no rank "
                f"{rank} (aim at a rank below the world size the job keeps)")
    return ""


def _had_effect(effect: str, event: dict[str, Any], records: list[dict[str, Any]], nproc: int,
                duration: float = 0.0) -> bool:
    at = event["mono"]
    before = max((r["generation"] for r in records if r["kind"] == "step" and r["mono"] <= at), default=0)
    later_steps = [r for r in records if r["kind"] == "step" and r["mono"] > at and r["generation"] > before]
    if effect == NEW_GENERATION:
        return bool(later_steps)
    if effect == FULL_SIZE:
        return any(r["world_size"] == nproc for r in later_steps)
    if effect == STOP_AND_RESUME:
        stops = [r["mono"] for r in records if r["kind"] == "stopped" and r["mono"] > at]
        return bool(stops) and any(r["mono"] > min(stops) for r in later_steps)
    if effect == NOTHING:
        return True
    if effect == TRAINS_THROUGH:
        return any(r["kind"] == "step" and at < r["mono"] < at + duration for r in records)
    if effect == TRAINS_ON:
        return any(r["kind"] == "step" and r["mono"] > at for r in records)
    if effect == RESUME_FROM_CHECKPOINT:
        return any(r["kind"] == "generation" and r["mono"] > at and r.get("loaded_from") for r in records)
    raise ValueError(f"unknown effect {effect!r}")
