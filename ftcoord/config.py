"""Timing and quorum settings of the coordination protocol, with their defaults and invariants in one place.

`Timing` says how fast faults are noticed and how long joiners are awaited; the intervals derived from its
fields (the leader's tick, probe grace, progress and store-operation timeouts) are properties of it, so they follow
the fields a job sets. `QuorumPolicy` says which world sizes a generation may have. Both check their invariants
when built and refuse a bad value with a ConfigError that names it. FENCE_POLL_S and FENCE_ANSWER_S say how often
launchers read fences and how long the leader waits for their answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ftcoord.errors import ConfigError

FENCE_POLL_S = 0.1
"""How often a launcher reads its slots' fences (ftcoord.launcher.fence_watch)."""
FENCE_ANSWER_S = 3 * FENCE_POLL_S
"""How long a fenced process's launcher may take to answer (a replacement on its way, or the process dead) before
the leader takes its node for lost and decides without it."""


@dataclass(frozen=True)
class Timing:
    """How fast ftcoord notices faults and how long it waits for joiners.

    Invariant (checked): heartbeat_interval < heartbeat_timeout < barrier_timeout and
    join_timeout < barrier_timeout. A heartbeat timeout below two intervals would call a
    process dead after one late beat, so that is refused too.
    """

    heartbeat_interval: float = 0.5
    """Seconds between two heartbeats of one process."""
    heartbeat_timeout: float = 5.0
    """Seconds: a process whose heartbeat counter did not change for this long is dead."""
    join_timeout: float = 3.0
    """Seconds: the last call, how long the leader waits for missing live slots before a partial quorum."""
    barrier_timeout: float = 120.0
    """Seconds: too few joiners after this long fails the generation with a clear error."""
    connect_timeout: float = 30.0
    """Seconds: the total deadline for reaching the store server (with backoff)."""
    store_timeout: float = 300.0
    """Seconds: how long a running process rides through a store that went away (reconnecting, training on) before
    it gives up: an emergency checkpoint and exit code 75 (ftcoord.store.link)."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(
                    f"{field.name}={value!r} must be a positive number of seconds"
                )
        if self.heartbeat_timeout < 2 * self.heartbeat_interval:
            raise ConfigError(
                f"heartbeat_timeout={self.heartbeat_timeout}s must be at least twice "
                f"heartbeat_interval={self.heartbeat_interval}s, or one late beat looks "
                f"like a death; raise heartbeat_timeout or lower heartbeat_interval"
            )
        if self.heartbeat_timeout >= self.barrier_timeout:
            raise ConfigError(
                f"heartbeat_timeout={self.heartbeat_timeout}s must be below "
                f"barrier_timeout={self.barrier_timeout}s, or a dead process is never "
                f"excluded before the generation fails; raise barrier_timeout"
            )
        if self.join_timeout >= self.barrier_timeout:
            raise ConfigError(
                f"join_timeout={self.join_timeout}s must be below "
                f"barrier_timeout={self.barrier_timeout}s; lower join_timeout"
            )

    @property
    def evidence_silence(self) -> float:
        """After a connection closed under a generation's collective: how long a member that has not
        rejoined may stay silent before it counts as gone (one late beat is not a death)."""
        return 1.5 * self.heartbeat_interval

    @property
    def probe_grace(self) -> float:
        """After a leader asked every live process to beat at once (a probe, ftcoord.protocol.evidence): how long
        a silent member of a generation with a closed connection has to answer before it counts as gone."""
        return min(0.25, self.evidence_silence)

    @property
    def default_progress_timeout(self) -> float:
        """A member whose training thread made no progress (no step, no ping) for this long while its
        heartbeat thread runs, and that is not waiting on its peers, is stuck: fenced and replaced (the
        culprit rule, ftcoord.leader.duty). 12 heartbeat timeouts: 60 s at the defaults. A step, a checkpoint
        save or a first compile that takes longer needs a larger `progress_timeout` (math.inf: never). A job whose
        collectives time out (gloo's pg_timeout) takes `progress_timeout_below` of it."""
        return 12 * self.heartbeat_timeout

    def progress_timeout_below(self, pg_timeout: float) -> float:
        """The default progress timeout of a job whose collectives time out: default_progress_timeout, and at most
        two thirds of `pg_timeout`.

        A member stuck in its step must be fenced as the culprit (its launcher kills it, its peers' collective fails
        at once: one generation change, its slot replaced) before gloo times its peers out; otherwise every peer
        raises, the stuck process is left out alive, and its slot stands empty until it is fenced as an outsider,
        another progress timeout later. The leader sees stillness up to a publish interval late
        (ftcoord.wrapper.participant.Participant._publish_every: a quarter of this timeout at most), and the fence
        takes a tick and the launcher's poll: all within the third left. Anything that takes longer than pg_timeout
        while its peers wait in a collective fails them anyway.

        Args:
            pg_timeout: the process group's collective timeout (gloo's), in seconds.
        """
        return min(self.default_progress_timeout, 2 * pg_timeout / 3)

    @property
    def store_op_timeout(self) -> float:
        """How long one store operation may go unanswered, with nothing else of the process answered either, before
        the store counts as away (a hung server hangs its clients past TCPStore's own timeouts; a slow one that
        answers others is waited for up to three times this: ftcoord.store.call_watch): two heartbeat timeouts, at least
        10 s."""
        return max(10.0, 2 * self.heartbeat_timeout)

    @property
    def watch_interval(self) -> float:
        """How often a deputy of the leader (ftcoord.leader.duty) reads the leader's heartbeat (the leader reads
        everyone's every tick): a third of the heartbeat timeout, so a silent leader is replaced within ~1.33
        timeouts while a deputy stays within 2 store requests per heartbeat interval in all (the read is a
        multi_get: two requests). More often while it joins a generation (ftcoord.leader.cadence)."""
        return max(self.tick, self.heartbeat_timeout / 3)

    @property
    def tick(self) -> float:
        """How often the leader re-reads liveness when nothing wakes it earlier."""
        return min(self.heartbeat_interval / 2, 0.25)


@dataclass(frozen=True)
class QuorumPolicy:
    """Which world sizes the leader may pick.

    global_batch, when given, admits only divisors of it: a DDP job with a constant
    global batch cannot run on a world size that does not divide it.
    """

    target_world_size: int
    """The world size the job is launched for and grows back to (>= 1)."""
    min_world_size: int = 1
    """The smallest world size a generation may run with (1 to target_world_size; default 1)."""
    max_world_size: int | None = None
    """The largest world size a generation may run with (>= target_world_size); None: target_world_size."""
    global_batch: int | None = None
    """The job's constant global batch, in samples: only its divisors are admitted; None: any size."""

    def __post_init__(self) -> None:
        if self.target_world_size < 1:
            raise ConfigError(f"target world size {self.target_world_size} must be >= 1")
        if not 1 <= self.min_world_size <= self.target_world_size:
            raise ConfigError(
                f"min_world_size={self.min_world_size} must be between 1 and the target "
                f"world size {self.target_world_size}"
            )
        if self.max_world_size is not None and self.max_world_size < self.target_world_size:
            raise ConfigError(
                f"max_world_size={self.max_world_size} is below the target world size "
                f"{self.target_world_size}; raise it or drop it"
            )
        if self.global_batch is not None:
            if self.global_batch < 1:
                raise ConfigError(f"global_batch={self.global_batch} must be >= 1")
            if not self.accepts(self.target_world_size):
                # Trimming to a size that fits is for faults, not for a bad launch.
                fits = [n for n in divisors(self.global_batch) if self.min_world_size <= n <= self.limit]
                raise ConfigError(
                    f"global_batch {self.global_batch} is not divisible by the job's world size "
                    f"{self.target_world_size}; launch a world size in {fits or divisors(self.global_batch)} "
                    f"(ftcoord-launch --nproc / --world-size) or change --global-batch"
                )

    @property
    def limit(self) -> int:
        """The largest world size the leader may pick."""
        return self.max_world_size if self.max_world_size is not None else self.target_world_size

    def accepts(self, world_size: int) -> bool:
        """Whether a generation of this size may run.

        Args:
            world_size: the number of members a generation would have.
        """
        if not self.min_world_size <= world_size <= self.limit:
            return False
        return self.global_batch is None or self.global_batch % world_size == 0


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending (for error messages that say what to pick)."""
    return [d for d in range(1, n + 1) if n % d == 0]
