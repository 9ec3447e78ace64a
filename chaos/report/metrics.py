"""Metrics of a run, computed from its ledger, its logs and its fault events."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from chaos.proof.effects import fired_step
from chaos.scenario import STANDBY_KINDS, STOP_KINDS, STORE_KINDS
from training.ledger import files_under


def read_logs(directory: Path, events: tuple[str, ...]) -> list[dict[str, Any]]:
    """structlog JSON lines of the given event names (every process of the run)."""
    found = []
    for path in files_under(directory, "*.jsonl"):
        if path.name.startswith("ledger-"):
            continue
        for line in path.read_text(errors="replace").splitlines():
            if line.endswith("}") and any(f'"{e}"' in line for e in events):
                record = json.loads(line)
                if record.get("event") in events:
                    found.append(record)
    return sorted(found, key=lambda r: r.get("mono", 0.0))


def effective_steps(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per step, the records of the highest generation that committed it."""
    by_step: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["kind"] == "step":
            by_step[r["step"]][r["generation"]].append(r)
    return {step: gens[max(gens)] for step, gens in by_step.items()}


def loss_curve(records: list[dict[str, Any]]) -> list[float]:
    """Mean loss over ranks per step (effective commits), in step order."""
    effective = effective_steps(records)
    return [sum(r["loss"] for r in effective[s]) / len(effective[s]) for s in sorted(effective)]


def goodput(records: list[dict[str, Any]], steps: int) -> float:
    """Useful steps per wall second, first committed step to last."""
    monos = [r["mono"] for r in records if r["kind"] == "step"]
    if len(monos) < 2:
        return 0.0
    return steps / max(max(monos) - min(monos), 1e-9)


def fault_timings(faults: list[dict[str, Any]], records: list[dict[str, Any]], logs: Path,
                  target_world_size: int) -> list[dict[str, Any]]:
    """Per fault: detection (→ generation interrupted; under restart_policy job, → the launcher's whole-job restart,
    which stops every process before any of them interrupts a generation) and recovery (→ next committed step in a
    newer generation; and back at the target world size).

    A detection belongs to a fault only when it came before the next fault of a later step (faults of one step are
    one incident). A pause ridden through has neither detection nor recovery, nor has a fault of the store or of a
    node's standby (the ranks train on; a generation that changes after one is another fault's). A pause that came
    while the job was re-forming for an earlier fault has no interrupt of its own either, but was not ridden through
    when the paused process trained before it and committed nothing after it (left out of the re-form, replaced):
    its recovery is timed, and its note says so. A fault that hit a hot spare (not training then: `member` False; a
    kill-leader hits one when a spare leads) and ended no generation has nothing to recover from: a generation that
    changes after it is a later fault's. A fault with nothing to recover from says why in its note, which the report
    shows beside the None."""
    interrupts = read_logs(logs, ("generation_interrupted", "member_declared_dead", "job_restart"))
    steps = sorted((r for r in records if r["kind"] == "step"), key=lambda r: r["mono"])
    timed = []
    for fault in faults:
        t0, gen = fault["mono"], fault["generation"]
        until = min((f["mono"] for f in faults if f["mono"] > t0 and f["step"] > fault["step"]), default=math.inf)
        detect = next((e["mono"] - t0 for e in interrupts if t0 <= e["mono"] < until), None)
        recover = next((r["mono"] - t0 for r in steps if r["mono"] >= t0 and r["generation"] > gen), None)
        full = next((r["mono"] - t0 for r in steps if r["mono"] >= t0 and r["generation"] > gen
                     and r["world_size"] == target_world_size), None)
        note = fault.get("note", "")
        if detect is None and fault.get("member") is False:  # a hot spare hit: the members trained on
            recover = full = None
            note = _noted(note, "it hit a hot spare: nothing to recover from")
        elif fault["kind"] in (*STORE_KINDS, *STANDBY_KINDS) or (detect is None and fault["kind"] in _RIDDEN_THROUGH):
            # a store or standby fault ends no generation: one that ends with it is another fault's of the same step
            if fault["kind"] in STOP_KINDS and recover is not None and _left_out(fault, steps):
                note = _noted(note, "no interrupt of its own: the re-form under way when it paused left it out")
            else:  # ridden through: nothing to recover from, and the report says why rather than a bare None
                detect = recover = full = None
                note = _noted(note, _RIDDEN_THROUGH[fault["kind"]])
        timed.append({"kind": fault["kind"], "slot": fault["slot"], "step": fault["step"],
                      "fired_step": fired_step(fault, records) if fault.get("fired", True) else None,
                      "detect_s": _round(detect), "recover_s": _round(recover), "full_recover_s": _round(full),
                      "note": note})
    return timed


_RIDDEN_THROUGH = {
    **dict.fromkeys(STOP_KINDS, "ridden through: no generation ended for it (the process trained on as it woke, or was "
                                "not training)"),
    **dict.fromkeys(STORE_KINDS, "ridden through: a store fault ends no generation (the ranks trained on)"),
    **dict.fromkeys(STANDBY_KINDS, "ridden through: a standby fault ends no generation (the ranks trained on)"),
}
"""The kinds of fault a job may ride through (no interrupt of their own), and the note that says so."""


def _noted(note: str, more: str) -> str:
    """A fault's note with `more` added to what the runner noted."""
    return f"{note}; {more}" if note else more


def _left_out(fault: dict[str, Any], steps: list[dict[str, Any]]) -> bool:
    """The faulted process trained before the fault and committed no step after it (it was left out, fenced,
    replaced). A hot spare paused trained neither before nor after: it is not one."""
    pid, t0 = fault.get("pid"), fault["mono"]
    mine = [r["mono"] for r in steps if r.get("pid") == pid] if pid is not None else []
    return any(t < t0 for t in mine) and not any(t >= t0 for t in mine)


def divergence(run_loss: list[float], ref_loss: list[float], run_params: Path, ref_params: Path) -> dict[str, Any]:
    """How far a run drifted from the reference (expected when the world size changed)."""
    n = min(len(run_loss), len(ref_loss))
    diffs = [abs(a - b) for a, b in zip(run_loss[:n], ref_loss[:n], strict=True)]
    result: dict[str, Any] = {
        "loss_max_diff": _round(max(diffs) if diffs else None, 10),
        "loss_mean_diff": _round(sum(diffs) / n if n else None, 10),
        "loss_abs_diff_auc": _round(_auc(diffs), 10),  # the ECRL report's "loss divergence AUC"
        "loss_auc": _round(_auc(run_loss), 4),
        "loss_auc_reference": _round(_auc(ref_loss), 4),
        "loss_auc_delta": _round(_auc(run_loss) - _auc(ref_loss), 6),
        "param_l2": None,
        "param_l2_relative": None,
    }
    if run_params.exists() and ref_params.exists():
        a = torch.load(run_params, weights_only=True)
        b = torch.load(ref_params, weights_only=True)
        total = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a if k in b)
        norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in b.values()))
        result["param_l2"] = _round(math.sqrt(total), 8)
        result["param_l2_relative"] = float(f"{math.sqrt(total) / norm:.3g}") if norm else None
    return result


def _auc(curve: list[float]) -> float:
    return sum((curve[i] + curve[i + 1]) / 2 for i in range(len(curve) - 1)) if len(curve) > 1 else 0.0


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
