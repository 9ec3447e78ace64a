"""The run orchestrator: store, launchers, faults from outside, then verify and report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.launchers import Launchers
from chaos.progress import LedgerTail, ProgressDisplay
from chaos.scenario import Fault, Scenario
from ftcoord import StoreServer, connect, job_store
from ftcoord.log import get_logger

RUN_TIMEOUT_S = 900.0


@dataclass
class FaultEvent:
    """A fault as it happened: when (monotonic, this host), to whom, in which generation."""

    kind: str
    slot: int
    step: int
    mono: float
    pid: int | None = None
    generation: int = 0
    label: str = ""
    note: str = ""


@dataclass
class RunResult:
    out: Path
    job_id: str
    wall_s: float
    launcher_codes: list[dict[int, int | None]]
    faults: list[FaultEvent] = field(default_factory=list)
    completed: bool = False
    error: str | None = None


class ChaosRunner:
    """Runs one scenario (or its fault-free reference when `faults` is empty)."""

    def __init__(self, scenario: Scenario, out: Path, *, with_faults: bool = True, quiet: bool = False,
                 timeout_s: float = RUN_TIMEOUT_S, title: str | None = None) -> None:
        self.scenario = scenario
        self.title = title or (scenario.name if with_faults else f"{scenario.name} (reference)")
        self.out = out
        self.faults = list(scenario.faults) if with_faults else []
        self.quiet = quiet
        self.timeout_s = timeout_s
        self.log = get_logger(component="chaos", scenario=scenario.name)
        self.events: list[FaultEvent] = []
        self._pending_conts: list[tuple[float, int]] = []
        self._relaunch_at: float | None = None
        self._crash_marker = out / "ckpt-crash-marker"
        self._lost: set[int] = set()  # nodes lost on purpose and not replaced

    # -- setup ----------------------------------------------------------------------

    def _plan(self) -> list[dict[str, Any]]:
        """In-rank faults become the training hook's plan."""
        points = {"kill-boundary": "at_boundary", "kill-midstep": "after_backward"}
        return [{"kind": "exit", "point": points[f.kind], "slot": f.slot, "step": f.step,
                 "name": f.label or f.kind} for f in self.faults if f.in_rank]

    def _crash_spec(self) -> str | None:
        crashes = [f for f in self.faults if f.kind == "ckpt-crash"]
        return f"kill:{self._crash_marker}:{crashes[0].step}" if crashes else None

    # -- the run --------------------------------------------------------------------

    def run(self) -> RunResult:
        if self.out.exists():
            shutil.rmtree(self.out)
        (self.out / "logs").mkdir(parents=True)
        server = StoreServer("127.0.0.1", 0)
        job_id = f"chaos-{self.scenario.name}-{uuid.uuid4().hex[:8]}"
        self.store = job_store(connect(server.address), job_id)
        launchers = Launchers(self.scenario.job, server.address, job_id, self.out, self._plan(), self._crash_spec(),
                              self.out / "launchers.out")
        tail = LedgerTail(self.out / "logs")
        display = ProgressDisplay(self.title, self.scenario.job.steps, len(self.faults), quiet=self.quiet)
        pending = [f for f in self.faults if not f.in_rank and f.kind != "ckpt-crash"]
        crash = next((f for f in self.faults if f.kind == "ckpt-crash"), None)
        started = time.monotonic()
        codes: list[dict[int, int | None]] = []
        result = RunResult(self.out, job_id, 0.0, codes)
        launchers.start_all()
        try:
            while True:
                tail.poll()
                self._note_in_rank_faults(tail)
                now = time.monotonic()
                for fault in [f for f in pending if tail.committed() >= f.step]:
                    pending.remove(fault)
                    self._inject(fault, tail, launchers)
                self._resume_stopped(now)
                if crash is not None and self._crash_marker.exists():
                    # Rank 0 died inside a checkpoint write (planted in the commit); now the
                    # whole job is lost, so the relaunch must resume from disk.
                    self._record(crash, tail, None, note="rank 0 died mid-write; whole job killed")
                    crash = None
                    launchers.kill_all()
                    self._relaunch_at = now
                if self._relaunch_at is not None and now >= self._relaunch_at and not launchers.running():
                    codes.append(launchers.exit_codes())
                    self._relaunch_at = None
                    launchers.start_all()
                    self.log.info("job_relaunched")
                display.update(tail, len(self.events))
                if not launchers.running() and self._relaunch_at is None:
                    codes.append(launchers.exit_codes())
                    break
                if now - started > self.timeout_s:
                    result.error = f"the run did not finish within {self.timeout_s:.0f}s"
                    break
                time.sleep(0.02)
        finally:
            for _, pid in self._pending_conts:
                _signal(pid, signal.SIGCONT)
            launchers.close()
            display.close()
            server.close()
            _remove_flash_images(job_id)
        tail.poll()
        self._note_in_rank_faults(tail)
        result.wall_s = time.monotonic() - started
        result.faults = sorted(self.events, key=lambda e: e.mono)
        final = {node: code for node, code in (codes[-1] if codes else {}).items() if node not in self._lost}
        result.completed = result.error is None and bool(final) and all(code == 0 for code in final.values())
        if not result.completed and result.error is None:
            result.error = f"launchers exited with {final}; see {self.out / 'launchers.out'}"
        (self.out / "faults.jsonl").write_text("".join(json.dumps(e.__dict__) + "\n" for e in result.faults))
        return result

    # -- faults -------------------------------------------------------------------------

    def _record(self, fault: Fault, tail: LedgerTail, pid: int | None, note: str = "",
                mono: float | None = None) -> None:
        when = time.monotonic() if mono is None else mono
        event = FaultEvent(fault.kind, fault.slot, fault.step, when, pid, tail.generation_before(when),
                           fault.label, note)
        self.events.append(event)
        self.log.info("fault_injected", **event.__dict__)

    def _note_in_rank_faults(self, tail: LedgerTail) -> None:
        """In-rank faults leave a marker file with the time they fired."""
        for fault in self.faults:
            if not fault.in_rank or any(e.label == (fault.label or fault.kind) and e.step == fault.step
                                         and e.slot == fault.slot for e in self.events):
                continue
            point = "at_boundary" if fault.kind == "kill-boundary" else "after_backward"
            marker = self.out / f"fault-{fault.label or fault.kind}-{fault.slot}-{point}-{fault.step}"
            if marker.exists() and marker.stat().st_size:
                fired = json.loads(marker.read_text())
                labelled = Fault(fault.kind, fault.slot, fault.step, fault.duration, fault.label or fault.kind)
                self._record(labelled, tail, fired["pid"], mono=fired["mono"])

    def _inject(self, fault: Fault, tail: LedgerTail, launchers: Launchers) -> None:
        kind = fault.kind
        if kind in ("kill", "early-restart"):
            pid = tail.pid_of_slot.get(fault.slot)
            self._record(fault, tail, pid)
            _signal(pid, signal.SIGKILL)
        elif kind == "kill-leader":
            slot = int(self.store.get("leader").decode().split(":")[1])
            pid = tail.pid_of_slot.get(slot)
            self._record(Fault(kind, slot, fault.step, label=fault.label), tail, pid)
            _signal(pid, signal.SIGKILL)
        elif kind == "hang":
            pid = tail.pid_of_slot.get(fault.slot)
            self._record(fault, tail, pid)
            _signal(pid, signal.SIGSTOP)
            if pid is not None:
                self._pending_conts.append((time.monotonic() + fault.duration, pid))
        elif kind == "preempt":
            self._record(fault, tail, None)
            launchers.terminate_all()
            self._relaunch_at = time.monotonic()  # as soon as every launcher has exited
        elif kind == "lose":
            node = launchers.node_of(fault.slot)
            self._record(fault, tail, node.process.pid if node.process else None, note=f"node {node.index}")
            launchers.kill(node)
            self._lost.add(node.index)
        elif kind == "replace":
            node = launchers.node_of(fault.slot)
            self._record(fault, tail, None, note=f"node {node.index}")
            launchers.start(node)
            self._lost.discard(node.index)

    def _resume_stopped(self, now: float) -> None:
        for due, pid in list(self._pending_conts):
            if now >= due:
                _signal(pid, signal.SIGCONT)
                self._pending_conts.remove((due, pid))


def _remove_flash_images(job_id: str) -> None:
    """Killed ranks leave their flash images in /dev/shm; this run's job id is never reused."""
    from training.checkpoint.flash import flash_dirs

    for directory in flash_dirs(job_id):
        shutil.rmtree(directory, ignore_errors=True)


def _signal(pid: int | None, signum: int) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
