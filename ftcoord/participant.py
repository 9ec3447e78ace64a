"""One process's membership in a job: its slot, incarnation and background threads."""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from ftcoord import jobs, keys
from ftcoord.address import StoreAddress
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.errors import FtcoordError
from ftcoord.generation import GenerationClient
from ftcoord.heartbeat import Heartbeat
from ftcoord.leader import LeaderDuty
from ftcoord.log import get_logger
from ftcoord.monitor import InterruptMonitor
from ftcoord.record import GenerationRecord
from ftcoord.slot_report import SlotReport
from ftcoord.slots import register, superseded
from ftcoord.store import connect, job_store
from ftcoord.watchdog import HelperWatch, exit_process


class Participant:
    """Connects to the store, takes an incarnation of a slot and runs four threads.

    Threads (each with its own store client, since a blocked `wait` holds a client):
    the heartbeat, the leader duty (elect, watch liveness, decide records), the
    interrupt monitor and the helper watch (ftcoord.watchdog: the process ends when one of the
    others died or this incarnation was superseded). The caller's thread joins generations and
    reads `interrupted`.
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
    ) -> None:
        """`progress_timeout`: None takes Timing.default_progress_timeout; math.inf never calls a member stuck.
        `on_helper_failure(reason)`: what to do when a helper thread died or this incarnation was
        superseded (ftcoord.watchdog); by default the process ends and its launcher replaces it."""
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
        self._on_helper_failure = on_helper_failure
        self._base: dist.TCPStore | None = None
        self._log = get_logger(component="participant", slot=slot)

    def start(self, on_wait: Callable[[BaseException], None] | None = None) -> Participant:
        """Connect, register and start the helper threads (`on_wait`: see `ftcoord.store.connect`)."""
        base = connect(self.address, deadline=self.timing.connect_timeout, on_wait=on_wait)
        self._base = base
        self.store = job_store(base, self.job_id)
        self.incarnation = register(self.store, self.slot)
        jobs.list_job(base, self.store, self.job_id)
        jobs.describe(self.store, self.timing)
        self._log = get_logger(component="participant", slot=self.slot, incarnation=self.incarnation)
        self.generations = GenerationClient(self.store, self.slot, self.incarnation, self.timing)
        self.report = SlotReport(self.slot)
        self.heartbeat = Heartbeat(self._clone(), self.slot, self.timing.heartbeat_interval, self.report)
        self.heartbeat.start()
        self.leader = LeaderDuty(self._clone(), self.slot, self.incarnation, self.timing,
                                 self.policy, self.progress_timeout)
        self.leader.start()
        self.monitor = InterruptMonitor(self._clone(), self.slot, self.incarnation)
        self.monitor.start()
        watch_store = self._clone()
        self.watch = HelperWatch(
            self.slot, self.timing.heartbeat_interval,
            {"heartbeat": lambda: self.heartbeat.failed, "leader duty": lambda: self.leader.failed,
             "interrupt monitor": lambda: self.monitor.failed},
            lambda: superseded(watch_store, self.slot, self.incarnation), self._on_helper_failure)
        self.watch.start()
        self._log.info("participant_started", job_id=self.job_id, store=str(self.address))
        return self

    def _clone(self) -> dist.PrefixStore:
        assert self._base is not None
        return job_store(self._base.clone(), self.job_id)

    def clone_store(self) -> dist.PrefixStore:
        """A new client for this job's keys (one per thread or per long-lived user)."""
        return self._clone()

    def join(self, step: int = -1) -> GenerationRecord:
        """Join the next generation that includes this process (see GenerationClient.join)."""
        record = self.generations.join(step)
        self.record = record
        self.monitor.watch(record.generation)
        return record

    @property
    def generation(self) -> int:
        return self.record.generation if self.record else 0

    @property
    def rank(self) -> int | None:
        return self.record.rank_of(self.slot, self.incarnation) if self.record else None

    @property
    def interrupted(self) -> bool:
        """Cheap local check: was the current generation interrupted?"""
        return self.monitor.fired

    def interrupt(self, reason: str) -> None:
        if self.record is not None:
            self.generations.interrupt(self.record.generation, reason)

    @property
    def should_stop(self) -> bool:
        """A stop (preemption) was requested anywhere in the job: finish the step and return."""
        return self.monitor.stop_requested.is_set()

    def finish(self) -> bool:
        """The function returned; True when every member did (the job is done or stopped)."""
        assert self.record is not None, "finish() before join()"
        return self.generations.finish(self.record, stopping=self.should_stop)

    def close(self, leaving: bool = True) -> None:
        """Stop the threads, hand leadership over and say this incarnation left on purpose."""
        self.watch.stop()
        self.monitor.stop()
        self.leader.stop(release=True)
        self.heartbeat.stop()
        if leaving:
            try:
                self.store.set(keys.left(self.slot), str(self.incarnation))
            except Exception:  # the store is gone: nothing to tell
                pass
        self._log.info("participant_closed")

    def __enter__(self) -> Participant:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
