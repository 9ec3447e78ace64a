"""A tiny campaign end to end (2 seeds × 2 runs, real processes), interrupted by Ctrl-C and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.campaign.runner import MARKER
from tests.helpers.campaigns import TINY
from tests.helpers.wait import wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # one campaign of real runs (45 s)


@dataclass
class Campaign:
    out: Path
    before: dict[str, tuple[int, int, str]]
    """Runs finished before the interrupt: (inode, mtime_ns) of report.json and the marker's text."""
    resumed: subprocess.CompletedProcess


def _command(spec: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "chaos", "campaign", str(spec), "--out", str(out)]


def _finished(out: Path) -> list[Path]:
    return sorted(out.glob(f"tiny/*/seed-*/{MARKER}"))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    root = tmp_path_factory.mktemp("campaign")
    spec, out = root / "tiny.toml", root / "out"
    spec.write_text(TINY)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # A suite started in the background by a shell without job control inherits SIGINT ignored, and so would
    # the campaign: give it Ctrl-C's default back, as a terminal would.
    first = subprocess.Popen(_command(spec, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: _finished(out), 150, "the first run of the campaign to finish")
    finally:
        first.send_signal(signal.SIGINT)
        output, _ = first.communicate(timeout=60)
    assert first.returncode == 130, output
    assert "interrupted: rerun the same command to continue" in output
    before = {}
    for marker in _finished(out):
        report = marker.parent / "report.json"
        before[str(marker.parent.relative_to(out))] = (report.stat().st_ino, report.stat().st_mtime_ns,
                                                        marker.read_text())
    resumed = subprocess.run(_command(spec, out), capture_output=True, text=True, env=env, timeout=240)
    return Campaign(out, before, resumed)


def test_resuming_an_interrupted_campaign_repeats_no_finished_run(campaign: Campaign) -> None:
    assert campaign.resumed.returncode == 0, campaign.resumed.stdout + campaign.resumed.stderr
    assert 1 <= len(campaign.before) < 4
    assert f"resuming: {len(campaign.before)} of 4 runs already finished" in campaign.resumed.stderr
    assert f"{4 - len(campaign.before)} of them ran now" in campaign.resumed.stdout
    for run, (inode, mtime, marker) in campaign.before.items():
        report = campaign.out / run / "report.json"
        assert (report.stat().st_ino, report.stat().st_mtime_ns) == (inode, mtime), f"{run} was run again"
        assert (campaign.out / run / MARKER).read_text() == marker
    assert len(_finished(campaign.out)) == 4


def test_tiny_campaign_end_to_end(campaign: Campaign) -> None:
    summary = json.loads((campaign.out / "summary.json").read_text())
    assert summary["runs_planned"] == summary["runs_finished"] == 4
    [tiny] = summary["campaigns"]
    runs = {run["name"]: run for run in tiny["runs"]}
    assert set(runs) == {"reference", "kill"}
    for name, run in runs.items():
        assert run["seeds"] == [1, 2]
        assert run["metrics"]["pass_rate"]["mean"] == 1.0, run["per_seed"]
        for seed in (1, 2):
            report = json.loads((campaign.out / "tiny" / name / f"seed-{seed}" / "report.json").read_text())
            assert report["verdict"] == "pass" and report["campaign"]["seed"] == seed
            assert report["correctness"]["duplicates"] == report["correctness"]["missing"] == 0
    kill = runs["kill"]
    assert kill["metrics"]["restarts"]["values"] == [1.0, 1.0]
    assert kill["metrics"]["loss_abs_diff_auc"]["values"] == [0.0, 0.0]  # bit-identical to its seed's reference
    deltas = []
    for seed in (1, 2):
        ref = json.loads((campaign.out / "tiny" / "reference" / f"seed-{seed}" / "report.json").read_text())
        run = json.loads((campaign.out / "tiny" / "kill" / f"seed-{seed}" / "report.json").read_text())
        assert run["goodput"]["reference_steps_per_s"] == ref["goodput"]["steps_per_s"]
        deltas.append((run["goodput"]["steps_per_s"] / ref["goodput"]["steps_per_s"] - 1) * 100)
    assert kill["metrics"]["goodput_delta_pct"]["mean"] == pytest.approx(sum(deltas) / 2, abs=0.02)
    text = (campaign.out / "summary.md").read_text()
    assert "| run | metric | a made-up paper | ftcoord (ours) |" in text
    assert "| kill | goodput vs reference (%) | -7.98 |" in text
    for plot in tiny["plots"].values():
        assert (campaign.out / plot).stat().st_size > 1000
    assert "a made-up paper" in campaign.resumed.stdout  # the side-by-side table on the terminal
