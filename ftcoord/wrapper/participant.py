"""`Participant`: one process's membership in a job: its slot, incarnation and background threads.

It connects to the store, registers a new incarnation of its slot and runs the heartbeat, the leader duty, the
interrupt monitor and the helper watch; the caller's thread joins generations through it. Every store client comes
from one StoreLink, so the process rides through a store that goes away, and writes back what it holds when the
store comes back empty.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from ftcoord import env
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.errors import FtcoordError
from ftcoord.leader.duty import LeaderDuty
from ftcoord.leader.forgetter import Forgetter
from ftcoord.liveness.heartbeat import Heartbeat
from ftcoord.liveness.helper_watch import HelperWatch, exit_process
from ftcoord.liveness.interrupt_watch import InterruptWatch
from ftcoord.liveness.still_stack import StillStack
from ftcoord.log import get_logger
from ftcoord.protocol import evidence, jobs, keys, restore, tally
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slot_report import SlotReport
from ftcoord.protocol.slots import register, superseded_by
from ftcoord.store.address import StoreAddress
from ftcoord.store.link import LinkedStore, StoreLink, instance_from_env
from ftcoord.wrapper.generation_client import GenerationClient


@dataclass
class Arrival:
    """This process at its generation's rendezvous (ftcoord.wrapper.call): its rank there, and whether it saw every
    member arrive; what it writes back when the store restarts meanwhile."""

    generation: int
    rank: int
    world_size: int
    met: bool = False


class Participant:
    """Connects to the store, takes an incarnation of a slot and runs four threads.

    Threads (the first three with their own store client, since a blocked `wait` holds a client):
    the heartbeat, the leader duty (elect, watch liveness, decide records), the
    interrupt monitor and the helper watch (ftcoord.liveness.helper_watch: the process ends when one of the
    others died or this incarnation was superseded; it reads nothing from the store). The caller's
    thread joins generations and reads `interrupted`.

    Store load does not grow with the job's size, except the leader's: a process beats every interval,
    reads the leader's heartbeat every watch_interval (a hot spare leaves that to the generation's deputies:
    ftcoord.leader.cadence), waits for records in slices of up to two heartbeat timeouts
    (ftcoord.wrapper.generation_client) and publishes progress and status at most every 10 intervals; only
    the leader reads every slot, every tick.

    Connections to the store: the caller's thread's and the first three threads' (ftcoord.wrapper.decorator
    adds one for its process groups); the one that lists the job in the store's index is closed once it did,
    so the store holds about 5 descriptors per rank (its open-file limit bounds a job's size).

    Every client comes from one StoreLink (ftcoord.store.link): they ride through a store that goes away
    and comes back; when it comes back empty, this process writes back what it holds (`_rebuild`).

    Args:
        store: the store server, as a StoreAddress or "HOST:PORT".
        job_id: the job; its keys live under `ftcoord/<job_id>/`.
        slot: this process's slot (>= 0; FtcoordError otherwise).
        policy: the world sizes the leader may pick (ftcoord.config.QuorumPolicy), used while this
            process leads.
        timing: heartbeat, join, barrier, connect and store timings. None: `Timing()`'s defaults.
        progress_timeout: seconds a member's training thread may go without a ping, while not waiting on
            its peers, before the leader fences it as stuck. None: Timing.default_progress_timeout
            (12 heartbeat timeouts); math.inf never calls a member stuck.
        on_helper_failure: called with a reason when a helper thread died or this incarnation was
            superseded (ftcoord.liveness.helper_watch). Default: `exit_process`, which ends the
            process so that its launcher replaces it.
        launched: whether a launcher carries out this process's fences, so that a fenced process exits
            rather than taking part again (GenerationClient.raise_if_superseded). None: whether
            ftcoord-launch started it ($FTCOORD_LAUNCHER_PID is set).
    """

    def __init__(
        self,
        store: StoreAddress | str,
        job_id: str,
        slot: int,
        policy: QuorumPolicy,
        timing: Timing | None = None,
        progress_timeout: float | None = None,
        on_helper_failure: Callable[[str], None] = exit_process,
        launched: bool | None = None,
    ) -> None:
        if slot < 0:
            raise FtcoordError(f"slot {slot} must be >= 0")
        self.address = StoreAddress.parse(store) if isinstance(store, str) else store
        self.job_id = job_id
        self.slot = slot
        self.policy = policy
        self.timing = timing or Timing()
        self.progress_timeout = self.timing.default_progress_timeout if progress_timeout is None else progress_timeout
        self.incarnation = 0
        self.record: GenerationRecord | None = None
        self.arrival: Arrival | None = None
        """This process at its generation's rendezvous (set there); what a restarted store is told again."""
        self._published: tuple[int, list[str]] | None = None
        self._on_helper_failure = on_helper_failure
        self.launched = env.launched() if launched is None else launched
        self.link: StoreLink | None = None
        self._log = get_logger(component="participant", slot=slot)

    def start(self, on_wait: Callable[[BaseException], None] | None = None) -> Participant:
        """Connect, register a new incarnation of the slot and start the helper threads.

        Args:
            on_wait: called once, with the error, when the first connection attempt fails (the caller
                says what it waits for; see `ftcoord.store.client.connect`); None: nothing is called.

        Returns:
            This participant, started.

        Raises:
            StoreUnavailable: no store answered within connect_timeout.
        """
        self.link = StoreLink(self.address, self.job_id, connect_timeout=self.timing.connect_timeout,
                              store_timeout=self.timing.store_timeout, op_timeout=self.timing.store_op_timeout,
                              known=instance_from_env(), may_start_job=True, on_wait=on_wait)
        self.store = self.link.connect()
        base = self.link.client(prefixed=False)
        self.incarnation = register(self.store, self.slot)
        self.link.on_new_instance(self._rebuild)  # before anything else: a restart from here on is told all we hold
        jobs.list_job(base, self.store, self.job_id)
        base.close()  # one connection fewer per process for the rest of its life (the store's descriptors, at scale)
        jobs.describe(self.store, self.timing)
        self._log = get_logger(component="participant", slot=self.slot, incarnation=self.incarnation)
        self.generations = GenerationClient(self.store, self.slot, self.incarnation, self.timing,
                                            on_waiting_after=lambda record: self.leader.note_record(record),
                                            on_announced=lambda generation: self.monitor.announced(generation),
                                            fence_ends_it=self.launched)
        self.report = SlotReport(self.slot)
        # The helper watch reads nothing itself: the leader duty reads this slot's newest incarnation every round,
        # and each helper tells it when that, or its own failure, is news (it looks every heartbeat_timeout too).
        self.watch = HelperWatch(
            self.slot, self.timing.heartbeat_timeout,
            {"heartbeat": lambda: self.heartbeat.failed, "leader duty": lambda: self.leader.failed,
             "interrupt monitor": lambda: self.monitor.failed},
            lambda: superseded_by(self.slot, self.incarnation, self.leader.newest_incarnation),
            self._on_helper_failure)
        self.heartbeat = Heartbeat(self._clone(), self.slot, self.timing.heartbeat_interval, self.report,
                                   publish_every=self._publish_every(),
                                   before_beat=lambda store: self.monitor.carry_local_stop(store),
                                   tell_watch=self.watch.nudge,
                                   still_stack=StillStack.for_progress_timeout(self.progress_timeout, self._log))
        self.monitor = InterruptWatch(self._clone(), self.slot, self.incarnation,
                                        slice_s=2 * self.timing.heartbeat_timeout, on_beat=self.heartbeat.beat_now,
                                        tell_watch=self.watch.nudge)
        self.heartbeat.start()
        self.forgetter = Forgetter(self._clone, f"ftcoord-forget-{self.slot}", self._log)  # a thread once it leads
        self.leader = LeaderDuty(self._clone(), self.slot, self.incarnation, self.timing,
                                 self.policy, self.progress_timeout, tell_watch=self.watch.nudge,
                                 forgetter=self.forgetter)
        self.leader.start()
        self.monitor.start()
        self.watch.start()
        self._log.info("participant_started", job_id=self.job_id, store=str(self.address),
                       store_instance=str(self.link.instance))
        return self

    def _publish_every(self) -> float:
        """How stale published progress and status may be: 10 heartbeat intervals, and a quarter of the progress
        timeout at most (the leader judges a member stuck when its progress stood still that long)."""
        every = 10 * self.timing.heartbeat_interval
        if math.isfinite(self.progress_timeout):
            every = min(every, self.progress_timeout / 4)
        return max(every, self.timing.heartbeat_interval)

    def _rebuild(self, store: dist.Store, base: dist.Store) -> None:
        """The store came back empty: write back what this process holds (see ftcoord.protocol.restore): also
        while `start` is still making its helpers (those not made yet hold nothing)."""
        restore.slot(store, self.slot, self.incarnation)
        record = self.record
        if record is not None:
            restore.record(store, record, self.monitor.reason if self.monitor.fired else None)
            self._rebuild_group(store, record.generation)
        jobs.list_job(base, store, self.job_id)
        jobs.describe(store, self.timing)
        if hasattr(self, "generations"):
            self.generations.rebuild(store)
        if hasattr(self, "leader"):
            self.leader.rebuild(store, record)
        if hasattr(self, "heartbeat"):
            self.heartbeat.rebuild()
        self._log.info("store_rebuilt", generation=record.generation if record else None)

    def _rebuild_group(self, store: dist.Store, generation: int) -> None:
        """This member's part of its generation's group: its arrival at the rendezvous (every member saw them all,
        or it arrives again), and the published ends of its connections, so a peer's death after the restart is
        named by its peers' evidence as fast as before it (ftcoord.protocol.evidence)."""
        arrival = self.arrival
        if arrival is not None and arrival.generation == generation:
            if arrival.met:
                store.set(keys.all_arrived(generation), "1")
            else:
                tally.arrive(store, generation, arrival.rank, arrival.world_size)
        published = self._published
        if published is not None and published[0] == generation:
            evidence.publish_addresses(store, generation, self.slot, published[1])

    def publish_addresses(self, generation: int, addresses: list[str]) -> None:
        """Publish this member's ends of its group's connections, and again whenever the store restarts.

        See ftcoord.protocol.evidence.publish_addresses.

        Args:
            generation: the generation whose group formed.
            addresses: this member's "host:port" ends of the group's connections.
        """
        self._published = (generation, addresses)
        evidence.publish_addresses(self.store, generation, self.slot, addresses)

    def _clone(self) -> LinkedStore:
        assert self.link is not None
        return self.link.client()

    @property
    def store_lost(self) -> BaseException | None:
        """The store stayed away past store_timeout (the process writes its emergency checkpoint and exits)."""
        return self.link.lost if self.link is not None else None

    @property
    def store_away(self) -> bool:
        """The store is away right now (reconnecting, within store_timeout)."""
        return self.link is not None and (self.link.down or self.link.lost is not None)

    def clone_store(self) -> LinkedStore:
        """A new client for this job's keys (one per thread or per long-lived user)."""
        return self._clone()

    def join(self, step: int = -1) -> GenerationRecord:
        """Join the next generation that includes this process (see GenerationClient.join).

        Args:
            step: the last step this process committed, announced to the leader (the record's start step
                is the highest among its members); -1: none.

        Returns:
            The record of the generation joined.

        Raises:
            JobFinished: the job completed while this process waited (a hot spare's normal end).
            QuorumTimeout: too few processes joined within barrier_timeout.
            Superseded: a newer incarnation of this slot registered, or the leader fenced this one.
        """
        rejoining = self.record if self.monitor.fired and self.monitor.reason not in (None, "superseded") else None
        self.heartbeat.joining()
        try:
            with self.leader.hurried():
                record = self.generations.join(step, after=rejoining)
        finally:
            self.heartbeat.joined()
        self.record = record
        self.leader.note_record(record)
        self.monitor.watch(record.generation, stopping=record.stop)
        return record

    @property
    def generation(self) -> int:
        """The generation this process last joined; 0 before its first."""
        return self.record.generation if self.record else 0

    @property
    def rank(self) -> int | None:
        """This process's rank in the generation it last joined; None before its first."""
        return self.record.rank_of(self.slot, self.incarnation) if self.record else None

    @property
    def interrupted(self) -> bool:
        """Cheap local check: was the current generation interrupted?"""
        return self.monitor.fired

    def interrupt(self, reason: str) -> str | None:
        """End the current generation for every member (the first reason written wins).

        Args:
            reason: why, in a short non-empty form such as "exception:slot=3:RuntimeError"; members and
                `ftcoord status` read it.

        Returns:
            The reason that ended the generation (this one, or one written earlier); None when this process
            has not joined a generation yet.
        """
        return self.generations.interrupt(self.record.generation, reason) if self.record is not None else None

    @property
    def should_stop(self) -> bool:
        """A stop (preemption) was requested anywhere in the job, or the store is lost for good: finish the
        step and return."""
        return self.monitor.stop_requested.is_set() or self.store_lost is not None

    def finish(self) -> bool:
        """The function returned; True when every member did (the job is done or stopped)."""
        assert self.record is not None, "finish() before join()"
        with self.leader.hurried():
            return self.generations.finish(self.record, stopping=self.should_stop)

    def close(self, leaving: bool = True) -> None:
        """Stop the threads, hand leadership over and say this incarnation left on purpose.

        A store that is away right now is not waited for: nothing is written to it then.

        Args:
            leaving: write this incarnation's `left` key (it ended on purpose, not by a fault); False for
                a superseded process, which must write nothing.
        """
        self.watch.stop()
        self.monitor.stop()
        # A store that is away right now is not waited for (up to store_timeout) just to say goodbye.
        reachable = self.link is None or not (self.link.down or self.link.lost or self.link.stale)
        self.leader.stop(release=reachable)
        self.forgetter.stop(wait_s=2.0 if reachable else 0.0)  # what it was handed, deleted if the store answers
        self.heartbeat.stop()
        if leaving and reachable:
            try:
                self.store.set(keys.left(self.slot), str(self.incarnation))
            except Exception:  # the store is gone: nothing to tell
                pass
        if self.link is not None:
            self.link.close()
        self._log.info("participant_closed")

    def __enter__(self) -> Participant:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
