"""Test harness: real member processes (forked), faults, and their event logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftcoord import StoreAddress, connect, job_store, mark_dead
from tests.helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


class Forker:
    """Client of tests/helpers/forker.py (one per test session)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.forker"], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
        )
        self._lock = threading.Lock()
        assert json.loads(self._readline(120))["ready"]

    def _readline(self, timeout: float) -> str:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self._proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            raise RuntimeError("the test fork server did not answer")
        return box[0]

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            return json.loads(self._readline(30))

    def spawn(self, argv: list[str], out: Path, target: str = "tests.helpers.member",
              env: dict[str, str] | None = None) -> int:
        """Fork a child that runs `target.main(argv)` with `env` added to its environment."""
        request = {"spawn": argv, "out": str(out), "target": target, "env": env or {}}
        return int(self._ask(request)["pid"])

    def exited(self) -> dict[int, int]:
        return {int(k): v for k, v in self._ask({"status": True})["exited"].items()}

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        self._proc.wait(10)


@dataclass
class Member:
    slot: int
    pid: int
    events: Path
    incarnation: int | None = None


@dataclass
class Job:
    """One job's member processes, started, killed and read by a test."""

    forker: Forker
    store: str
    job_id: str
    workdir: Path
    target: int
    min_world_size: int = 1
    timing: dict[str, float] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    marks: list[tuple[int, int, float]] = field(default_factory=list)  # (slot, inc, mono)
    killed: set[int] = field(default_factory=set)  # pids this test killed on purpose

    def __post_init__(self) -> None:
        self.client = job_store(connect(StoreAddress.parse(self.store)), self.job_id)

    def start(self, slot: int, *extra: str, wait: bool = True) -> Member:
        n = len(self.members)
        events = self.workdir / f"slot{slot}-{n}.jsonl"
        argv = ["--store", self.store, "--job", self.job_id, "--slot", str(slot),
                "--target", str(self.target), "--min", str(self.min_world_size),
                "--timing", json.dumps(self.timing), "--events", str(events),
                *self.extra_args, *extra]
        member = Member(slot, self.forker.spawn(argv, self.workdir / f"slot{slot}-{n}.out"), events)
        self.members.append(member)
        if wait:
            self.wait_started(member)
        return member

    def wait_started(self, member: Member, timeout: float = 30) -> int:
        started = wait_until(lambda: [e for e in self.read(member) if e["kind"] == "started"],
                             timeout, f"slot {member.slot} (pid {member.pid}) to start")
        member.incarnation = started[0]["incarnation"]
        return member.incarnation

    def read(self, member: Member) -> list[dict[str, Any]]:
        if not member.events.exists():
            return []
        return [json.loads(line) for line in member.events.read_text().splitlines() if line.endswith("}")]

    def events(self) -> list[dict[str, Any]]:
        return [e for m in self.members for e in self.read(m)]

    def alive(self, member: Member) -> bool:
        return member.pid not in self.forker.exited()

    def kill(self, member: Member, mark: bool = True) -> None:
        """SIGKILL a member, wait for it to be gone, then (like a launcher) mark it dead."""
        os.kill(member.pid, signal.SIGKILL)
        self.killed.add(member.pid)
        wait_until(lambda: not self.alive(member), 10, f"pid {member.pid} to die")
        if mark:
            assert member.incarnation is not None
            mark_dead(self.client, member.slot, member.incarnation)
            self.marks.append((member.slot, member.incarnation, time.monotonic()))

    def records(self) -> dict[int, list[dict[str, Any]]]:
        """generation -> every record received for it (one per receiving process)."""
        seen: dict[int, list[dict[str, Any]]] = {}
        for event in self.events():
            if event["kind"] == "record":
                seen.setdefault(event["record"]["generation"], []).append(event["record"])
        return seen

    def latest_record(self) -> dict[str, Any] | None:
        records = self.records()
        return records[max(records)][0] if records else None

    def wait_record(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for _, recs in sorted(self.records().items(), reverse=True):
                if predicate(recs[0]):
                    return recs[0]
            return None

        return wait_until(found, timeout, what)

    def finish(self, timeout: float = 30) -> dict[int, int]:
        """Ask every member to finish; wait for every process.

        Returns pid -> exit code of every member the test did not kill.
        """
        self.client.set("test/stop", "1")
        wait_until(lambda: all(not self.alive(m) for m in self.members), timeout,
                   "every member process to exit")
        exited = self.forker.exited()
        return {m.pid: exited[m.pid] for m in self.members if m.pid not in self.killed}

    def kill_all(self) -> None:
        for member in self.members:
            try:
                os.kill(member.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.kill(member.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
