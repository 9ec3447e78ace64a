"""Running `python -m training` under a real launcher (or forked) for integration tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.proof.proof import Proof, prove
from tests.helpers.cluster import REPO
from tests.helpers.wait import wait_until
from training.config import TrainConfig
from training.ledger import read_ledgers

DATASET, GLOBAL_BATCH, SEED = "synthetic:512", 32, 1337  # 16 steps per epoch
FAST = ["--heartbeat-interval", "0.1", "--heartbeat-timeout", "1.0"]


def train_args(steps: int, *extra: str, join_timeout: float = 10.0) -> list[str]:
    """The command line of the tests' training runs: on the CPU on any machine (`--device` in `extra` wins), as their
    jobs have more ranks than a machine has GPUs."""
    device = [] if "--device" in extra else ["--device", "cpu"]
    return ["--steps", str(steps), "--dataset", DATASET, "--global-batch", str(GLOBAL_BATCH), "--seed", str(SEED),
            "--model", "mlp", "--hook", "chaos.run.inject:hook", "--join-timeout", str(join_timeout), *FAST, *device,
            *extra]


def child_env(out: Path, faults: list[dict[str, Any]] | None) -> dict[str, str]:
    return {"TORCH_CPP_LOG_LEVEL": "ERROR", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO),
            "FTCOORD_FAULT_PLAN": json.dumps(faults or []), "FTCOORD_FAULT_MARKERS": str(out)}


@dataclass
class TrainingRun:
    out: Path
    proc: subprocess.Popen[str] | None = None

    @classmethod
    def launch(cls, out: Path, store: str, job_id: str, args: list[str], *, nproc: int = 2,
               faults: list[dict[str, Any]] | None = None, launcher_args: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> TrainingRun:
        out.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "ftcoord.launcher.main", "--store", store, "--job-id", job_id,
                   "--nproc", str(nproc), "--log-dir", str(out / "logs"), *launcher_args, "--",
                   sys.executable, "-m", "training", *args]
        proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, **child_env(out, faults), **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        return cls(out, proc)

    def wait(self, timeout: float = 120) -> tuple[int, str]:
        assert self.proc is not None
        try:
            output, _ = self.proc.communicate(timeout=timeout)
        finally:
            self.kill()
        return self.proc.returncode, output

    def kill(self) -> None:
        """SIGKILL the launcher and everything it started (the whole job dies)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def logs(self, event: str) -> list[dict[str, Any]]:
        """The structlog events named `event` of every process of the run (launcher included)."""
        from chaos.report.metrics import read_logs

        return read_logs(self.out / "logs", (event,))

    def records(self) -> list[dict[str, Any]]:
        return read_ledgers(self.out)

    def max_step(self) -> int:
        return max((r["step"] for r in self.records() if r["kind"] == "step"), default=-1)

    def wait_step(self, step: int, timeout: float = 90) -> None:
        wait_until(lambda: self.max_step() >= step, timeout, f"training to commit step {step}")

    def final_digest(self) -> str:
        digests = {r["digest"] for r in self.records() if r["kind"] == "final"}
        assert len(digests) == 1, digests
        return digests.pop()

    def verify(self, steps: int, **config: Any) -> Proof:
        """The verifier's proof of this run: exactly-once data and the model against a fault-free replay
        of the run's own schedule (`config`: training settings beyond train_args' defaults)."""
        return prove(self.out / "logs", train_config(steps, **config), steps)


def train_config(steps: int, **overrides: Any) -> TrainConfig:
    """The configuration `train_args(steps)` runs (what a proof checks the run against)."""
    return TrainConfig(steps=steps, dataset=DATASET, global_batch=GLOBAL_BATCH, seed=SEED, model="mlp",
                       ckpt_strategy="none", **overrides)
