"""Fault-free reference runs: built once per job configuration and code, verified, then trusted.

Every faulted run of its configuration is compared with a reference, so it is held to more than any run: it passes
the same ledger checks; every rank finished with the same parameters (ranks that disagree are an error, not a None);
and the replay of its schedule (chaos.proof.replay) reproduces its final parameters bit for bit, which makes a
replay of another schedule a trustworthy reference for an elastic run (where no replay can be exact, DDP's built-in
all-reduce on 3+ ranks, within the model check's tolerance, the distance recorded). The cache key holds the job's
trajectory, a digest of this code and the torch and Python versions, so a changed loop never meets a stale
reference; builders of one key take a file lock, and a reference is published by an atomic rename, so concurrent
`chaos run`s are safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch

from chaos.errors import ReferenceUnusable
from chaos.own_code import CODE_ROOT
from chaos.proof.expected import DataExpectation
from chaos.proof.model_check import (
    TOLERANCE_RELATIVE_L2,
    ExpectedModel,
    compare_states,
    exact_arithmetic,
    parameter_names,
    read_final_params,
    run_losses,
    step_plan,
)
from chaos.proof.replay import StepPlan, replay
from chaos.proof.verify import verify_ledger
from chaos.report.metrics import goodput
from chaos.scenario import Scenario, training_config
from training.ledger import scan_ledgers
from training.state import state_digest

CACHE_ENV = "FTCOORD_CACHE_DIR"
SUMMARY = "summary.json"
PACKAGES = ("ftcoord", "training", "chaos")


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "ftcoord")) / "references"


@cache
def code_version() -> str:
    """A digest of every Python source of the three packages: any change makes a new reference."""
    root = CODE_ROOT
    h = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def cache_key(scenario: Scenario) -> str:
    versions = f"{code_version()}-torch{torch.__version__}-py{platform.python_version()}"
    return f"{scenario.job.trajectory_key()}-{hashlib.sha256(versions.encode()).hexdigest()[:12]}"


def reference_dir(scenario: Scenario) -> Path:
    return cache_root() / cache_key(scenario)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_reference(scenario: Scenario, quiet: bool = False) -> tuple[Path, dict[str, Any]]:
    """The verified reference run of this scenario's job: from the cache, or run now (no faults).

    Raises:
        ReferenceUnusable: the reference run failed, or it does not pass its own checks.
    """
    from chaos.run.runner import ChaosRunner  # the runner imports this module's callers

    directory = reference_dir(scenario)
    with _locked(directory):
        summary_path = directory / SUMMARY
        if summary_path.exists():
            return directory, json.loads(summary_path.read_text())
        temp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
        result = ChaosRunner(scenario, temp, with_faults=False, quiet=quiet).run()
        if not result.completed:
            raise ReferenceUnusable(f"the fault-free reference run failed: {result.error}")
        summary = summarize_reference(temp, scenario, result.wall_s)
        (temp / SUMMARY).write_text(json.dumps(summary, indent=1))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(temp, directory)
        return directory, summary


def summarize_reference(run_dir: Path, scenario: Scenario, wall_s: float) -> dict[str, Any]:
    """Verify a fault-free run and summarize what faulted runs are compared with.

    Raises:
        ReferenceUnusable: the run fails its ledger checks, its ranks disagree, or the replay of its
            schedule does not reproduce it.
    """
    job = scenario.job
    config = training_config(job)
    scan = scan_ledgers(run_dir / "logs")
    expect = DataExpectation(job.dataset, job.global_batch, job.seed)
    verdict = verify_ledger(scan, expect, job.steps, config_hash=config.config_hash())
    if verdict.problems:
        raise ReferenceUnusable(f"the fault-free reference run in {run_dir} fails its own checks: "
                             + "; ".join(verdict.problems[:5]))
    plan, problems = step_plan(scan.records, verdict, config.grad_reduction)
    if problems:
        raise ReferenceUnusable(f"the reference run in {run_dir} cannot be replayed: {'; '.join(problems)}")
    replayed = replay(config, plan, expect)
    exact, relative = exact_arithmetic(plan), None
    if exact and verdict.final_digests != [replayed.digest]:
        raise ReferenceUnusable(
            f"the replay of the fault-free reference ({run_dir}) ends with {replayed.digest}, the real run with "
            f"{verdict.final_digests}: the replay is not faithful on this machine, so no model check can be "
            f"trusted. Report this with the run directory")
    if not exact:  # DDP's built-in all-reduce on 3+ ranks sums in gloo's order: held to the model check's tolerance
        final = _final_params(run_dir, verdict.final_digests)
        if final.keys() != replayed.state.keys():
            raise ReferenceUnusable(f"the replay of the fault-free reference ({run_dir}) holds other tensors than "
                                    f"the real run: no model check can be trusted. Report this with the run directory")
        compared = compare_states(final, replayed.state, parameter_names(config, expect))
        relative = compared.param_l2_relative
        if not compared.within(TOLERANCE_RELATIVE_L2):
            raise ReferenceUnusable(
                f"the replay of the fault-free reference ({run_dir}) ends {relative} (relative L2; buffers "
                f"{compared.buffer_l2_relative}, integer tensors differing {compared.integers_differ[:3]}) from the "
                f"real run's, beyond the tolerance {TOLERANCE_RELATIVE_L2} for DDP's built-in all-reduce on 3+ "
                f"ranks: no model check can be trusted. Report this with the run directory")
    return {"cache_key": run_dir.name.split(".tmp-")[0], "trajectory_key": job.trajectory_key(),
            "code_version": code_version(), "torch": torch.__version__, "steps": job.steps,
            "final_digest": verdict.final_digests[0], "world_size": plan[-1].world_size,
            "plan": [[p.world_size, p.reduction, list(p.threads), p.device] for p in plan],
            "replay_verified": True, "replay_exact": exact, "replay_relative_l2": relative,
            "replay_s": round(replayed.seconds, 2),
            "steps_per_s": goodput(scan.records, job.steps), "wall_s": wall_s}


def _final_params(run_dir: Path, digests: list[str]) -> dict[str, torch.Tensor]:
    """Rank 0's `final_params.pt`, which must hold what the ranks reported (a replay held to a tolerance is compared
    with it)."""
    state, problem = read_final_params(run_dir / "logs" / "final_params.pt", digests)
    if problem is not None:  # a missing or unreadable file is one too
        raise ReferenceUnusable(f"rank 0's final parameters in the fault-free reference run {run_dir} are not the "
                                f"parameters its ranks reported ({problem}): delete it and run again")
    return state


def reference_model(ref_dir: Path, summary: dict[str, Any],
                    scenario: Scenario | None = None) -> tuple[ExpectedModel, list[StepPlan]]:
    """The reference as the model check uses it: digest, parameters, losses and schedule, checked as they are read:
    its final parameters against the digest it was verified with, its key and steps against `scenario`'s.

    Raises:
        ReferenceUnusable: the summary lacks what a verified reference has, or the cache entry was altered or
            damaged since (its final file, its digest, another job's key).
    """
    if summary.get("unusable"):
        raise ReferenceUnusable(summary["unusable"])
    rebuild = f"delete {ref_dir} and run again to rebuild it"
    if not summary.get("final_digest") or not summary.get("replay_verified") or "plan" not in summary:
        raise ReferenceUnusable(f"the reference in {ref_dir} has no verified final digest and schedule (built by "
                             f"an older version, or altered); {rebuild}")
    if scenario is not None and (summary.get("trajectory_key"), summary.get("steps")) != (
            scenario.job.trajectory_key(), scenario.job.steps):
        raise ReferenceUnusable(f"the reference in {ref_dir} was made for another job (key "
                                f"{summary.get('trajectory_key')}, {summary.get('steps')} steps; this scenario's: "
                                f"{scenario.job.trajectory_key()}, {scenario.job.steps}); {rebuild}")
    params = ref_dir / "logs" / "final_params.pt"
    try:
        state = torch.load(params, weights_only=True, map_location="cpu")
    except Exception as exc:  # missing or unreadable: the evidence is gone
        raise ReferenceUnusable(f"the reference's final parameters {params} cannot be read ({exc}); {rebuild}") from exc
    digest = state_digest(state)
    if digest != summary["final_digest"]:
        raise ReferenceUnusable(f"the reference's final parameters {params} are not the ones it was verified with "
                                f"(digest {digest}, verified {summary['final_digest']}): the cache entry was altered "
                                f"or damaged; {rebuild}")
    records = scan_ledgers(ref_dir / "logs").records
    plan = [StepPlan(world, reduction, tuple(threads), *device)  # a cache entry from before devices: the CPU
            for world, reduction, threads, *device in summary["plan"]]
    return ExpectedModel("reference", summary["final_digest"], state, run_losses(records)), plan
