"""report.json, report.md and plots of a finished run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.errors import NetworkError
from chaos.proof.effects import fault_problems
from chaos.proof.proof import FINAL_PARAMS, prove
from chaos.report.metrics import divergence, fault_timings, goodput, loss_curve, read_logs
from chaos.report.reference import ReferenceUnusable, reference_model
from chaos.run.network import unavailable
from chaos.run.runner import OUTCOME
from chaos.scenario import NETWORK_KINDS, Scenario, training_config
from training.ledger import read_ledgers


def outcome_problems(run_dir: Path) -> list[str]:
    """How the run itself ended (exit codes, timeout), as the runner wrote it down."""
    path = run_dir / OUTCOME
    if not path.is_file():
        return [f"the run's outcome is unknown ({path.name} is missing): it may not have finished"]
    outcome = json.loads(path.read_text())
    if outcome.get("completed"):
        return []
    why = outcome.get("error") or f"launchers exited {outcome.get('launcher_codes')}"
    return [f"the run did not complete: {why}"]


def dead_pids(logs: Path, faults: list[dict[str, Any]]) -> set[int]:
    """Processes that died abnormally: killed by a fault, fenced, or exited non-zero under a launcher."""
    dead = {f["pid"] for f in faults if f.get("pid") and f.get("fired", True)}
    for event in read_logs(logs, ("child_exited", "rank_fenced_killed")):
        if event["event"] == "rank_fenced_killed" or event.get("code"):
            dead.add(event["pid"])
    return dead


def build_report(run_dir: Path, scenario: Scenario, ref_dir: Path, ref: dict[str, Any]) -> dict[str, Any]:
    """Verify a finished run directory and describe it (the verdict is "pass" only without problems)."""
    job = scenario.job
    logs = run_dir / "logs"
    faults_path = run_dir / "faults.jsonl"
    faults = [json.loads(line) for line in faults_path.read_text().splitlines()] if faults_path.exists() else []
    problems = outcome_problems(run_dir)
    try:
        reference = reference_model(ref_dir, ref, scenario)
    except ReferenceUnusable as exc:
        reference, problems = None, problems + [f"the reference cannot be used: {exc}"]
    # Without a verified reference the replay still runs, but its faithfulness is unproven: a failure.
    proof = prove(logs, training_config(job), job.steps, dead_pids=dead_pids(logs, faults), reference=reference)
    records, verdict, model = proof.scan.records, proof.verdict, proof.model
    launches = read_logs(logs, ("child_started", "in_process_restart", "job_restart"))
    started = [e for e in launches if e["event"] == "child_started"]
    problems += verdict.problems + fault_problems(scenario, faults, records, started) + model.problems
    slot_restarts = sum(1 for e in launches if e["event"] == "child_started" and e.get("restarts", 0) > 0)
    job_restarts = sum(1 for e in launches if e["event"] == "job_restart")
    in_process = sum(1 for e in launches if e["event"] == "in_process_restart")
    checkpoints = [r for r in records if r["kind"] == "checkpoint"]
    steps_per_s = goodput(records, job.steps)
    generations = sorted({r["generation"] for r in records if r["kind"] in ("step", "generation")})
    drift = divergence(loss_curve(records), loss_curve(read_ledgers(ref_dir / "logs")), logs / FINAL_PARAMS,
                       ref_dir / "logs" / FINAL_PARAMS)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "verdict": "pass" if not problems and model.passed else "fail",
        "steps": job.steps,
        "world_size": job.nproc,
        "device": job.device,
        "world_sizes": verdict.world_sizes,
        "correctness": {"duplicates": verdict.duplicates, "missing": verdict.missing, "extra": verdict.extra,
                        "epochs_checked": verdict.epochs_checked, "bit_identical": model.bit_identical,
                        "model_checked": model.checked, "committed_steps": verdict.committed},
        "model_check": model.to_dict(),
        "goodput": {"steps_per_s": round(steps_per_s, 3), "reference_steps_per_s": round(ref["steps_per_s"], 3),
                    "ratio": round(steps_per_s / ref["steps_per_s"], 4) if ref["steps_per_s"] else None},
        "restarts": slot_restarts + job_restarts,
        "job_restarts": job_restarts,
        "in_process_restarts": in_process,
        "generations": len(generations),
        "replayed_steps": verdict.replayed_steps,
        "faults": fault_timings(faults, records, logs, job.nproc),
        "incidents": incidents(logs),
        "still_threads": still_threads(logs),
        "checkpoint": {"strategy": job.ckpt_strategy, "saves": len(checkpoints),
                       "stall_s_total": round(sum(c["stall_s"] for c in checkpoints), 4)},
        "divergence": drift,
        "problems": problems,
    }


INCIDENT_FIELDS = ("generation", "previous", "cause", "witness", "world_size", "detect_s", "stall_s", "lost_steps",
                   "step_s", "cost_s")


def incidents(logs: Path) -> list[dict[str, Any]]:
    """What each generation change cost, as its witness measured it (ftcoord.protocol.slot_report): the numbers
    `ftcoord status` and the launcher's metrics show for the same faults."""
    return [{k: e.get(k) for k in INCIDENT_FIELDS} for e in read_logs(logs, ("generation_changed",))]


STILL_FIELDS = ("slot", "incarnation", "pid", "step", "still_s", "at", "thread")


def still_threads(logs: Path) -> list[dict[str, Any]]:
    """Where each training thread that stood still without waiting on its peers stood
    (ftcoord.liveness.still_stack): the first thing to read about a rank fenced as hung. The whole stack is in the
    rank's log."""
    return [{k: e.get(k) for k in STILL_FIELDS} for e in read_logs(logs, ("training_thread_still",))]


def write_report(run_dir: Path, report: dict[str, Any], ref_dir: Path) -> None:
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    (run_dir / "report.md").write_text(markdown(report))
    from chaos.report.plots import plot_run

    plot_run(run_dir, ref_dir, report)


def model_line(model: dict[str, Any]) -> str:
    """One line: what the final model was compared with, and how it came out."""
    if not model["checked"]:
        return "not checked (a failure: see problems)"
    against = "the fault-free reference" if model["expected_from"] == "reference" else \
        "a fault-free replay of the run's own schedule"
    if model["exact"]:
        result = "bit-identical" if model["bit_identical"] else "DIFFERENT"
        return f"{result} to {against}"
    return (f"relative L2 {model['param_l2_relative']} from {against} (tolerance {model['tolerance_relative_l2']}: "
            f"DDP's built-in all-reduce on 3+ ranks is not exact)")


def markdown(report: dict[str, Any]) -> str:
    c, g = report["correctness"], report["goodput"]
    lines = [
        f"# chaos run: {report['scenario']} — **{report['verdict'].upper()}**", "",
        report["description"], "",
        "| check | value |", "|---|---|",
        f"| steps committed | {c['committed_steps']} / {report['steps']} |",
        f"| duplicates / missing / extra | {c['duplicates']} / {c['missing']} / {c['extra']} |",
        f"| epochs checked | {c['epochs_checked']} |",
        f"| model check | {model_line(report['model_check'])} |",
        f"| world sizes | {report['world_sizes']} |",
        f"| goodput | {g['steps_per_s']} steps/s (reference {g['reference_steps_per_s']}, ratio {g['ratio']}) |",
        f"| restarts (a slot's process or the whole job) / in-process restarts | {report['restarts']} / "
        f"{report['in_process_restarts']} |",
        f"| generations | {report['generations']} |",
        f"| replayed steps | {report['replayed_steps']} |",
        f"| checkpoints ({report['checkpoint']['strategy']}) | {report['checkpoint']['saves']} saves, "
        f"{report['checkpoint']['stall_s_total']} s stall |",
        "", "## Faults", "",
        "| kind | slot | step | fired at | detect (s) | recover (s) | full size (s) | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in report["faults"]:  # a None is explained in its note (ridden through, a hot spare hit)
        lines.append(f"| {f['kind']} | {f['slot']} | {f['step']} | {f.get('fired_step')} | {f['detect_s']} | "
                     f"{f['recover_s']} | {f['full_recover_s']} | {f.get('note', '')} |")
    lines += ["", "## Incidents (what each generation change cost; the numbers `ftcoord status` shows)", "",
              "| generation | cause | detect (s) | stall (s) | lost steps | cost (s) |", "|---|---|---|---|---|---|"]
    for i in report.get("incidents", []):
        lines.append(f"| {i['generation']} | {i['cause']} | {i['detect_s']} | {i['stall_s']} | {i['lost_steps']} | "
                     f"{i['cost_s']} |")
    if report.get("still_threads"):
        lines += ["", "## Training threads that stood still (not waiting on their peers; the stack is in the rank's "
                  "log: `training_thread_still`)", "",
                  "| slot | incarnation | pid | step | still (s) | at | the thread, as the kernel saw it |",
                  "|---|---|---|---|---|---|---|"]
        for t in report["still_threads"]:
            lines.append(f"| {t['slot']} | {t['incarnation']} | {t['pid']} | {t['step']} | {t['still_s']} | "
                         f"`{t['at']}` | {t.get('thread') or 'unknown'} |")
    d = report["divergence"]
    lines += ["", "## Divergence from the reference", "",
              f"parameter L2 {d['param_l2']}, loss max diff {d['loss_max_diff']}, mean diff {d['loss_mean_diff']}, "
              f"area under |loss diff| {d['loss_abs_diff_auc']}, "
              f"loss AUC {d['loss_auc']} vs {d['loss_auc_reference']} (delta {d['loss_auc_delta']})", "",
              "![loss](loss.png) ![timeline](timeline.png) ![goodput](goodput.png)", ""]
    if report["problems"]:
        lines += ["## Problems", ""] + [f"- {p}" for p in report["problems"]] + [""]
    return "\n".join(lines)


def run_and_report(scenario: Scenario, out: Path, quiet: bool = False) -> dict[str, Any]:
    """Run a scenario and its reference; write the run's report into `out` and return it.

    Args:
        scenario: the loaded scenario (chaos.scenario.load).
        out: the run directory; created if missing.
        quiet: no live display on the terminal.
    """
    from chaos.report.reference import ensure_reference
    from chaos.run.runner import ChaosRunner

    if any(fault.kind in NETWORK_KINDS for fault in scenario.faults) and (why := unavailable()) is not None:
        raise NetworkError(why)  # before the reference is built: one line, at once
    ref_dir, ref = ensure_reference(scenario, quiet=quiet)
    result = ChaosRunner(scenario, out, quiet=quiet).run()
    (out / "scenario.toml").write_text(Path(scenario.path).read_text())
    report = build_report(out, scenario, ref_dir, ref)
    report["wall_s"] = round(result.wall_s, 2)
    write_report(out, report, ref_dir)
    return report
