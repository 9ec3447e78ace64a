"""Running a campaign: every run × seed in its own directory, resumable, with progress and an ETA.

A run is finished when its directory holds `report.json` and `campaign-run.json` (written last,
with the fingerprint of the scenario it ran). A resumed campaign skips finished runs, reruns
unfinished ones from scratch, and refuses to mix a finished run made with another configuration.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from chaos.campaign.campaign import Campaign, CampaignRun, fingerprint
from chaos.report.metrics import goodput
from chaos.report.reference import ReferenceUnusable, summarize_reference
from chaos.report.report import build_report, write_report
from chaos.run.runner import RUN_TIMEOUT_S, ChaosRunner
from chaos.scenario import Scenario, ScenarioError, to_toml
from training.ledger import read_ledgers

MARKER = "campaign-run.json"
REFERENCE_SUMMARY = "reference.json"


@dataclass(frozen=True)
class PlannedRun:
    campaign: Campaign
    run: CampaignRun
    seed: int
    scenario: Scenario
    directory: Path
    reference_dir: Path
    """The same seed's fault-free run of the same campaign: what this run is compared with."""

    @property
    def label(self) -> str:
        return f"{self.campaign.name} · {self.run.name} · seed {self.seed}"

    def finished(self) -> bool:
        """Done with this configuration; raises if done with another one."""
        marker = self.directory / MARKER
        if not marker.is_file() or not (self.directory / "report.json").is_file():
            return False
        recorded = json.loads(marker.read_text()).get("fingerprint")
        if recorded != fingerprint(self.scenario):
            raise ScenarioError(
                f"{self.directory} holds a finished run made with another configuration (fingerprint {recorded}, "
                f"now {fingerprint(self.scenario)}): the campaign file or --dataset changed since. Use a new "
                f"--out, or delete that directory to rerun it with the new configuration")
        return True

    def report(self) -> dict[str, Any]:
        return json.loads((self.directory / "report.json").read_text())


def run_dir(out: Path, campaign: Campaign, run: CampaignRun, seed: int) -> Path:
    return out / campaign.name / run.name / f"seed-{seed}"


def plan(campaigns: list[Campaign], out: Path, seeds: tuple[int, ...] | None,
         dataset: str | None, only: tuple[str, ...] = ()) -> list[PlannedRun]:
    """Seed by seed, the reference first: an interrupted campaign leaves whole seeds behind it.
    `only` names the runs to keep (the reference always runs: the others are compared with it)."""
    names = {r.name for c in campaigns for r in c.runs}
    unknown = sorted(set(only) - names)
    if unknown:
        raise ScenarioError(f"--runs {','.join(only)}: no run named {unknown} in these campaigns; "
                            f"their runs: {sorted(names)}")
    planned = []
    for campaign in campaigns:
        ordered = [campaign.reference] + [r for r in campaign.runs
                                          if not r.reference and (not only or r.name in only)]
        for seed in seeds or campaign.seeds:
            for run in ordered:
                planned.append(PlannedRun(campaign, run, seed, campaign.scenario(run, seed, dataset),
                                          run_dir(out, campaign, run, seed),
                                          run_dir(out, campaign, campaign.reference, seed)))
    return planned


class CampaignRunner:
    def __init__(self, planned: list[PlannedRun], quiet: bool = False, stream: TextIO | None = None) -> None:
        self.planned = planned
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.executed: list[PlannedRun] = []
        """Runs this invocation ran (resumed ones are not in it)."""

    def run(self) -> None:
        finished = {id(p) for p in self.planned if p.finished()}  # checks every fingerprint before any work
        if finished:
            self._say(f"resuming: {len(finished)} of {len(self.planned)} runs already finished, kept as they are")
        for index, planned in enumerate(self.planned, 1):
            if id(planned) in finished:
                continue
            self._say(f"[{index}/{len(self.planned)}] {planned.label} — {self._elapsed_and_eta(index)}")
            self._execute(planned, f"[{index}/{len(self.planned)}] {planned.campaign.name} {planned.run.name} "
                                   f"s{planned.seed}")
            self.executed.append(planned)

    def _execute(self, planned: PlannedRun, title: str) -> None:
        scenario, directory = planned.scenario, planned.directory
        timeout = max(RUN_TIMEOUT_S, 2.0 * scenario.job.steps)
        result = ChaosRunner(scenario, directory, with_faults=not planned.run.reference, quiet=self.quiet,
                             timeout_s=timeout, title=title).run()
        (directory / "scenario.toml").write_text(to_toml(scenario))
        ref_dir = planned.reference_dir
        if planned.run.reference:
            try:
                ref = summarize_reference(directory, scenario, result.wall_s)
            except ReferenceUnusable as exc:  # every run of this seed then fails its model check, saying why
                ref = {"unusable": str(exc), "steps_per_s": goodput(read_ledgers(directory / "logs"),
                                                                     scenario.job.steps)}
            (directory / REFERENCE_SUMMARY).write_text(json.dumps(ref, indent=1))
        else:
            ref = json.loads((ref_dir / REFERENCE_SUMMARY).read_text())
        report = build_report(directory, scenario, ref_dir, ref)
        report["wall_s"] = round(result.wall_s, 2)
        report["campaign"] = {"name": planned.campaign.name, "run": planned.run.name, "seed": planned.seed,
                              "reference": planned.run.reference, "reference_dir": str(ref_dir)}
        write_report(directory, report, ref_dir)
        shutil.rmtree(directory / "ckpt", ignore_errors=True)  # the report is built; ResNet checkpoints add up
        marker = {"fingerprint": fingerprint(scenario), "campaign": planned.campaign.name, "run": planned.run.name,
                  "seed": planned.seed, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (directory / MARKER).write_text(json.dumps(marker, indent=1))
        verdict = report["verdict"].upper()
        self._say(f"    {verdict}: {report['goodput']['steps_per_s']} steps/s (ratio {report['goodput']['ratio']}), "
                  f"{report['restarts']} restarts, {result.wall_s:.0f}s")

    def _elapsed_and_eta(self, index: int) -> str:
        """The ETA scales the seconds per step seen so far to the steps left, per campaign where it has
        a finished run (a ResNet step costs more than an MLP step), else over all finished runs."""
        elapsed = time.monotonic() - self.started
        rates: dict[str, list[tuple[int, float]]] = {}
        for p in self.planned[: index - 1]:
            wall = p.report().get("wall_s") if (p.directory / MARKER).is_file() else None
            if wall:
                rates.setdefault(p.campaign.name, []).append((p.scenario.job.steps, wall))
        if not rates:
            return f"{_clock(elapsed)} elapsed, ETA after the first run"
        everything = [pair for pairs in rates.values() for pair in pairs]

        def per_step(pairs: list[tuple[int, float]]) -> float:
            return sum(w for _, w in pairs) / sum(s for s, _ in pairs)

        left = sum(p.scenario.job.steps * per_step(rates.get(p.campaign.name, everything))
                   for p in self.planned[index - 1:] if not (p.directory / MARKER).is_file())
        return f"{_clock(elapsed)} elapsed, ETA {_clock(left)}"

    def _say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.stream, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
