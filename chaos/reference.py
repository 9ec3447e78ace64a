"""Fault-free reference runs, cached per job configuration so they are not repeated."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from chaos.metrics import goodput
from chaos.scenario import Scenario
from training.ledger import read_ledgers

CACHE_ENV = "FTCOORD_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "ftcoord")) / "references"


def reference_dir(scenario: Scenario) -> Path:
    return cache_root() / scenario.job.trajectory_key()


def ensure_reference(scenario: Scenario, quiet: bool = False) -> tuple[Path, dict[str, Any]]:
    """The reference run of this scenario's job: from the cache, or run now (no faults)."""
    from chaos.run import ChaosRunner  # the runner imports this module's callers

    directory = reference_dir(scenario)
    summary_path = directory / "summary.json"
    if summary_path.exists():
        return directory, json.loads(summary_path.read_text())
    temp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
    result = ChaosRunner(scenario, temp, with_faults=False, quiet=quiet).run()
    if not result.completed:
        raise RuntimeError(f"the fault-free reference run failed: {result.error}")
    summary = summarize_reference(temp, scenario, result.wall_s)
    (temp / "summary.json").write_text(json.dumps(summary, indent=1))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(temp, directory)
    return directory, summary


def summarize_reference(run_dir: Path, scenario: Scenario, wall_s: float) -> dict[str, Any]:
    """What a faulted run is compared with: the final digest, world size and goodput."""
    records = read_ledgers(run_dir / "logs")
    finals = {r["digest"] for r in records if r["kind"] == "final"}
    world = max((r["world_size"] for r in records if r["kind"] == "final"), default=scenario.job.nproc)
    return {"trajectory_key": scenario.job.trajectory_key(), "steps": scenario.job.steps,
            "final_digest": finals.pop() if len(finals) == 1 else None, "world_size": world,
            "steps_per_s": goodput(records, scenario.job.steps), "wall_s": wall_s}
