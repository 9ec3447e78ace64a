"""What one process tells an operator about itself, and what each generation change cost.

The training thread only writes local fields (`committed`, `joined`, `left`, `checkpoint_stall`): no store
operation is added to the step path. The heartbeat thread publishes them at its next beat
(ftcoord.liveness.heartbeat): the slot's status as one JSON value under `slot/<s>/status`, and each `Incident` as
one JSON line appended to the job's `incidents` list, also logged as one `generation_changed` event. An incident is
measured by one process only, on its own monotonic clock (no cross-host time): the new generation's heal source, if
it was training when the fault came. A change with no survivor to measure it (every process died, a cold start from
a checkpoint) has no incident. `ftcoord status`, the launcher's metrics (`ftcoord_recovery_seconds` observes
`stall_s`) and the chaos report read these same numbers.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

STALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Upper bounds (seconds) of the histograms of stalls: checkpoints and recoveries alike."""

_RATE_WINDOW = 32  # commits the steps/s are measured over


@dataclass(frozen=True)
class Incident:
    """One generation change as its witness measured it: from its last committed step before the fault to its first
    committed step after it."""

    generation: int
    """The generation the job changed to."""
    previous: int
    """The generation the witness left."""
    cause: str
    """Why the job left the previous generation: the root cause its leader named (GenerationRecord.cause), else the
    witness's own view of it."""
    witness: int
    """The slot that measured it."""
    world_size: int
    """The new generation's world size."""
    detect_s: float
    """Seconds from the witness's last commit until it left the generation: the fault came in between, so this
    bounds detection from above."""
    stall_s: float
    """Seconds from that last commit until its first commit in the new generation (detection, the decision, the
    rendezvous, the heal and one step)."""
    lost_steps: int
    """Steps it had committed that the new generation trains again."""
    step_s: float | None
    """The witness's median step time before the fault (None: it had committed fewer than two steps)."""
    cost_s: float
    """Seconds of training the fault took away: the stall beyond one ordinary step, plus the lost steps."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Incident:
        return cls(**json.loads(text))


@dataclass
class StallCounts:
    """A cumulative histogram of stalls (bucket counts parallel to STALL_BUCKETS, then +Inf)."""

    count: int = 0
    total: float = 0.0
    buckets: tuple[int, ...] = (0,) * (len(STALL_BUCKETS) + 1)

    def observe(self, seconds: float) -> None:
        index = next((i for i, bound in enumerate(STALL_BUCKETS) if seconds <= bound), len(STALL_BUCKETS))
        self.buckets = tuple(n + (i >= index) for i, n in enumerate(self.buckets))
        self.count += 1
        self.total += seconds

    def add(self, other: StallCounts) -> StallCounts:
        return StallCounts(self.count + other.count, self.total + other.total,
                           tuple(a + b for a, b in zip(self.buckets, other.buckets, strict=True)))


class SlotReport:
    """One process's status and incidents, written by its training thread, read by its heartbeat thread."""

    def __init__(self, slot: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.slot = slot
        self._clock = clock
        self._lock = threading.Lock()
        self.generation = 0
        self.rank: int | None = None
        self.step = -1
        self.in_process_restarts = 0
        self.checkpoint_stalls = StallCounts()
        self.still_at: str | None = None
        """Where the training thread stands still, once ftcoord.liveness.still_stack logged it (heartbeat thread
        only)."""
        self._commits: deque[tuple[float, int]] = deque(maxlen=_RATE_WINDOW)
        """(time, step) of this generation's recent commits."""
        self._last_commit: tuple[float, int] | None = None
        """(time, step) of the newest commit of any generation."""
        self._last_step_s: float | None = None
        """The median step time of the newest commit's generation, as it stood at that commit: computed when the
        generation is left (`joined`), not at every commit (a median of the window per step, in every rank)."""
        self._left: tuple[float, int, str] | None = None
        """(time, generation, cause) of leaving the last generation."""
        self._pending: tuple[float, int, float | None, float, int, str, int, int] | None = None
        self._incidents: list[Incident] = []

    # -- the training thread (local only) ---------------------------------------------------

    def joined(self, generation: int, rank: int | None, heal_source: int | None, start_step: int,
               world_size: int, cause: str | None = None) -> None:
        """A new generation: this process is its witness when it is the heal source and was training. `cause`: the
        change's root cause as its leader found it (else the incident keeps the witness's own view of it)."""
        with self._lock:
            self.generation, self.rank = generation, rank
            if self._commits:  # the newest commit is this window's last: its step time is the window's
                self._last_step_s = self._step_time()
            self._commits.clear()
            self._pending = None
            if rank is not None and rank == heal_source and self._last_commit is not None and self._left:
                (committed_at, step), step_s = self._last_commit, self._last_step_s
                left_at, previous, seen = self._left
                cause = cause or seen
                self._pending = (committed_at, step, step_s, left_at, previous, cause, start_step, world_size)

    def left(self, cause: str, restarts: int) -> None:
        """This process left its generation (interrupted, failed, or a peer did)."""
        with self._lock:
            self._left = (self._clock(), self.generation, cause)
            self.in_process_restarts = restarts

    def committed(self, step: int) -> None:
        """A step was committed (`CallWrapper.ping`); repeated pings of one step count once."""
        if step == self.step and self._commits:
            return
        now = self._clock()
        with self._lock:
            self.step = step
            self._commits.append((now, step))
            self._last_commit = (now, step)
            if self._pending is not None and step > self._pending[6]:
                self._incidents.append(self._incident(now, *self._pending))
                self._pending = None

    def checkpoint_stall(self, seconds: float) -> None:
        """The training thread stood still this long for a checkpoint (`CallWrapper.checkpoint_stall`)."""
        with self._lock:
            self.checkpoint_stalls.observe(seconds)

    # -- the heartbeat thread ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            status = {"generation": self.generation, "rank": self.rank, "step": self.step,
                      "steps_per_s": self._rate(), "in_process_restarts": self.in_process_restarts,
                      "checkpoint_stalls": asdict(self.checkpoint_stalls)}
        if self.still_at is not None:  # only then: every slot's status is written to the store
            status["still_at"] = self.still_at
        return status

    def step_in_generation(self) -> int:
        """The last step committed in this generation (-1: none yet): what the leader compares still members by
        (ftcoord.leader.judge); a step from before the generation's heal says nothing about where it is now."""
        with self._lock:
            return self._commits[-1][1] if self._commits else -1

    def take_incidents(self) -> list[Incident]:
        if not self._incidents:  # asked at every beat, seldom with one: one being added now is taken at the next beat
            return []
        with self._lock:
            taken, self._incidents = self._incidents, []
            return taken

    # -- arithmetic -------------------------------------------------------------------------

    def _step_time(self) -> float | None:
        times = [b[0] - a[0] for a, b in zip(self._commits, list(self._commits)[1:], strict=False) if b[1] == a[1] + 1]
        return statistics.median(times) if times else None

    def _rate(self) -> float:
        if len(self._commits) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._commits[0], self._commits[-1]
        return round((s1 - s0) / (t1 - t0), 3) if t1 > t0 else 0.0

    def _incident(self, now: float, committed_at: float, step: int, step_s: float | None, left_at: float,
                  previous: int, cause: str, start_step: int, world_size: int) -> Incident:
        stall = now - committed_at
        lost = max(0, step - start_step)
        per_step = step_s or 0.0
        return Incident(generation=self.generation, previous=previous, cause=cause, witness=self.slot,
                        world_size=world_size, detect_s=round(max(0.0, left_at - committed_at), 4),
                        stall_s=round(stall, 4), lost_steps=lost,
                        step_s=None if step_s is None else round(step_s, 4),
                        cost_s=round(max(0.0, stall - per_step) + lost * per_step, 4))
