"""Reading the events of tests/helpers/allreduce_job.py runs, and launching it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.cluster import REPO
from tests.helpers.wait import wait_until

JOB_MODULE = "tests.helpers.allreduce_job"


@dataclass
class AllreduceRun:
    out: Path

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.out.glob("events-*.jsonl")):
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    event = json.loads(line)
                    if kind is None or event["kind"] == kind:
                        found.append(event)
        return sorted(found, key=lambda e: e["mono"])

    def logs(self, event: str) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.out.glob("**/*.jsonl")):
            if path.name.startswith("events-"):
                continue
            for line in path.read_text().splitlines():
                if line.endswith("}") and f'"{event}"' in line:
                    found.append(json.loads(line))
        return sorted(found, key=lambda e: e.get("mono", 0))

    def seconds_until(self, kind: str, since: float, timeout: float, what: str,
                      where: Callable[[dict[str, Any]], bool] = lambda event: True) -> float:
        """Wait for the first `kind` event after `since` (monotonic) that matches `where`; seconds from `since`."""
        def found() -> list[dict[str, Any]]:
            return [e for e in self.events(kind) if e["mono"] > since and where(e)]

        return wait_until(found, timeout, what)[0]["mono"] - since

    def max_step(self) -> int:
        return max((e["step"] for e in self.events("step")), default=-1)

    def wait_step(self, step: int, timeout: float = 60) -> None:
        wait_until(lambda: self.max_step() >= step, timeout, f"training to reach step {step}")

    def pid_of(self, slot: int) -> int:
        return [e for e in self.events("generation") if e["slot"] == slot][-1]["pid"]

    def assert_correct(self, steps: int) -> None:
        """Every all-reduce result was right, and every step was completed."""
        wrong = [e for e in self.events("step") if e["value"] != e["expected"]]
        assert not wrong, f"wrong all-reduce results: {wrong[:3]}"
        done = {e["step"] for e in self.events("step")}
        assert done == set(range(steps)), f"steps never completed: {sorted(set(range(steps)) - done)}"

    def generation_starts(self, generation: int) -> list[dict[str, Any]]:
        return [e for e in self.events("generation") if e["generation"] == generation]


def launch(out: Path, store: str, job_id: str, *job_args: str, nproc: int = 2,
           launcher_args: tuple[str, ...] = (), python_options: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """Start `ftcoord-launch` over the allreduce job (a real launcher process); `python_options`: the interpreter's
    options in the job's command (`python -u -m ...`)."""
    command = [sys.executable, "-m", "ftcoord.launcher.main", "--store", store, "--job-id", job_id,
               "--nproc", str(nproc), "--log-dir", str(out / "logs"), *launcher_args,
               "--", sys.executable, *python_options, "-m", JOB_MODULE, "--out", str(out), *job_args]
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
