"""report.json, report.md and plots of a finished run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.metrics import divergence, fault_timings, goodput, loss_curve, read_logs
from chaos.scenario import Scenario, parse
from chaos.verify import REFERENCE_MISMATCH, verify_ledger
from training.data import make_dataset
from training.ledger import read_ledgers
from training.sampler import ResumableGlobalBatchSampler

ROUNDING_RELATIVE_L2 = 1e-6
"""Final parameters this close (L2 relative to the reference's norm) count as equal within rounding."""


def scenario_of(run_dir: Path) -> Scenario:
    path = run_dir / "scenario.toml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a chaos run directory (no scenario.toml); "
                                f"create one with `chaos run SCENARIO --out {run_dir}`")
    return parse(path.read_text(), str(path))


def build_report(run_dir: Path, scenario: Scenario, ref_dir: Path, ref: dict[str, Any],
                 completed: bool = True, error: str | None = None) -> dict[str, Any]:
    job = scenario.job
    records = read_ledgers(run_dir / "logs")
    ref_records = read_ledgers(ref_dir / "logs")
    sampler = ResumableGlobalBatchSampler(len(make_dataset(job.dataset, job.seed)), job.global_batch, job.seed)
    verdict = verify_ledger(records, sampler, job.steps, ref.get("final_digest"), ref.get("world_size"))
    faults_path = run_dir / "faults.jsonl"
    faults = [json.loads(line) for line in faults_path.read_text().splitlines()] if faults_path.exists() else []
    problems = list(verdict.problems)
    if error:
        problems.insert(0, error)
    for planned in scenario.faults:
        if not any(f["kind"] == planned.kind and f["step"] == planned.step for f in faults):
            problems.append(f"planned fault {planned.kind} at step {planned.step} (slot {planned.slot}) never fired")
    launches = read_logs(run_dir / "logs", ("child_started", "in_process_restart", "job_restart"))
    slot_restarts = sum(1 for e in launches if e["event"] == "child_started" and e.get("restarts", 0) > 0)
    job_restarts = sum(1 for e in launches if e["event"] == "job_restart")
    in_process = sum(1 for e in launches if e["event"] == "in_process_restart")
    checkpoints = [r for r in records if r["kind"] == "checkpoint"]
    steps_per_s = goodput(records, job.steps)
    generations = sorted({r["generation"] for r in records if r["kind"] in ("step", "generation")})
    drift = divergence(loss_curve(records), loss_curve(ref_records), run_dir / "logs" / "final_params.pt",
                       ref_dir / "logs" / "final_params.pt")
    # With 3+ ranks float addition in the gradient all-reduce is not associative: a run whose process
    # groups were re-formed can end a few ulps away (seen: relative L2 3e-8 after 4 faults on 3 ranks;
    # 2 ranks stay bit-identical, a + b = b + a). Reported, not failed; data progress stays exact.
    rounding = (verdict.bit_identical is False and job.nproc >= 3 and drift["param_l2_relative"] is not None
                and drift["param_l2_relative"] < ROUNDING_RELATIVE_L2)
    if rounding:
        problems = [p for p in problems if REFERENCE_MISMATCH not in p]
    passed = completed and not problems and (verdict.bit_identical is not False or rounding)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "verdict": "pass" if passed else "fail",
        "steps": job.steps,
        "world_size": job.nproc,
        "world_sizes": verdict.world_sizes,
        "correctness": {"duplicates": verdict.duplicates, "missing": verdict.missing, "extra": verdict.extra,
                        "epochs_checked": verdict.epochs_checked, "bit_identical": verdict.bit_identical,
                        "equal_within_rounding": rounding,
                        "committed_steps": verdict.committed},
        "goodput": {"steps_per_s": round(steps_per_s, 3), "reference_steps_per_s": round(ref["steps_per_s"], 3),
                    "ratio": round(steps_per_s / ref["steps_per_s"], 4) if ref["steps_per_s"] else None},
        "restarts": slot_restarts + job_restarts,
        "job_restarts": job_restarts,
        "in_process_restarts": in_process,
        "generations": len(generations),
        "replayed_steps": verdict.replayed_steps,
        "faults": fault_timings(faults, records, run_dir / "logs", job.nproc),
        "checkpoint": {"strategy": job.ckpt_strategy, "saves": len(checkpoints),
                       "stall_s_total": round(sum(c["stall_s"] for c in checkpoints), 4)},
        "divergence": drift,
        "problems": problems,
    }


def write_report(run_dir: Path, report: dict[str, Any], ref_dir: Path) -> None:
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    (run_dir / "report.md").write_text(markdown(report))
    from chaos.plots import plot_run

    plot_run(run_dir, ref_dir, report)


def markdown(report: dict[str, Any]) -> str:
    c, g = report["correctness"], report["goodput"]
    lines = [
        f"# chaos run: {report['scenario']} — **{report['verdict'].upper()}**", "",
        report["description"], "",
        "| check | value |", "|---|---|",
        f"| steps committed | {c['committed_steps']} / {report['steps']} |",
        f"| duplicates / missing / extra | {c['duplicates']} / {c['missing']} / {c['extra']} |",
        f"| epochs checked | {c['epochs_checked']} |",
        f"| bit-identical to the reference | {c['bit_identical']}"
        f"{' (equal within float rounding: see divergence)' if c.get('equal_within_rounding') else ''} |",
        f"| world sizes | {report['world_sizes']} |",
        f"| goodput | {g['steps_per_s']} steps/s (reference {g['reference_steps_per_s']}, ratio {g['ratio']}) |",
        f"| restarts (a slot's process or the whole job) / in-process restarts | {report['restarts']} / "
        f"{report['in_process_restarts']} |",
        f"| generations | {report['generations']} |",
        f"| replayed steps | {report['replayed_steps']} |",
        f"| checkpoints ({report['checkpoint']['strategy']}) | {report['checkpoint']['saves']} saves, "
        f"{report['checkpoint']['stall_s_total']} s stall |",
        "", "## Faults", "",
        "| kind | slot | step | detect (s) | recover (s) | full size (s) |", "|---|---|---|---|---|---|",
    ]
    for f in report["faults"]:
        lines.append(f"| {f['kind']} | {f['slot']} | {f['step']} | {f['detect_s']} | {f['recover_s']} | "
                     f"{f['full_recover_s']} |")
    d = report["divergence"]
    lines += ["", "## Divergence from the reference", "",
              f"parameter L2 {d['param_l2']}, loss max diff {d['loss_max_diff']}, mean diff {d['loss_mean_diff']}, "
              f"area under |loss diff| {d['loss_abs_diff_auc']}, "
              f"loss AUC {d['loss_auc']} vs {d['loss_auc_reference']} (delta {d['loss_auc_delta']})", "",
              "![loss](loss.png) ![timeline](timeline.png) ![goodput](goodput.png)", ""]
    if report["problems"]:
        lines += ["## Problems", ""] + [f"- {p}" for p in report["problems"]] + [""]
    return "\n".join(lines)
