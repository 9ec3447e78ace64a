"""Campaign files (TOML): one experiment as a list of runs × seeds, with the published figures to compare.

At the top: `name`, `experiment`, `description`, `seeds`, a `[job]` every run starts from (a scenario's [job] keys)
and the `[[faults]]` of every run that is not the reference. Each `[[runs]]` table has a `name`; exactly one is the
fault-free `reference = true`, and the others are compared with it, seed by seed. A run's `job = {...}` overrides
the campaign's, its `faults` replace the campaign's, and `published = {goodput_delta_pct = -7.98, ...}` holds the
figures to compare (keys of METRICS). The bundled campaigns (chaos/campaigns/*.toml) are complete examples. Every
run × seed is checked as a scenario before anything starts, so a typo fails in a second, not an hour in.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.scenario import Scenario, ScenarioError, from_dict, toml_file

BUNDLED = Path(__file__).parent.parent / "campaigns"
QUICK_SUFFIX = "-quick"

METRICS: dict[str, str] = {
    "pass_rate": "correctness pass rate",
    "goodput": "goodput (steps/s)",
    "goodput_delta_pct": "goodput vs reference (%)",
    "restarts": "restarts (slot or whole job)",
    "in_process_restarts": "in-process restarts",
    "replayed_steps": "replayed steps",
    "recovery_s": "recovery time (s, mean per fault)",
    "ckpt_stall_s": "checkpoint stall (s, total)",
    "param_l2": "parameter L2 vs reference (final)",
    "loss_abs_diff_auc": "loss divergence AUC (area under |Δloss|)",
    "loss_max_diff": "max |Δloss| vs reference",
}
"""What a campaign aggregates over seeds, in the order the summary shows it."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class CampaignRun:
    name: str
    reference: bool
    job: dict[str, Any]
    faults: tuple[dict[str, Any], ...]
    published: dict[str, float] = field(default_factory=dict)
    published_note: str = ""


@dataclass(frozen=True)
class Campaign:
    name: str
    experiment: str
    description: str
    seeds: tuple[int, ...]
    job: dict[str, Any]
    runs: tuple[CampaignRun, ...]
    source: str = ""
    """Where the published figures come from."""
    published_by: str = "published"
    """The heading of the published figures' column (bundled: "ECRL report")."""
    stand_in: str = ""
    """Said on the terminal and in the summary when the default dataset stands in for a real one."""
    path: str = ""

    @property
    def reference(self) -> CampaignRun:
        return next(r for r in self.runs if r.reference)

    def scenario(self, run: CampaignRun, seed: int, dataset: str | None = None) -> Scenario:
        """The scenario of one run × seed; `dataset` replaces the job's dataset for every run."""
        job = {**self.job, **run.job, "seed": seed}
        if dataset:
            job["dataset"] = dataset
        data = {"name": f"{self.name}.{run.name}.s{seed}",
                "description": f"{self.experiment}: {run.name}, seed {seed}", "job": job,
                "faults": [] if run.reference else list(run.faults)}
        return from_dict(data, f"{self.path or self.name} [[runs]] {run.name!r} (seed {seed})")


def fingerprint(scenario: Scenario) -> str:
    """What a finished run was run with: a resumed campaign reuses it only if this is unchanged."""
    data = scenario.to_dict()
    data.pop("path", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()[:16]


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _run(table: Any, default_faults: list[dict[str, Any]], where: str) -> CampaignRun:
    if not isinstance(table, dict):
        raise ScenarioError(f"{where}: each [[runs]] entry must be a table, got {table!r}")
    _check_keys(table, {"name", "reference", "job", "faults", "published", "published_note"}, where)
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ScenarioError(f"{where}: name = {name!r}: must be lower-case letters, digits, '-' or '_' "
                            f"(it names the run's directory)")
    where = f"{where} {name!r}"
    job = table.get("job", {})
    if not isinstance(job, dict):
        raise ScenarioError(f"{where}: job must be a table of scenario [job] keys, got {job!r}")
    published = table.get("published", {})
    if not isinstance(published, dict):
        raise ScenarioError(f"{where}: published must be a table of metric = number, got {published!r}")
    _check_keys(published, set(METRICS), f"{where} published")
    for key, value in published.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(f"{where} published {key} = {value!r}: must be a number")
    faults = table.get("faults", default_faults)
    return CampaignRun(name, bool(table.get("reference", False)), dict(job), tuple(faults),
                       {k: float(v) for k, v in published.items()}, str(table.get("published_note", "")))


def parse(text: str, where: str = "<campaign>") -> Campaign:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: not valid TOML ({exc})") from exc
    _check_keys(data, {"name", "experiment", "description", "seeds", "job", "faults", "runs", "source",
                       "published_by", "stand_in"}, where)
    for key in ("name", "experiment", "description"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ScenarioError(f"{where}: '{key}' must be a non-empty string")
    if not _NAME.match(data["name"]):
        raise ScenarioError(f"{where}: name = {data['name']!r}: must be lower-case letters, digits, '-' or '_'")
    seeds = data.get("seeds", [])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ScenarioError(f"{where}: seeds = {seeds!r}: must be a non-empty list of integers >= 0")
    runs_table = data.get("runs", [])
    if not isinstance(runs_table, list) or not runs_table:
        raise ScenarioError(f"{where}: a campaign needs [[runs]] (one with reference = true)")
    runs = tuple(_run(t, data.get("faults", []), f"{where} [[runs]] #{i + 1}") for i, t in enumerate(runs_table))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{where}: run names must be unique, got {names}")
    if sum(r.reference for r in runs) != 1:
        raise ScenarioError(f"{where}: exactly one run must have reference = true (the fault-free baseline), "
                            f"got {sum(r.reference for r in runs)}")
    if not any(r.faults for r in runs if not r.reference):
        raise ScenarioError(f"{where}: no run injects a fault; give [[faults]] (for every run) or per-run faults")
    campaign = Campaign(data["name"], data["experiment"], data["description"], tuple(seeds), dict(data.get("job", {})),
                        runs, str(data.get("source", "")), str(data.get("published_by", "published")),
                        str(data.get("stand_in", "")), where)
    for run in runs:
        campaign.scenario(run, seeds[0])  # every run must be a valid scenario, before anything starts
    return campaign


def load(name_or_path: str, quick: bool = False) -> Campaign:
    """A bundled campaign by name (`ecrl-exp1`, its `--quick` variant `ecrl-exp1-quick`) or a TOML file."""
    is_file = bool(Path(name_or_path).suffix) or Path(name_or_path).exists()
    if quick and is_file:
        raise ScenarioError(f"--quick picks the short variant of a bundled campaign; {name_or_path!r} is a "
                            f"file: write its short version as a file of its own")
    if quick and not name_or_path.endswith(QUICK_SUFFIX):
        name_or_path += QUICK_SUFFIX
    path = toml_file(name_or_path, BUNDLED, "campaign")
    return parse(path.read_text(), str(path))


def bundled_names() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.toml"))


def parse_seeds(text: str) -> tuple[int, ...]:
    """`--seeds` (e.g. 1337,2027): non-negative integers, each once."""
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as exc:
        raise ScenarioError(f"--seeds {text!r}: give comma-separated integers, e.g. 1337,2027") from exc
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ScenarioError(f"--seeds {text!r}: give distinct integers >= 0, e.g. 1337,2027")
    return seeds
