"""The leader's duty thread: hold or take the leadership, watch liveness, interrupt, and decide records.

Every process runs a LeaderDuty; at most one holds the `leader` key (ftcoord.leader.election). Holding it only
decides who proposes: a record is written once, with compare_set, into the store instance the round observed
(ftcoord.leader.record_write), and `gen/current` only moves forward. A leader may pause at any instruction
(ftcoord.pausepoints): it judges on observations only, so it sees no silence it did not observe, and once deposed it
forks no generation and its fences kill nobody. Only the leader reads every slot (ftcoord.leader.slot_scan); a
follower reads the leader's claim and counters (ftcoord.leader.cadence). Who is dead: ftcoord.leader.judge; when to
decide: ftcoord.leader.readiness; old generations' keys: ftcoord.leader.forgetter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch.distributed as dist

from ftcoord import pausepoints
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.leader.attribution import find_cause
from ftcoord.leader.cadence import Cadence
from ftcoord.leader.election import Election
from ftcoord.leader.forgetter import ForgetSchedule, Forgetter
from ftcoord.leader.judge import Judge
from ftcoord.leader.proposal import Proposer
from ftcoord.leader.readiness import OpenClock, left_out_by, still_left_out
from ftcoord.leader.record_write import Written, write_record
from ftcoord.leader.slot_scan import SlotScan
from ftcoord.liveness.interrupt_watch import stop_asked
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.generations import (
    LeaderClaim,
    await_announcements,
    current_generation,
    mark_ended,
    next_generation,
    parse_announcements,
    read_announcements,
    read_record,
)
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import SlotFacts
from ftcoord.store.client import woken
from ftcoord.store.link import StoreRestarted, instance_number

_JOIN_POLL_S = 0.005  # how often the leader counts the announcements while a generation is open
_STALL_S = _JOIN_POLL_S  # the least a rejoin's announcements stand still before it is judged afresh (_follow_rejoin)


class LeaderDuty:
    """Background thread: hold or take the leadership, and when leading, do its work."""

    def __init__(
        self,
        store: dist.Store,
        slot: int,
        incarnation: int,
        timing: Timing,
        policy: QuorumPolicy,
        progress_timeout: float | None = None,
        tell_watch: Callable[[], None] = lambda: None,
        forgetter: Forgetter | None = None,
    ) -> None:
        """`tell_watch()`: called once this thread failed, and when it reads a newer incarnation of its own slot
        (ftcoord.liveness.helper_watch ends the process). `forgetter`: deletes old generations' keys while this one
        leads, so that its rounds do not wait for them (ftcoord.leader.forgetter; None: this thread deletes them)."""
        self._store = store
        self._tell_watch = tell_watch
        self._slot = slot
        self._incarnation = incarnation
        self._timing = timing
        self._policy = policy
        self._progress_timeout = progress_timeout
        self._open: dict[int, OpenClock] = {}
        self._closed_in: GenerationRecord | None = None
        self._round_instance = 0  # the store instance this round's observations come from
        self._rebuilt = threading.Event()  # the store restarted: forget what was asked there
        self._records: dict[int, GenerationRecord | None] = {}  # the last records read (immutable once written)
        self._interrupted: int | None = None  # a generation this leader saw interrupted
        self._quiet: int | None = None  # the generation its last wait found running, or it decided since (_write)
        self._forgetting = ForgetSchedule(timing.heartbeat_timeout, forgetter)
        # Announcements that wake the leader of an open generation (ftcoord.wrapper.generation_client).
        self._expecting = 1
        self._stop = threading.Event()
        self._poke = threading.Event()  # wakes a follower's sleep
        self._slept = 0.0
        self._reads = SlotScan(store)
        self._cadence = Cadence(slot, incarnation, timing)
        self.newest_incarnation = incarnation
        """The newest incarnation of this process's slot that this thread has read (ftcoord.liveness.helper_watch)."""
        self._log = get_logger(component="leader", slot=slot, incarnation=incarnation)
        self._judge = Judge(store, timing, progress_timeout, self._log)
        self._election = Election(store, slot, incarnation, self._judge, self._log, self._saw_incarnation,
                                  on_elected=self._elected)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-leader-{slot}", daemon=True)
        self.failed: BaseException | None = None

    @property
    def is_leader(self) -> bool:
        return self._election.claim is not None

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def note_record(self, record: GenerationRecord) -> None:
        """The generation this process joined: whether it is one of the leader's deputies (ftcoord.leader.cadence)."""
        self._cadence.note_record(record)

    @contextmanager
    def hurried(self) -> Iterator[None]:
        """While this process waits in a join or a finish: look at the leader every tick (ftcoord.leader.cadence)."""
        if self._cadence.hurry(True):
            self._poke.set()
        try:
            yield
        finally:
            self._cadence.hurry(False)

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self._poke.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._timing.heartbeat_interval + 2.0)
        if release:
            self._election.release()

    # -- the loop -----------------------------------------------------------------

    def _run(self) -> None:
        last_tick = time.monotonic()
        self._slept = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_tick > self._timing.heartbeat_timeout / 2 + self._slept:
                # We were paused (SIGSTOP, swap): what we saw is old, start afresh.
                self._start_afresh()
                self._log.warning("leader_duty_paused", paused_s=round(now - last_tick, 3))
            last_tick = now
            self._slept = 0.0
            try:
                self._round_instance = instance_number(self._store)
                if self._rebuilt.is_set():
                    self._rebuilt.clear()
                    self._open.clear()
                    self._election.forget_holder()
                    self._reads.forget(slots=True)
                    self._records.clear()
                    self._judge.rebuilt()
                election = self._election
                following = election.claim is None
                read_at, facts, holder = election.follow(self._round_instance) if following else self._observe()
                if read_at - last_tick > self._timing.heartbeat_timeout / 2:
                    # Stuck in a store call (a hung or restarting store kept everyone from beating): what
                    # this round read shows no silence of anyone's; watch afresh, or a healthy rank is fenced.
                    self._start_afresh()
                    self._log.warning("leader_duty_stalled_by_store", stalled_s=round(read_at - last_tick, 3))
                    last_tick = time.monotonic()
                    continue
                if following:
                    if holder is not None and election.claim is None:
                        election.try_acquire(holder, facts, self._closed_in)
                    if election.claim is None:
                        self._sleep(self._judge.next_look(self._cadence.interval()))
                elif holder == election.claim:
                    pausepoints.reached(pausepoints.LEADER_CHECKED)
                    if self._lead_once(read_at, facts):
                        return  # the job ended: nothing left to decide
                else:
                    election.lose(holder)
            except StoreRestarted:  # read slots of a lost store instance: read the new one afresh
                continue
            except Exception as exc:  # store gone or broken: this thread cannot help
                if self._stop.is_set():
                    return
                self.failed = exc
                self._log.error("leader_duty_failed", error=str(exc))
                self._tell_watch()
                return

    def _sleep(self, seconds: float) -> None:
        self._slept = seconds  # not a pause of ours (the pause check allows for it)
        self._poke.wait(seconds)
        self._poke.clear()

    def _start_afresh(self) -> None:
        """What this thread saw is too old to judge on (it was paused, or stuck in a store call): watch anew."""
        self._judge.observer.reset()
        self._open.clear()
        self._reads.forget()

    def _elected(self) -> None:
        """A new term: what this process saw open, or read, while it led before is stale."""
        self._open.clear()
        self._reads.forget()

    def _observe(self) -> tuple[float, dict[int, SlotFacts], LeaderClaim]:
        """The leader's round: its claim and every slot's counters (ftcoord.leader.slot_scan: a read that the running
        generation's interrupt cut short stands on the last whole one, and observes nothing)."""
        running = self._quiet if self._quiet != self._interrupted else None
        read_at, facts, claim, fresh = self._reads.read(self._round_instance, running)
        if fresh:
            self._judge.observe(facts, read_at)
            if self._slot in facts:
                self._saw_incarnation(facts[self._slot].incarnation)
        return read_at, facts, LeaderClaim.parse(claim)

    def _saw_incarnation(self, incarnation: int) -> None:
        """The newest incarnation of this slot, as just read; a newer one than ours is told to the helper watch."""
        self.newest_incarnation = incarnation
        if incarnation > self._incarnation:
            self._tell_watch()

    def rebuild(self, store: dist.Store, record: GenerationRecord | None) -> None:
        """The store restarted (ftcoord.protocol.restore): write back the leader's term and its fences; forget its
        probes (this process asks again on what the new store shows)."""
        claim = self._election.claim
        if self._election.rebuild(store, record) and claim is not None:  # the store holds our claim
            self._judge.write_back_fences(store, claim.term)
        self._rebuilt.set()

    def note_closed(self, record: GenerationRecord) -> None:
        """A connection closed under a collective of ours in `record`'s generation: a hint to look at
        the evidence (ftcoord.protocol.evidence) when judging its members, the leader among them."""
        self._closed_in = record

    @property
    def _term(self) -> int:
        return self._election.term

    # -- leading ------------------------------------------------------------------

    def _lead_once(self, read_at: float, facts: dict[int, SlotFacts]) -> bool:
        """One round of the leader's duties; True when the job ended (done or fatal)."""
        current = current_generation(self._store)
        self._forgetting.run(self._store, current if current == self._quiet else None)  # running at the last look
        record = self._record(current)
        if current and current not in (self._interrupted, self._quiet):  # known from the last wait, else looked at
            if self._store.check([keys.interrupt(current)]):
                self._interrupted = current
        if record is not None and record.failed is None and self._interrupted != current:
            if self._judge.interrupt_if_member_dead(record, facts, read_at, self._term):
                self._interrupted = current
        # Once the generation ended (for any cause), its silent members are outsiders too: fenced now, so that their
        # launchers' replacements are awaited, not decided without and grown back after join_timeout.
        running = record if record is not None and record.failed is None and self._interrupted != current else None
        self._judge.fence_hung_outsiders(running, facts, self._term, current)

        generation = next_generation(self._store, current)
        if running is not None:
            self._judge.fence_stuck_outsiders(running, facts, read_at, generation, self._term)
        elif record is not None and self._interrupted == current:
            self._judge.fence_stuck_members_of_ended(record, facts, read_at, generation, self._term)
        if current == 0 or running is None:
            return self._open_next(generation, facts, read_at, record, current)
        # Running. A fatal error written anywhere (a rank's FatalError, a launcher's configuration error) ends it, so
        # its members hear of the error when they rejoin (the leader decides nothing more), whoever wrote it: one
        # outside this generation cannot interrupt it itself. So a joiner need not read the fatal key after every
        # record it gets (ftcoord.wrapper.generation_client).
        if self._store.check([keys.FATAL]):
            self._store.compare_set(keys.interrupt(current), "", "fatal")
            self._interrupted = current
            self._log.error("generation_interrupted_by_fatal", generation=current)
            return False
        # Sleep until the generation is interrupted, or a tick passes (to judge silences; less when one is due).
        if not woken(self._store, keys.interrupt(current), self._judge.sooner(self._timing.tick)):
            self._quiet = current  # not interrupted a moment ago: the next round need not look again
            return False
        return self._follow_rejoin(generation, facts, read_at, record, current)

    def _open_next(self, generation: int, facts: dict[int, SlotFacts], read_at: float,
                   record: GenerationRecord | None, current: int, fresh: bool = True,
                   polled: bytes | None = None) -> bool:
        """Generation `generation` may be decided: the current one ended (or never began). True when the job ended.
        `fresh`: this round's reads are from after the current generation ended (else, from before). `polled`: the
        announcements a poll just read (_await_joiners), rather than read again."""
        if self._store.check([keys.DONE]) or self._store.check([keys.FATAL]):
            mark_ended(self._store, generation)  # its joiners (members after a fatal error, spares) wake now
            return True
        running = record is not None and record.failed is None and any(
            m in facts and self._judge.alive(facts[m], i)
            for m, i in zip(record.members, record.incarnations, strict=True))
        if self._maybe_decide(generation, facts, read_at, running, record, current, fresh, polled):
            return False  # decided: look again at once
        polled = self._await_joiners(generation, self._expecting)
        if polled is not None and not self._paused_since(read_at):
            # Everyone it waited for announced: decide on what this round read (a tick old at most), rather than
            # read every slot again first (that read would be on the critical path of the advance).
            self._maybe_decide(generation, facts, read_at, running, record, current, fresh=False, polled=polled)
        return False

    def _follow_rejoin(self, generation: int, facts: dict[int, SlotFacts], read_at: float,
                       record: GenerationRecord | None, current: int) -> bool:
        """The wait on the running generation's interrupt was woken: its members are rejoining, every one of them
        sending requests to the store at once, so the leader sends as few as it can meanwhile. It polls the
        announcements until every live slot it read this round announced itself, then confirms the interrupt and
        decides on this round's reads. When they do not all come (one died meanwhile: its dead mark is newer than
        this round's reads), or stop coming for as long as judging afresh would take (`SlotScan.read_s`, at least
        _STALL_S: waiting longer for a dead one costs more than reading again, and a shorter pause is no evidence of
        one), it confirms the interrupt and judges afresh in a new round."""
        left_out = left_out_by(record)
        alive = sum(1 for slot, fact in facts.items()
                    if self._judge.alive(fact) and left_out.get(slot) != fact.incarnation)
        stall_s = max(_STALL_S, self._reads.read_s)
        polled = None if self._paused_since(read_at) else self._await_joiners(generation, alive, stall_s, read_at)
        if not self._store.check([keys.interrupt(current)]):
            self._quiet = current  # woken by a compare_set that set nothing (see ftcoord.store.client.wait_for_key)
            return False
        self._interrupted = current
        if polled is None:
            return False
        return self._open_next(generation, facts, read_at, record, current, fresh=False, polled=polled)

    def _record(self, generation: int) -> GenerationRecord | None:
        """A decided generation's record, read once (records never change)."""
        if generation not in self._records:
            record = read_record(self._store, generation) if generation else None
            if record is None:
                return None
            self._records = {g: r for g, r in self._records.items() if g > generation - 2}
            self._records[generation] = record
        return self._records[generation]

    def _await_joiners(self, generation: int, expecting: int, stall_s: float | None = None,
                       read_at: float | None = None) -> bytes | None:
        """Poll the announcements until `expecting` have announced themselves (everyone the last round waited for:
        the announcements read, on which it decides at once), a probe's grace ends, a fenced process's launcher is due
        to have answered (ftcoord.leader.judge), or a tick passes (a new round looks at who is alive and at the last
        call): None; see ftcoord.protocol.generations.await_announcements. A rejoin's poll (`stall_s`: while the
        announcements keep coming) goes on past a tick, until this round's reads (from `read_at`) are too old to act
        on: during the rush one poll may wait long in the store's queue, and cutting it sends the leader to read
        every slot again."""
        now = time.monotonic()
        within = self._timing.tick if read_at is None else self._acts_until(read_at) - now
        until = now + min(self._judge.probe.wait_at_most(self._timing.probe_grace, within),
                          self._judge.until_fences_answered(now))
        return await_announcements(self._store, generation, expecting, until, self._stop, _JOIN_POLL_S, stall_s)

    def _acts_until(self, read_at: float) -> float:
        """Until when this round's reads (asked at `read_at`) may be acted on: half a heartbeat timeout."""
        return read_at + self._timing.heartbeat_timeout / 2

    def _paused_since(self, read_at: float) -> bool:
        """This round's reads are too old to act on: the thread was paused (or the store stalled) since."""
        return time.monotonic() > self._acts_until(read_at)

    def _maybe_decide(self, generation: int, facts: dict[int, SlotFacts], read_at: float, running: bool,
                      previous: GenerationRecord | None, current: int, fresh: bool = True,
                      polled: bytes | None = None) -> bool:
        """Decide `generation` when it is time (ftcoord.leader.proposal): True when decided, or deposed meanwhile.
        `polled`: its announcements, just read by a poll (else they are read now)."""
        joins, announced = (parse_announcements(polled) if polled is not None
                            else read_announcements(self._store, generation))
        now = time.monotonic()
        clock = self._open.setdefault(generation, OpenClock(now, now))
        proposer = Proposer(self._slot, self._term, self._policy, self._timing)
        proposal = proposer.propose(generation, joins, announced, facts, read_at, clock, now, self._judge, previous,
                                    running, fresh)
        self._expecting = proposal.ready.expecting
        record = proposal.record
        if record is None:
            return False
        if record.failed is None:
            # Left out on this leader's word alone (a fence, the evidence of a closed connection, a last call): in the
            # record, so that a next leader, which saw none of it, does not wait for them either.
            left_out = still_left_out(record, proposal.ready.missing | proposal.ready.gone
                                      | self._judge.fenced_alive(facts), facts, previous)
            record = replace(record, stop=stop_asked(self._store), left_out=tuple(sorted(left_out.items())))
            cause = find_cause(self._store, previous, record)
            if cause is not None:
                record = replace(record, cause=cause.text, culprits=cause.culprits)
        return self._write(record, current, partial=not proposal.ready.everyone)

    def _write(self, record: GenerationRecord, current: int, partial: bool = False) -> bool:
        """Write the decision (ftcoord.leader.record_write); True: this round is over, whatever became of it."""
        written = write_record(self._store, self._election, self._round_instance, record, current, self._log, partial)
        if written is Written.DECIDED:
            # Running as far as this leader knows: the next round's read of every slot (while its members get the
            # record) stops at its interrupt, as after a wait (ftcoord.leader.slot_scan).
            if record.failed is None:
                self._quiet = record.generation
            self._forgetting.decided(record.generation)
            self._open.pop(record.generation, None)
        elif written is Written.DROPPED:
            self._open.clear()
        return True
