"""`chaos bench`'s recovery figures: every fault class, at the settings a user gets, beside a whole-job restart.

Each class is a real run (launcher, ranks, store) with one fault, repeated, the classes interleaved so
that machine noise spreads over all of them. Per class: the survivors' stall (fault -> next committed
step) and the time back to full world size (fault -> first step at the target size), medians with
min-max. The whole-job restart (`--restart-policy job`: every process restarts, state from disk) is
the baseline, measured in the same run.
"""

from __future__ import annotations

import json
import statistics
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaos.report.metrics import fault_timings
from chaos.run.runner import ChaosRunner
from chaos.scenario import Fault, JobSpec, Scenario
from ftcoord import Timing
from training.ledger import read_ledgers

DEFAULT = Timing()


def summary(samples: list[float], digits: int = 4) -> dict[str, Any]:
    return {"median": round(statistics.median(samples), digits), "min": round(min(samples), digits),
            "max": round(max(samples), digits), "samples": [round(s, digits) for s in samples]}


def default_job(**overrides: Any) -> JobSpec:
    """A job with the defaults a user gets (Timing(), launcher defaults)."""
    base = JobSpec(nproc=2, steps=300, global_batch=32, dataset="synthetic:2048", step_time=0.02,
                   ckpt_strategy="blocking", ckpt_every=10, heartbeat_interval=DEFAULT.heartbeat_interval,
                   heartbeat_timeout=DEFAULT.heartbeat_timeout, join_timeout=DEFAULT.join_timeout)
    return replace(base, **overrides)


def fault_run(out: Path, name: str, job: JobSpec, faults: tuple[Fault, ...]) -> list[dict[str, Any]]:
    """Run a job with `faults`; the timings of each fault that fired."""
    run_dir = out / "runs" / f"{name}-{uuid.uuid4().hex[:6]}"
    result = ChaosRunner(Scenario(name, name, job, faults), run_dir, quiet=True).run()
    if not result.completed:
        raise RuntimeError(f"benchmark run {name} failed: {result.error}")
    events = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    missed = [e for e in events if not e.get("fired", True)]
    if missed or len(events) != len(faults):
        raise RuntimeError(f"benchmark run {name}: a fault did not fire ({missed or events}); see {run_dir}")
    return fault_timings(events, read_ledgers(run_dir / "logs"), run_dir / "logs", job.nproc)


def classes(steps: int) -> dict[str, tuple[JobSpec, tuple[Fault, ...]]]:
    """The fault classes the recovery figures cover, each a job and its fault(s) at a third of the run."""
    at = steps // 3
    two, three = default_job(steps=steps, ckpt_strategy="none"), default_job(steps=steps, nproc=3, global_batch=48,
                                                                               ckpt_strategy="none")
    return {
        "kill non-leader": (two, (Fault("kill-follower", step=at),)),
        "kill leader": (two, (Fault("kill-leader", step=at),)),
        "raise": (two, (Fault("raise", step=at, rank=1),)),
        "kill mid-all-reduce": (two, (Fault("kill-midreduce", step=at, rank=1),)),
        "two at once": (three, (Fault("kill-boundary", step=at, rank=1), Fault("kill-boundary", step=at, rank=2))),
        "two at once, no warm standby": (replace(three, warm_standby=0),
                                         (Fault("kill-boundary", step=at, rank=1),
                                          Fault("kill-boundary", step=at, rank=2))),
        "node lost": (replace(two, nodes=((0,), (1,))), (Fault("lose", slot=1, step=at),)),
        "node partitioned": (replace(two, nodes=((0,), (1,))), (Fault("partition", slot=1, step=at),)),
        "hang": (two, (Fault("hang", step=at, rank=1, duration=DEFAULT.heartbeat_timeout + 5),)),
        "whole-job restart (baseline)": (default_job(steps=steps, restart_policy="job"), (Fault("kill", 1, at),)),
    }


def bench_recovery_by_fault(out: Path, reps: int, steps: int) -> dict[str, Any]:
    """Per class: {"stall_s", "full_s", "detect_s"} as median/min/max/samples (full_s None when the world
    never returns to full size by design: a node lost for good; detect_s None when no run logged a
    detection: a whole-job restart may stop every process before any of them notices)."""
    plan = classes(steps)
    names = list(plan)
    samples: dict[str, dict[str, list[float]]] = {n: {"stall_s": [], "full_s": [], "detect_s": []} for n in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:  # rotate: noise spreads over classes
            job, faults = plan[name]
            timings = fault_run(out, f"recovery-{name.replace(' ', '-').replace(',', '')}", job, faults)
            for key, value in (("stall_s", max(t["recover_s"] for t in timings)),
                               ("full_s", max((t["full_recover_s"] for t in timings), default=None)),
                               ("detect_s", min((t["detect_s"] for t in timings if t["detect_s"] is not None),
                                                default=None))):
                if value is not None:
                    samples[name][key].append(value)
    return {name: {key: summary(values) if values else None for key, values in per.items()}
            for name, per in samples.items()}
