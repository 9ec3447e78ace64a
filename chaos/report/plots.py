"""PNG plots of a run: loss against the reference, a timeline of generations and faults, goodput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from chaos.report.metrics import loss_curve  # noqa: E402
from training.ledger import read_ledgers  # noqa: E402


def plot_run(run_dir: Path, ref_dir: Path, report: dict[str, Any]) -> None:
    records = read_ledgers(run_dir / "logs")
    ref_records = read_ledgers(ref_dir / "logs")
    steps = [r for r in records if r["kind"] == "step"]
    if not steps:
        return
    t0 = min(r["mono"] for r in steps)
    faults_path = run_dir / "faults.jsonl"
    faults = [json.loads(line) for line in faults_path.read_text().splitlines()] if faults_path.exists() else []

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(loss_curve(ref_records), label="reference (no faults)", linewidth=2.5, alpha=0.6)
    ax.plot(loss_curve(records), label=f"{report['scenario']} (faults)", linewidth=1)
    for f in faults:
        ax.axvline(f["step"], color="red", alpha=0.3, linestyle="--")
    ax.set(xlabel="step", ylabel="mean loss over ranks", title=f"loss — {report['scenario']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "loss.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 3.5))
    lanes = sorted({(r["slot"], r["pid"]) for r in steps}, key=lambda x: (x[0], min(
        s["mono"] for s in steps if s["pid"] == x[1])))
    cmap = plt.get_cmap("tab10")
    for lane, (_slot, pid) in enumerate(lanes):
        mine = [r for r in steps if r["pid"] == pid]
        for r in mine:
            ax.broken_barh([(r["mono"] - t0, 0.02)], (lane - 0.4, 0.8), color=cmap(r["generation"] % 10))
    for f in faults:
        ax.axvline(f["mono"] - t0, color="red", linewidth=1.5)
        ax.text(f["mono"] - t0, len(lanes) - 0.5, f["kind"], color="red", fontsize=7, rotation=90, va="top")
    ax.set_yticks(range(len(lanes)), [f"slot {s} pid {p}" for s, p in lanes], fontsize=7)
    ax.set(xlabel="seconds since the first step", title="timeline: committed steps per process, colour = generation")
    fig.tight_layout()
    fig.savefig(run_dir / "timeline.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for label, recs in (("reference", ref_records), (report["scenario"], records)):
        times = sorted({r["step"]: r["mono"] for r in recs if r["kind"] == "step"}.items(), key=lambda kv: kv[1])
        if times:
            start = times[0][1]
            ax.plot([t - start for _, t in times], range(1, len(times) + 1), label=label)
    ax.set(xlabel="seconds", ylabel="distinct steps committed",
           title=f"goodput ratio {report['goodput']['ratio']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "goodput.png", dpi=100)
    plt.close(fig)


def plot_campaign(out: Path, campaign: dict[str, Any], planned: list[Any]) -> dict[str, str]:
    """A campaign's plots next to its summary: goodput bars with 95% confidence whiskers (the report's figures as
    markers), mean loss curve per run over seeds, and the recovery-time distribution."""
    name, runs = campaign["name"], campaign["runs"]
    labels = [run["name"] for run in runs]
    paths = {"goodput": f"{name}-goodput.png", "loss": f"{name}-loss.png", "recovery": f"{name}-recovery.png"}

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, title in ((axes[0], "goodput", "goodput (steps/s)"),
                              (axes[1], "goodput_delta_pct", "goodput vs reference (%)")):
        stats = [run["metrics"][metric] for run in runs]
        means = [s["mean"] if s["mean"] is not None else 0.0 for s in stats]
        errors = [(s["ci95_high"] - s["mean"]) if s["ci95_high"] is not None else 0.0 for s in stats]
        ax.bar(labels, means, yerr=errors, capsize=6, color="tab:blue", alpha=0.75, label="ftcoord (95% CI)")
        marks = [(i, run["published"][metric]) for i, run in enumerate(runs) if metric in run["published"]]
        if marks:
            ax.scatter([i for i, _ in marks], [v for _, v in marks], marker="D", color="black", zorder=3,
                       label="ECRL report")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set(title=title)
        ax.tick_params(axis="x", rotation=20)
        ax.legend(fontsize=8)
    fig.suptitle(f"{campaign['experiment']} — {name}")
    fig.tight_layout()
    fig.savefig(out / paths["goodput"], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for run in runs:
        curves = [loss_curve(read_ledgers(p.directory / "logs")) for p in planned
                  if p.campaign.name == name and p.run.name == run["name"] and p.seed in run["seeds"]]
        curves = [c for c in curves if c]
        if curves:
            length = min(len(c) for c in curves)
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
            ax.plot(mean, label=f"{run['name']} (mean of {len(curves)} seeds)",
                    linewidth=2.5 if run["reference"] else 1, alpha=0.6 if run["reference"] else 1.0)
    ax.set(xlabel="step", ylabel="mean loss over ranks", title=f"loss per run — {name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / paths["loss"], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    faulted = [run for run in runs if not run["reference"]]
    for i, run in enumerate(faulted):
        values = run["recoveries_s"]
        if values:
            ax.boxplot([values], positions=[i], widths=0.5)
            ax.scatter([i + 0.15 * ((j % 5) - 2) / 2 for j in range(len(values))], values, s=14, alpha=0.7)
    ax.set_xticks(range(len(faulted)), [run["name"] for run in faulted], rotation=20)
    ax.set_ylim(bottom=0)
    ax.set(ylabel="seconds", title=f"recovery time per fault (fault → next committed step) — {name}")
    fig.tight_layout()
    fig.savefig(out / paths["recovery"], dpi=100)
    plt.close(fig)
    return paths
