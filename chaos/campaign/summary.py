"""A campaign's summary: per run, each metric over seeds (mean, std, 95% confidence interval) and its published figure.

`summary.json` keeps every value; `summary.md` shows one table per experiment in the ECRL report's
layout (correctness, goodput and its change against the reference, restarts, divergence) with a
column for the report's figure and one for ours, then every metric per run, then the plots.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from chaos.campaign.campaign import METRICS, Campaign
from chaos.campaign.runner import PlannedRun
from chaos.campaign.stats import Summary, summarize

HEADLINE = ("pass_rate", "goodput", "goodput_delta_pct", "restarts", "recovery_s", "loss_abs_diff_auc", "param_l2")
"""The report's layout (§10): correctness, goodput, its change, restarts, divergence; plus recovery time."""


def headline(run: dict[str, Any]) -> tuple[str, ...]:
    """The headline metrics of a run; the reference has nothing to differ from."""
    return ("pass_rate", "goodput", "restarts") if run["reference"] else HEADLINE


_DIGITS = {"pass_rate": 2, "goodput": 3, "goodput_delta_pct": 2, "restarts": 2, "in_process_restarts": 2,
           "replayed_steps": 1, "recovery_s": 3, "ckpt_stall_s": 3, "param_l2": 4, "loss_abs_diff_auc": 4,
           "loss_max_diff": 4}


def recoveries(report: dict[str, Any]) -> list[float]:
    """Recovery time of every fault of a run that recovered."""
    return [f["recover_s"] for f in report["faults"] if f.get("recover_s") is not None]


def run_metrics(report: dict[str, Any]) -> dict[str, float | None]:
    """The campaign's metrics of one finished run, from its report.json."""
    good = report["goodput"]
    ratio = good.get("ratio")
    recovered = recoveries(report)
    divergence = report["divergence"]
    return {
        "pass_rate": 1.0 if report["verdict"] == "pass" else 0.0,
        "goodput": good["steps_per_s"],
        "goodput_delta_pct": None if ratio is None else round((ratio - 1.0) * 100.0, 4),
        "restarts": report["restarts"],
        "in_process_restarts": report["in_process_restarts"],
        "replayed_steps": report["replayed_steps"],
        "recovery_s": sum(recovered) / len(recovered) if recovered else None,
        "ckpt_stall_s": report["checkpoint"]["stall_s_total"],
        "param_l2": divergence.get("param_l2"),
        "loss_abs_diff_auc": divergence.get("loss_abs_diff_auc"),
        "loss_max_diff": divergence.get("loss_max_diff"),
    }


def aggregate(planned: list[PlannedRun]) -> list[dict[str, Any]]:
    """Per campaign, per run: the metrics over the seeds that finished."""
    campaigns: dict[str, Campaign] = {}
    for p in planned:
        campaigns.setdefault(p.campaign.name, p.campaign)
    result = []
    for campaign in campaigns.values():
        mine = [p for p in planned if p.campaign.name == campaign.name]
        runs = []
        for run in [r for r in campaign.runs if any(p.run.name == r.name for p in mine)]:  # --runs may skip some
            done = [p for p in mine if p.run.name == run.name and p.finished()]
            reports = {p.seed: p.report() for p in done}
            per_seed = {seed: run_metrics(report) for seed, report in reports.items()}
            metrics = {name: summarize([m[name] for m in per_seed.values()]).to_dict() for name in METRICS}
            runs.append({"name": run.name, "reference": run.reference, "seeds": sorted(per_seed),
                         "planned_seeds": sorted({p.seed for p in mine if p.run.name == run.name}),
                         "per_seed": {str(seed): values for seed, values in sorted(per_seed.items())},
                         "recoveries_s": [r for report in reports.values() for r in recoveries(report)],
                         "metrics": metrics, "published": run.published,
                         "published_note": run.published_note,
                         "directories": [str(p.directory) for p in done]})
        dataset = mine[0].scenario.job.dataset
        result.append({"name": campaign.name, "experiment": campaign.experiment,
                       "description": campaign.description, "source": campaign.source,
                       "published_by": campaign.published_by,
                       "dataset": dataset, "stand_in": campaign.stand_in if dataset == campaign.job.get("dataset")
                       else "", "job": {**campaign.job, "dataset": dataset}, "runs": runs})
    return result


def build_summary(planned: list[PlannedRun]) -> dict[str, Any]:
    import torch

    return {"generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "torch": torch.__version__, "cpus": os.cpu_count()},
            "runs_planned": len(planned), "runs_finished": sum(p.finished() for p in planned),
            "campaigns": aggregate(planned)}


def write_summary(out: Path, planned: list[PlannedRun]) -> dict[str, Any]:
    from chaos.report.plots import plot_campaign

    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(planned)
    for campaign in summary["campaigns"]:
        campaign["plots"] = plot_campaign(out, campaign, planned)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    return summary


def fmt(stats: dict[str, Any], metric: str) -> str:
    """`mean ± half-width (n)`; a single seed has no interval."""
    summary = Summary(**{**stats, "values": tuple(stats["values"])})
    if summary.mean is None:
        return "—"
    digits = _DIGITS.get(metric, 3)
    if summary.half_width is None:
        return f"{_number(summary.mean, digits)} (n={summary.n})"
    return f"{_number(summary.mean, digits)} ± {_number(summary.half_width, digits)} (n={summary.n})"


def _number(value: float, digits: int) -> str:
    """Fixed digits, but a tiny non-zero value (float rounding between runs) is not shown as 0."""
    if value and abs(value) < 0.5 * 10**-digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def published(run: dict[str, Any], metric: str) -> str:
    value = run["published"].get(metric)
    return "—" if value is None else f"{value:g}"


def markdown(summary: dict[str, Any]) -> str:
    m = summary["machine"]
    lines = ["# chaos campaign summary", "",
             f"{summary['runs_finished']} of {summary['runs_planned']} runs finished · generated "
             f"{summary['generated_at']} · {m['platform']}, {m['cpus']} CPUs, torch {m['torch']}", "",
             "Ours: mean ± 95% confidence half-width (Student t over seeds), n = seeds. Goodput is useful steps per "
             "wall second from the first to the last committed step; the report's absolute steps/s come from "
             "another machine, so compare the change against the reference, the restarts, the correctness and "
             "the divergence.", ""]
    for c in summary["campaigns"]:
        lines += [f"## {c['experiment']} — `{c['name']}`", "", c["description"], ""]
        if c["source"]:
            lines += [f"Published figures: {c['source']}.", ""]
        lines += [f"Dataset: `{c['dataset']}`." + (f" **{c['stand_in']}.**" if c["stand_in"] else ""), ""]
        lines += [f"| run | metric | {c['published_by']} | ftcoord (ours) |", "|---|---|---|---|"]
        for run in c["runs"]:
            for metric in headline(run):
                lines.append(f"| {run['name']} | {_cell(METRICS[metric])} | {published(run, metric)} | "
                             f"{fmt(run['metrics'][metric], metric)} |")
        notes = [f"- {run['name']}: {run['published_note']}" for run in c["runs"] if run["published_note"]]
        if notes:
            lines += [""] + notes
        names = [run["name"] for run in c["runs"]]
        lines += ["", "Every metric, per run:", "", "| metric | " + " | ".join(names) + " |",
                  "|---|" + "---|" * len(names)]
        for metric, label in METRICS.items():
            cells = [fmt(run["metrics"][metric], metric) for run in c["runs"]]
            lines.append(f"| {_cell(label)} | " + " | ".join(cells) + " |")
        lines += ["", "Seeds finished: " + ", ".join(f"{run['name']} {run['seeds']}" for run in c["runs"]), ""]
        lines += [f"![{kind}]({path})" for kind, path in c.get("plots", {}).items()] + [""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A Markdown table cell: a bare pipe would end the cell."""
    return text.replace("|", "\\|")
