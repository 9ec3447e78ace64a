"""A job as an operator sees it: `ftcoord status` and the launcher's metrics read it from the store.

Reading only: an observer writes nothing, and the job's processes publish what it shows from their
heartbeat threads (ftcoord.protocol.slot_report, ftcoord.protocol.launcher_report), never from the training step.

Heartbeat ages are this observer's own: how long it watched a slot's counter without seeing it change,
on its monotonic clock (as a leader judges liveness, ftcoord.liveness.heartbeat). A one-shot read therefore
watches for a moment first (two heartbeat intervals, at most 3 s); a slot whose counter never moved
in that window shows its age as "at least" the window.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.distributed as dist

from ftcoord.liveness.heartbeat import LivenessObserver
from ftcoord.protocol import jobs, keys
from ftcoord.protocol.generations import LeaderClaim, is_end, last_generation, parse_record, read_record
from ftcoord.protocol.slot_report import Incident
from ftcoord.protocol.slots import registered_slots
from ftcoord.store.client import get_if_present, get_or_none
from ftcoord.store.link import bounded_multi_get

RECENT_GENERATIONS = 4  # the leader forgets older ones (ftcoord.leader.duty)
SHOWN_INCIDENTS = 10


@dataclass
class SlotView:
    """One slot of a job as an observer sees it (`ftcoord status`, the launcher's metrics)."""

    slot: int
    """The slot number."""
    incarnation: int
    """The slot's newest incarnation: how many processes registered for it so far."""
    state: str
    """"rank R", "spare", "joining", "stale", "fenced", "dead", "left", "replacing" or "finished"."""
    heartbeat_age_s: float
    """Seconds this observer has seen the slot's heartbeat counter unchanged, on its own monotonic clock."""
    heartbeat_age_at_least: bool
    """The counter never moved while this observer watched: the age is a lower bound."""
    waiting_on_peers: bool = False
    """The training thread stands still waiting on its peers (in a collective), as its heartbeat published."""
    generation: int | None = None
    """The generation the slot's process last joined, as it published; None before it published a status."""
    rank: int | None = None
    """Its rank in that generation (None: not a member, or no status yet)."""
    step: int | None = None
    """The last step it committed (-1: none yet; None: no status yet)."""
    steps_per_s: float | None = None
    """Its recent rate of committed steps per second, as it published it."""
    process_restarts: int = 0
    """How many processes the slot had before the current one (incarnation - 1)."""
    restarts_by_kind: dict[str, int] = field(default_factory=dict)
    """The launcher's count of the slot's restarts by what ended the process before
    (ftcoord.protocol.launcher_report.RESTART_KINDS); empty when no launcher reports the slot."""
    in_process_restarts: int | None = None
    """How many times its current process restarted the function in-process; None: no status yet."""
    checkpoint_stalls: dict[str, Any] | None = None
    """The process's checkpoint stalls: count, total and cumulative bucket counts (ftcoord.protocol.slot_report)."""
    fence: str | None = None
    """The last fence of the slot, "term:incarnation" ("0": never fenced)."""
    host: str | None = None
    """The host name of the slot's launcher; None when no launcher reports the slot."""
    pid: int | None = None
    """The pid of the slot's current process, as its launcher published it."""
    standby: str | None = None
    """The launcher's warm standby: "off", "warming", "ready" or "none" (ftcoord.protocol.launcher_report)."""
    still_at: str | None = None
    """Where the slot's training thread stands still, not waiting on its peers (ftcoord.liveness.still_stack)."""


@dataclass
class JobView:
    """One job as an observer sees it, read by `JobReader.read`."""

    job: str
    """The job id."""
    generation: int
    """The newest generation decided; 0 before the first."""
    world_size: int
    """Members of that generation (0: none yet)."""
    target_world_size: int | None
    """The world size the job asks for; None before the first generation."""
    members: list[int]
    """The generation's member slots, in rank order."""
    spares: list[int]
    """The hot spare slots the generation left out."""
    start_step: int | None
    """The highest step its members announced when it was decided; None before the first generation."""
    leader: dict[str, int | None] | None
    """The current leader's claim ("term", "slot", "incarnation"); None when no process claims to lead."""
    record_leader: dict[str, int] | None
    """Who decided the current record, in which term."""
    state: str
    """"running", "done", "failed: ...", "stopped" or "starting"."""
    slots: list[SlotView]
    """Every slot that ever registered in the job, ascending."""
    recent: list[dict[str, Any]]
    """The newest generations (newest first): generation, world size, members, why it was interrupted."""
    incidents: list[dict[str, Any]]
    """The newest SHOWN_INCIDENTS incidents, oldest first (fields of ftcoord.protocol.slot_report.Incident)."""
    incident_count: int
    """How many incidents the job had in all."""
    lost_s: float
    """What every incident cost, together (ftcoord.protocol.slot_report)."""
    effective_ratio: float | None
    """Time in committed steps / wall time since the first commit: 1 - lost_s / elapsed."""
    step: int | None
    """The newest step a member of the generation committed; None when none published one."""
    steps_per_s: float | None
    """The slowest member's rate of committed steps per second (the job runs at it); None when none published."""
    interval_s: float
    """The job's heartbeat interval in seconds, as its processes describe the job (Timing's default until then)."""
    timeout_s: float
    """The job's heartbeat timeout in seconds, likewise."""

    def to_json(self) -> str:
        """The view as one indented JSON object with sorted keys (what `ftcoord status --json` prints)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)


class JobReader:
    """Reads one job again and again; keeps the heartbeat observations between reads.

    Args:
        store: a client scoped to the job's keys (`ftcoord.store.client.job_store`); only read, never written.
        job: the job id, as the view names it.
        clock: the monotonic clock heartbeat ages are measured on (seconds).
    """

    def __init__(self, store: dist.Store, job: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.job = job
        self._clock = clock
        self.incidents: list[Incident] = []
        """Every incident of the job, as of the last read (the view shows the newest)."""
        self._timed = False
        self.interval, self.timeout = 0.5, 5.0  # ftcoord.config.Timing's defaults, until the job says
        self._observer = LivenessObserver(self.timeout, clock)
        self._read_timing()

    def _read_timing(self) -> None:
        """The job's heartbeat timing, once its first process has said (a launcher lists the job before)."""
        info = jobs.info(self.store)
        if "heartbeat_interval" in info:
            self.interval, self.timeout = float(info["heartbeat_interval"]), float(info["heartbeat_timeout"])
            self._observer.timeout = self.timeout
            self._timed = True

    def watch(self, seconds: float, poll: float = 0.05) -> None:
        """Observe every slot's heartbeat for a while, sampling over and over.

        Args:
            seconds: how long to watch, on the reader's clock.
            poll: seconds between two samples.
        """
        deadline = self._clock() + seconds
        while True:
            self.sample()
            if self._clock() >= deadline:
                return
            time.sleep(poll)

    def window(self) -> float:
        """How long a one-shot read watches: long enough for every live slot to beat twice."""
        return min(2 * self.interval + 0.1, 3.0)

    def sample(self) -> None:
        """Read every registered slot's heartbeat counter once and note whether it moved (one bounded multi_get)."""
        slots = registered_slots(self.store)
        if slots:
            names = [keys.heartbeat(s) for s in slots]
            for name, beat in zip(names, bounded_multi_get(self.store, names), strict=True):
                self._observer.observe(name, beat)

    def read(self) -> JobView:
        """The job as it is now, with heartbeat ages as observed so far (this read samples once more).

        Also refreshes `incidents`. A one-shot observer calls `watch(window())` first, so that live slots show a
        fresh age.
        """
        if not self._timed:
            self._read_timing()
        self.sample()
        store = self.store
        generation = last_generation(store)
        record = read_record(store, generation) if generation else None
        claim_raw = get_or_none(store, keys.LEADER)
        claim = LeaderClaim.parse(claim_raw) if claim_raw else None
        slots = [self._slot(s, record) for s in registered_slots(store)]
        incidents = self.incidents = _incidents(store)
        lost = round(sum(i.cost_s for i in incidents), 3)
        first = jobs.info(store).get("first_commit_unix")
        elapsed = time.time() - first if first else 0.0
        members = [v for v in slots if v.state.startswith("rank")]
        steps = [v.step for v in members if v.step is not None]
        rates = [v.steps_per_s for v in members if v.steps_per_s]
        return JobView(
            job=self.job, generation=generation,
            world_size=record.world_size if record else 0,
            target_world_size=record.target_world_size if record else None,
            members=list(record.members) if record else [], spares=list(record.spares) if record else [],
            start_step=record.start_step if record else None,
            leader=None if claim is None else {"term": claim.term, "slot": claim.slot,
                                               "incarnation": claim.incarnation},
            record_leader=None if record is None else {"slot": record.leader, "term": record.leader_term},
            state=_job_state(store, record), slots=slots, recent=_recent(store, generation),
            incidents=[asdict(i) for i in incidents[-SHOWN_INCIDENTS:]], incident_count=len(incidents),
            lost_s=lost, effective_ratio=round(max(0.0, 1 - lost / elapsed), 4) if elapsed > 1.0 else None,
            step=max(steps) if steps else None, steps_per_s=min(rates) if rates else None,
            interval_s=self.interval, timeout_s=self.timeout,
        )

    def _slot(self, slot: int, record: Any) -> SlotView:
        store = self.store
        incarnation = int(get_or_none(store, keys.incarnation(slot)) or 0)
        name = keys.heartbeat(slot)
        age = self._observer.silent_for(name)
        view = SlotView(slot, incarnation, state="joining", heartbeat_age_s=round(age, 3),
                        heartbeat_age_at_least=self._observer.never_changed(name),
                        process_restarts=max(0, incarnation - 1))
        progress = (get_or_none(store, keys.progress(slot)) or b"").decode()
        view.waiting_on_peers = progress.endswith(":w")
        status = get_or_none(store, keys.status(slot))
        if status:
            published = json.loads(status)
            view.generation, view.rank, view.step = published["generation"], published["rank"], published["step"]
            view.steps_per_s, view.in_process_restarts = published["steps_per_s"], published["in_process_restarts"]
            view.checkpoint_stalls = published["checkpoint_stalls"]
            view.still_at = published.get("still_at")
        launcher = get_or_none(store, keys.launcher(slot))
        if launcher:
            published = json.loads(launcher)
            view.host, view.pid, view.standby = published["host"], published["pid"], published["standby"]
            view.restarts_by_kind = published["restarts"]
        fence = get_or_none(store, keys.fence(slot))
        view.fence = fence.decode() if fence else None
        view.state = self._state(slot, incarnation, record, view)
        return view

    def _state(self, slot: int, incarnation: int, record: Any, view: SlotView) -> str:
        store = self.store
        rank = record.rank_of(slot, incarnation) if record else None
        fenced = int((view.fence or "0").rpartition(":")[2] or 0) >= incarnation > 0
        if int(get_or_none(store, keys.dead(slot)) or 0) >= incarnation or fenced:
            replacing = (get_or_none(store, keys.replacing(slot)) or b"0:0").decode().partition(":")[0]
            if int(replacing or 0) > incarnation:
                return "replacing"
            return "fenced" if fenced else "dead"
        if (get_or_none(store, keys.left(slot)) or b"").decode() == str(incarnation):
            return "finished"
        if self._observer.is_stale(keys.heartbeat(slot)):
            return "stale"
        if rank is not None:
            return f"rank {rank}"
        if record is not None and slot in record.spares:
            return "spare"
        return "joining"


def _job_state(store: dist.Store, record: Any) -> str:
    fatal = get_or_none(store, keys.FATAL)
    if fatal:
        return f"failed: {fatal.decode()}"
    if get_or_none(store, keys.DONE) is not None:
        return "done"
    if get_or_none(store, keys.STOPPED) is not None:
        return "stopped"
    return "running" if record is not None else "starting"


def _recent(store: dist.Store, generation: int) -> list[dict[str, Any]]:
    recent = []
    for g in range(generation, max(0, generation - RECENT_GENERATIONS), -1):
        raw = get_or_none(store, keys.record(g))
        if is_end(raw):  # the end of an earlier run of this job (a stop, and this is its relaunch)
            continue
        record = parse_record(raw)
        if record is None:
            break
        # Every member's interrupt watch waits on a running generation's interrupt: a plain read of it, absent, woke
        # them all (a few requests each) at each refresh.
        interrupt = get_if_present(store, keys.interrupt(g))
        recent.append({"generation": g, "world_size": record.world_size, "members": list(record.members),
                       "failed": record.failed, "interrupted": interrupt.decode() if interrupt else None,
                       "cause": record.cause})
    return recent


def _incidents(store: dist.Store) -> list[Incident]:
    raw = get_or_none(store, keys.INCIDENTS)
    return [Incident.from_json(line) for line in (raw or b"").decode().splitlines() if line.strip()]
