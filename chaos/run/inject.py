"""Fault injection from inside a rank, at exact points of the training step.

Boundary-safe faults (the ECRL report's rule) are injected by the rank itself through the
training hook: `os._exit(137)` right after a step committed, or after backward and before
the optimizer step (mid-step). The plan comes from the environment as JSON, so the same
command line runs with or without faults; each fault fires once (a marker file says so).

    FTCOORD_FAULT_PLAN='[{"kind": "exit", "point": "at_boundary", "slot": 1, "step": 20}]'
    FTCOORD_FAULT_PLAN='[{"kind": "exit", "point": "at_boundary", "rank": 1, "step": 20}]'  (whoever holds rank 1)
    python -m training ... --hook chaos.run.inject:hook
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.run.planted import DOUBLE_STEP_AFTER_RESUME, checkpoint_write_fault, planted_bug
from ftcoord.log import get_logger
from training.hooks import StepContext

PLAN_ENV = "FTCOORD_FAULT_PLAN"
MARKER_DIR_ENV = "FTCOORD_FAULT_MARKERS"
POINTS = ("at_boundary", "after_backward", "mid_reduction")
KINDS = ("exit", "raise", "stall", "sleep", "sigterm")


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    """exit: os._exit(137); raise: an exception; stall: stop making progress; sleep: take `duration`
    seconds longer over this step (a slow rank, heartbeat alive); sigterm: preempt the job."""
    point: str
    step: int
    slot: int | None = None
    rank: int | None = None
    """Aim at whoever holds this rank at that step (instead of a slot)."""
    name: str = ""
    duration: float = 0.0

    def __post_init__(self) -> None:
        if (self.slot is None) == (self.rank is None):
            raise ValueError(f"planned fault {self}: give exactly one of slot and rank")

    def marker(self) -> Path:
        directory = Path(os.environ.get(MARKER_DIR_ENV, "/tmp"))
        return directory / marker_name(self.name or self.kind, self.slot, self.rank, self.point, self.step)

    def targets(self, ctx: StepContext) -> bool:
        return ctx.slot == self.slot if self.rank is None else ctx.rank == self.rank


class FaultHook:
    """A rank's planned faults, and what chaos.run.planted plants (a bug, a fault inside a checkpoint write)."""

    def __init__(self, plan: list[PlannedFault], bug: str | None = None) -> None:
        self.plan = plan
        self.bug = bug
        self._seen_generation: int | None = None
        """The last generation whose first optimizer step the planted bug saw."""
        if bug is not None:
            get_logger(component="chaos").warning("planted_bug_armed", bug=bug, pid=os.getpid())

    def _fire(self, point: str, ctx: StepContext) -> None:
        for fault in self.plan:
            if fault.point != point or fault.step != ctx.step or not fault.targets(ctx):
                continue
            try:
                fd = os.open(fault.marker(), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue  # fired already (this process is a replacement)
            os.write(fd, json.dumps({"mono": time.monotonic(), "ts": time.time(), "pid": os.getpid(), "slot": ctx.slot,
                                     "generation": ctx.generation, "rank": ctx.rank}).encode())
            os.close(fd)
            if fault.kind == "exit":
                os._exit(137)
            if fault.kind == "raise":
                raise RuntimeError(f"injected fault {fault.name or fault.kind} at step {ctx.step}")
            if fault.kind == "stall":
                time.sleep(3600)
            if fault.kind == "sleep":
                time.sleep(fault.duration)
            if fault.kind == "sigterm":
                os.kill(os.getppid(), signal.SIGTERM)  # the launcher: preempt the whole job

    def at_boundary(self, ctx: StepContext) -> None:
        self._fire("at_boundary", ctx)

    def after_backward(self, ctx: StepContext) -> None:
        self._fire("after_backward", ctx)

    def mid_reduction(self, ctx: StepContext) -> None:
        self._fire("mid_reduction", ctx)

    def after_optimizer_step(self, ctx: StepContext) -> None:
        if self.bug != DOUBLE_STEP_AFTER_RESUME or ctx.generation == self._seen_generation:
            return
        self._seen_generation = ctx.generation  # the first step of this generation: ctx.step is its start step
        if ctx.step > 0:
            ctx.optimizer.step()

    def checkpoint_half_written(self, step: int) -> None:
        checkpoint_write_fault(step)


def marker_name(name: str, slot: int | None, rank: int | None, point: str, step: int) -> str:
    """The file a fault leaves when it fires (it fires once: a replacement finds it)."""
    target = f"r{rank}" if rank is not None else str(slot)
    return f"fault-{name}-{target}-{point}-{step}"


def parse_plan(text: str) -> list[PlannedFault]:
    raw: list[dict[str, Any]] = json.loads(text) if text else []
    return [PlannedFault(**item) for item in raw]


def hook(config: object) -> FaultHook:
    """Factory for `--hook chaos.run.inject:hook` (`config`: the training configuration, or None in a checkpoint
    writer process; not used)."""
    return FaultHook(parse_plan(os.environ.get(PLAN_ENV, "")), planted_bug())
