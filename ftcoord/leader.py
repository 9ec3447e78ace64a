"""Leader election and the leader's duties: watch liveness, interrupt, decide records.

Every process runs a LeaderDuty thread; at most one holds the `leader` key at a time.
Holding it is only an optimisation of who proposes: safety comes from the record being
written once with compare_set, so a deposed leader that wakes up cannot fork a generation.

When to decide generation g+1 (recovery at the speed of evidence, not of timeouts):
- at once when every live slot has joined (a starting job: every worker; spares only at last call);
- a slot is dead without waiting when there is evidence: its launcher's dead mark, or a connection
  that closed under the generation's collectives while it neither rejoined, announced leaving nor
  answered the leader's probe within probe_grace (or beat for 1.5 heartbeat intervals: ftcoord.evidence);
  silence for heartbeat_timeout is the last resort;
- a replacement whose launcher keeps saying it is on its way is waited for, up to barrier_timeout
  (one generation change, the world size kept, however slow a cold start); a process that is alive
  but slow to join, up to join_timeout after the last arrival; then a partial quorum.
A leader whose own death has such evidence is replaced at once for the same reasons.

Safety under pauses (a leader may stop at any instruction for any time and wake up; reproduced by
the tests with ftcoord.pausepoints):
- `gen/<g>/record` is written once, with compare_set from absent, and never becomes absent again
  (an old generation's record is replaced by the keys.FORGOTTEN tombstone, not deleted): a leader
  that paused before its write and wakes after g was decided (or forgotten) fails its write.
- `gen/current` only moves forward (compare_set up to the larger value).
- Leadership is the `leader` key, "term:slot:incarnation", taken with compare_set; a term only grows.
  A leader confirms its claim before each round of writes, and its fences carry its term: a launcher
  kills on a fence only while no newer term holds the key, so a deposed leader that wakes kills nobody.
- Liveness is judged on observations only (ftcoord.heartbeat.LivenessObserver): a leader paused
  between its reads and its judgement sees no silence that it did not observe.
A record written by a leader deposed between its last check and its write is still the one decision
for that generation, made from what it observed while it led; the members follow it, and a stale
judgement in it is corrected by the next generation.

Across a store restart (ftcoord.store_link, ftcoord.rebuild): a round's record is written only into the
store instance its observations came from (the write is pinned: a leader that paused through a restart
writes nothing), a new instance decides only numbers of its own epoch, and the leader forgets what it
fenced and observed there (those keys are gone; the counters start again).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

from ftcoord import evidence, keys, pausepoints, rebuild
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.decisions import (
    LeaderClaim,
    advance_current,
    current_generation,
    forget,
    next_generation,
    read_joins,
    read_record,
)
from ftcoord.heartbeat import LivenessObserver
from ftcoord.log import get_logger
from ftcoord.quorum import choose_members
from ftcoord.record import GenerationRecord
from ftcoord.slots import SPARE_SLOT_BASE, SlotFacts, read_facts, registered_slots
from ftcoord.store import get_or_none, read_int, wait_for_key
from ftcoord.store_link import StoreRestarted, instance_number, pinned_compare_set


@dataclass
class _OpenGeneration:
    """The leader's own clock on a generation that may be decided."""

    first_seen: float
    last_change: float
    joiners_seen: int = -1


class LeaderDuty:
    """Background thread: hold or take the leadership, and when leading, do its work."""

    KEEP_GENERATIONS = 4

    def __init__(
        self,
        store: dist.Store,
        slot: int,
        incarnation: int,
        timing: Timing,
        policy: QuorumPolicy,
        progress_timeout: float | None = None,
    ) -> None:
        self._store = store
        self._slot = slot
        self._incarnation = incarnation
        self._timing = timing
        self._policy = policy
        self._progress_timeout = progress_timeout
        self._observer = LivenessObserver(timing.heartbeat_timeout)
        self._claim: LeaderClaim | None = None
        self._open: dict[int, _OpenGeneration] = {}
        self._fenced: set[tuple[int, int]] = set()
        self._closed_in: GenerationRecord | None = None
        self._round_instance = 0  # the store instance this round's observations come from
        self._rebuilt = threading.Event()  # the store restarted: forget what was fenced and asked there
        self._terms_seen = 0
        self._probe = evidence.Probe(store)
        self._stop = threading.Event()
        self._log = get_logger(component="leader", slot=slot, incarnation=incarnation)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-leader-{slot}", daemon=True)
        self.failed: BaseException | None = None

    @property
    def is_leader(self) -> bool:
        return self._claim is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._timing.heartbeat_interval + 2.0)
        if release and self._claim is not None:
            released = LeaderClaim(self._claim.term, None, None)
            try:
                self._store.compare_set(keys.LEADER, str(self._claim), str(released))
                self._log.info("leader_released", term=self._claim.term)
            except Exception:  # the store is gone: nobody to hand over to
                pass
            self._claim = None

    # -- the loop -----------------------------------------------------------------

    def _run(self) -> None:
        last_tick = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_tick > self._timing.heartbeat_timeout / 2:
                # We were paused (SIGSTOP, swap): what we saw is old, start afresh.
                self._observer.reset()
                self._open.clear()
                self._log.warning("leader_duty_paused", paused_s=round(now - last_tick, 3))
            last_tick = now
            try:
                self._round_instance = instance_number(self._store)
                if self._rebuilt.is_set():
                    self._rebuilt.clear()
                    self._open.clear()
                    self._fenced.clear()
                    self._probe = evidence.Probe(self._store)
                if self._store.check([keys.DONE]) or self._store.check([keys.FATAL]):
                    return  # nothing left to decide
                read_at, facts = self._observe()
                if read_at - last_tick > self._timing.heartbeat_timeout / 2:
                    # Stuck in a store call (a hung or restarting store kept everyone from beating): what
                    # this round read shows no silence of anyone's; watch afresh (CI-like: a 12 s store
                    # hang got a healthy rank fenced as heartbeat_stale).
                    self._observer.reset()
                    self._open.clear()
                    self._log.warning("leader_duty_stalled_by_store", stalled_s=round(read_at - last_tick, 3))
                    last_tick = time.monotonic()
                    continue
                if self._claim is None:
                    self._try_acquire(facts)
                if self._claim is not None and self._still_leader():
                    pausepoints.reached(pausepoints.LEADER_CHECKED)
                    self._lead_once(read_at, facts)
                else:
                    self._stop.wait(self._timing.tick)
            except Exception as exc:  # store gone or broken: this thread cannot help
                if self._stop.is_set():
                    return
                self.failed = exc
                self._log.error("leader_duty_failed", error=str(exc))
                return

    def _observe(self) -> tuple[float, dict[int, SlotFacts]]:
        """Read every slot's counters and feed the observer (leader or not).

        Every process keeps watching, so the one that takes over already has a history
        and need not wait another full timeout before it can judge anyone.
        """
        slots = registered_slots(self._store)
        read_at = time.monotonic()  # before the read: a dead mark older than this is seen
        facts = read_facts(self._store, slots)
        for slot, fact in facts.items():
            # Observed as of when the read was asked: a store that hung during the read kept everyone from
            # beating, and its silence is not theirs. A counter's silence is then never over-counted.
            # With the incarnation: a new one gets a timeout of its own (register bumps it before the counter).
            self._observer.observe(f"hb/{slot}", (fact.incarnation, fact.heartbeat), at=read_at)
            # The announced incarnation too: a new announcement starts at beat 0, like the last one may have.
            self._observer.observe(f"replacing/{slot}", (fact.replacing, fact.replacing_beat), at=read_at)
        return read_at, facts

    def _try_acquire(self, facts: dict[int, SlotFacts]) -> None:
        first = LeaderClaim(1, self._slot, self._incarnation)
        holder = LeaderClaim.parse(self._store.compare_set(keys.LEADER, "", str(first)))
        self._terms_seen = max(self._terms_seen, holder.term)
        if holder == first:
            self._become(first)
            return
        if holder.slot is not None:
            fact = facts.get(holder.slot)
            if fact is None or (self._alive(fact, holder.incarnation)
                                and holder.slot not in self._gone_by_evidence(self._closed_in)):
                return
        mine = LeaderClaim(holder.term + 1, self._slot, self._incarnation)
        won = self._store.compare_set(keys.LEADER, str(holder), str(mine)).decode()
        if won == str(mine):
            self._become(mine, previous=holder)

    def rebuild(self, store: dist.Store, record: GenerationRecord | None) -> None:
        """The store restarted (ftcoord.rebuild): write back the leader's term; forget fences and probes."""
        claim = self._claim
        term = max(self._terms_seen, claim.term if claim else 0, record.leader_term if record else 0)
        rebuild.leader_term(store, str(claim) if claim is not None else None, term)
        self._rebuilt.set()

    def note_closed(self, record: GenerationRecord) -> None:
        """A connection closed under a collective of ours in `record`'s generation: a hint to look at
        the evidence (ftcoord.evidence) when judging its members, the leader among them."""
        self._closed_in = record

    def _gone_by_evidence(self, record: GenerationRecord | None, joined: set[int] = frozenset()) -> set[int]:
        """Members of `record` gone by evidence: a connection closed under the generation, and they neither
        rejoined, nor said they were leaving, nor beat for `evidence_silence` or since they were asked to
        (a probe, answered within `probe_grace` by any live process: ftcoord.evidence)."""
        if record is None or record.failed is not None:
            return set()
        closed, leaving = evidence.read(self._store, record.generation)
        if not closed:
            return set()
        asked = self._probe.ask(record.generation)
        answered_by = asked + self._timing.probe_grace  # a read after this that shows no beat: no answer
        return {m for m in record.members if m not in joined and m not in leaving
                and (self._observer.silent_for(f"hb/{m}") >= self._timing.evidence_silence
                     or self._observer.silent_since(f"hb/{m}", asked, answered_by))}

    def _become(self, claim: LeaderClaim, previous: LeaderClaim | None = None) -> None:
        self._claim = claim
        self._open.clear()
        self._log.info("leader_elected", term=claim.term,
                       previous=str(previous) if previous else None)

    def _still_leader(self) -> bool:
        held = get_or_none(self._store, keys.LEADER)
        if held is not None and held.decode() == str(self._claim):
            return True
        self._log.warning("leader_lost", term=self._claim.term if self._claim else None,
                          holder=held.decode() if held else None)
        self._claim = None
        return False

    # -- leading ------------------------------------------------------------------

    def _lead_once(self, read_at: float, facts: dict[int, SlotFacts]) -> None:
        current = current_generation(self._store)
        record = read_record(self._store, current) if current else None
        if record is not None and record.failed is None:
            self._interrupt_if_member_dead(record, facts, read_at)
        self._fence_hung_outsiders(record, facts)

        generation = next_generation(self._store, current)
        if self._is_open(current, record):
            running = record is not None and record.failed is None and any(
                m in facts and self._alive(facts[m], i)
                for m, i in zip(record.members, record.incarnations, strict=True))
            if self._maybe_decide(generation, facts, read_at, running, record):
                return  # decided: look again at once
        joined = read_int(self._store, keys.join_count(generation))
        # Sleep until the next joiner arrives or a tick passes, whichever is first.
        wait_for_key(self._store, keys.join_signal(generation, joined + 1),
                     self._probe.wait_at_most(self._timing.probe_grace, self._timing.tick))

    def _alive(self, facts: SlotFacts, incarnation: int | None = None) -> bool:
        return not facts.is_gone(incarnation) and not self._observer.is_stale(f"hb/{facts.slot}")

    def _interrupt_if_member_dead(self, record: GenerationRecord, facts: dict[int, SlotFacts], read_at: float) -> None:
        if self._store.check([keys.interrupt(record.generation)]):
            return
        members = [(m, i, facts[m]) for m, i in zip(record.members, record.incarnations, strict=True) if m in facts]
        hung = self._hung_members(record.generation, members, read_at)
        for member, inc, fact in members:
            if self._alive(fact, inc) and member not in hung:
                continue
            reason = "hung" if member in hung else ("gone" if fact.is_gone(inc) else "heartbeat_stale")
            if not fact.is_gone(inc):
                self._fence(member, inc, reason)  # a hung peer then fails the collectives at once
            self._store.compare_set(keys.interrupt(record.generation), "", f"{reason}:slot={member}")
            self._log.warning("member_declared_dead", generation=record.generation, slot=member,
                              incarnation=inc, reason=reason,
                              silent_s=round(self._observer.silent_for(f"hb/{member}"), 3))
            return

    def _fence(self, slot: int, incarnation: int, reason: str) -> None:
        """Ask the slot's launcher to kill this incarnation (once). The term lets the launcher ignore a
        fence of a leader deposed before it could see the kill through."""
        if (slot, incarnation) in self._fenced:
            return
        self._store.set(keys.fence(slot), f"{self._claim.term if self._claim else 0}:{incarnation}")
        self._fenced.add((slot, incarnation))
        self._log.warning("rank_fenced", slot=slot, incarnation=incarnation, reason=reason)

    def _fence_hung_outsiders(self, record: GenerationRecord | None, facts: dict[int, SlotFacts]) -> None:
        """A process that hung while it was in no running generation (joining, or a hot spare) is judged by
        no interrupt; fence it too, so its launcher replaces it and its capacity is not lost for good."""
        members = set(record.members) if record is not None and record.failed is None else set()
        for slot, fact in facts.items():
            if slot not in members and not fact.is_gone() and self._observer.is_stale(f"hb/{slot}"):
                self._fence(slot, fact.incarnation, "heartbeat_stale")

    def _hung_members(self, generation: int, members: list[tuple[int, int, SlotFacts]], read_at: float) -> set[int]:
        """Members alive but making no progress for progress_timeout: the culprits only.

        Peers of a stuck rank block in their next collective and go silent too; those
        that sit in a collective are waiting, not stuck. If every silent member waits, the
        one furthest behind is the culprit; if they are all level, nobody is fenced (a
        collective deadlock: the process-group timeout ends it).
        """
        if self._progress_timeout is None or math.isinf(self._progress_timeout):
            return set()
        silent = []
        for member, _, fact in members:
            name = f"progress/{member}/{generation}"
            # Observed when it was read, not now: a duty thread paused between reading and judging (a GC) would
            # otherwise count its own pause as the member's silence (CI: a healthy leader fenced itself as hung).
            self._observer.observe(name, fact.progress, at=read_at)
            if self._observer.is_stale(name, self._progress_timeout):
                silent.append(fact)
        culprits = [f for f in silent if not f.waiting]
        if not culprits and silent:
            lowest = min(f.progress for f in silent)
            if any(f.progress != lowest for f in silent):
                culprits = [f for f in silent if f.progress == lowest]
        return {f.slot for f in culprits}

    def _is_open(self, current: int, record: GenerationRecord | None) -> bool:
        """Generation current+1 may be decided once current ended (or never began)."""
        if current == 0 or record is None or record.failed is not None:
            return True
        return self._store.check([keys.interrupt(current)])

    def _maybe_decide(self, generation: int, facts: dict[int, SlotFacts], read_at: float, running: bool,
                      previous: GenerationRecord | None) -> bool:
        joins = read_joins(self._store, generation)
        live = [j for j in joins if j.slot in facts and j.incarnation == facts[j.slot].incarnation
                and self._alive(facts[j.slot])]
        now = time.monotonic()
        clock = self._open.setdefault(generation, _OpenGeneration(now, now))
        if len(live) != clock.joiners_seen:
            clock.joiners_seen, clock.last_change = len(live), now

        joined_slots = {j.slot for j in live}
        # Members gone by the evidence of a closed connection: no waiting for their heartbeat timeout.
        gone = self._gone_by_evidence(previous, joined_slots)
        expected = {s for s, f in facts.items() if self._alive(f) and s not in gone}
        on_its_way: set[int] = set()
        if len(live) < self._policy.target_world_size:
            # Below target: wait for replacements a launcher is starting, rather than shrink now
            # and grow back a moment later. At target (a hot spare stepped in) nothing to wait for.
            on_its_way = {s for s, f in facts.items() if f.being_replaced and s not in joined_slots
                          and not self._observer.is_stale(f"replacing/{s}")}
            expected |= on_its_way
        # A job starting (or restarting as a whole: no member of the last generation is
        # alive) waits for its target size of workers (a spare is seated only at last call, when
        # a worker is still missing); a running job re-forms with whoever is alive.
        workers = sum(1 for j in live if j.slot < SPARE_SLOT_BASE)
        everyone = expected <= joined_slots and (running or workers >= self._policy.target_world_size)
        # Last call: join_timeout after the last arrival for processes that are alive but slow to
        # join; a replacement whose launcher keeps saying it is on its way (a cold start on a busy
        # node) is waited for up to barrier_timeout.
        missing = expected - joined_slots
        if missing and missing <= on_its_way:
            last_call = now - clock.first_seen >= self._timing.barrier_timeout
        else:
            last_call = now - clock.last_change >= self._timing.join_timeout
        if not (everyone or last_call):
            return False
        decision = choose_members(live, self._policy)
        if decision is None:
            if now - clock.first_seen < self._timing.barrier_timeout:
                return False
            reason = (
                f"only {len(live)} live process(es) joined generation {generation} within "
                f"barrier_timeout={self._timing.barrier_timeout}s; min_world_size is "
                f"{self._policy.min_world_size}; start more processes or lower min_world_size"
            )
            return self._write(self._failed_record(generation, reason, read_at))
        members = decision.members
        record = GenerationRecord(
            generation=generation,
            members=tuple(j.slot for j in members),
            incarnations=tuple(j.incarnation for j in members),
            leader=self._slot,
            leader_term=self._claim.term if self._claim else 0,
            target_world_size=self._policy.target_world_size,
            heal_source=decision.heal_source,
            start_step=max((j.step for j in members), default=-1),
            spares=tuple(j.slot for j in decision.spares),
            considered=tuple(sorted((j.slot, j.incarnation) for j in live)),
            liveness_read_at=read_at,
            steps=tuple(j.step for j in members),
        )
        return self._write(record, partial=not everyone)

    def _failed_record(self, generation: int, reason: str, read_at: float) -> GenerationRecord:
        return GenerationRecord(
            generation=generation, members=(), incarnations=(), leader=self._slot,
            leader_term=self._claim.term if self._claim else 0,
            target_world_size=self._policy.target_world_size, liveness_read_at=read_at,
            failed=reason,
        )

    def _write(self, record: GenerationRecord, partial: bool = False) -> bool:
        text = record.to_json()
        if not self._still_leader():
            return True  # deposed while deciding: the new leader decides
        pausepoints.reached(pausepoints.LEADER_BEFORE_RECORD)
        try:
            won = pinned_compare_set(self._store, self._round_instance, keys.record(record.generation), "",
                                     text).decode() == text
        except StoreRestarted as exc:  # decided on what a lost instance showed: judge again on the new one
            self._log.warning("decision_dropped", generation=record.generation, reason=str(exc))
            self._open.clear()
            return True
        if not won:
            return True  # another leader decided first (or the generation is long forgotten); its record stands
        advance_current(self._store, record.generation)
        if record.failed:
            self._log.error("generation_failed", generation=record.generation, reason=record.failed)
        else:
            self._log.info("generation_decided", generation=record.generation,
                           members=list(record.members), world_size=record.world_size,
                           spares=list(record.spares), partial=partial,
                           heal_source=record.heal_source, start_step=record.start_step)
        forget(self._store, record.generation - self.KEEP_GENERATIONS)
        self._open.pop(record.generation, None)
        return True
