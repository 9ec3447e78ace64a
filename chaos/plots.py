"""PNG plots of a run: loss against the reference, a timeline of generations and faults, goodput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from chaos.metrics import loss_curve  # noqa: E402
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
