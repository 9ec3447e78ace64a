"""A user's script under `ftcoord-launch` (the examples), its output read as it comes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from chaos.report.metrics import read_logs
from tests.helpers.cluster import REPO
from tests.helpers.train_runs import child_env

CPU = ("--device", "cpu")
"""What the examples train on in the tests, on any machine: their jobs have more ranks than a machine has GPUs."""


def slot_pid(logs: Path, slot: int) -> int:
    """The pid of the slot's newest process, from the launcher's log."""
    started = [e for e in read_logs(logs, ("child_started",)) if e["slot"] == slot]
    assert started, f"slot {slot} never started"
    return int(started[-1]["pid"])


class ScriptRun:
    """`ftcoord-launch --store S --job-id J --nproc N -- python SCRIPT ARGS`, started in `out`."""

    def __init__(self, out: Path, store: str, job_id: str, script: str, args: list[str], nproc: int = 2,
                 launch_args: tuple[str, ...] = ()) -> None:
        out.mkdir(parents=True)
        self.out, self.logs = out, out / "logs"
        command = [sys.executable, "-m", "ftcoord.launcher.main", "--store", store, "--job-id", job_id,
                   "--nproc", str(nproc), "--log-dir", str(self.logs), *launch_args,
                   "--", sys.executable, str(REPO / script), *args, *CPU]
        self.proc = subprocess.Popen(command, cwd=out, env={**os.environ, **child_env(out, [])}, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout),  # type: ignore[arg-type]
                                        daemon=True)
        self._reader.start()

    def printed(self, pattern: str) -> list[tuple[int, ...]]:
        """The integer groups of every match of `pattern` in the output, in order. Matched in the whole output, not
        line by line: unbuffered (PYTHONUNBUFFERED=1), print() writes a line and its newline apart, so one
        process's line can run on into another's."""
        return [tuple(int(g) for g in m.groups()) for m in re.finditer(pattern, "".join(list(self.lines)))]

    def wait(self, timeout: float = 120) -> str:
        """The launcher's output once it exited 0 (an assertion with its tail otherwise)."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(10)
        output = "".join(self.lines)
        assert self.proc.returncode == 0, output[-3000:]
        return output
