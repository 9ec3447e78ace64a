"""The leader's judgement of who is dead: silence, evidence, a stuck training thread; and the fences that follow.

Made on observations only (ftcoord.liveness.heartbeat.LivenessObserver), so an observer paused between its reads and
its judgement calls nobody dead. Evidence (a launcher's dead mark; a connection closed under a collective and no
answer to the leader's question: ftcoord.protocol.evidence) needs no waiting; silence for heartbeat_timeout is the
last resort. A member alive but making no progress for progress_timeout is stuck: only the culprit is fenced, never a
peer that waits for it in a collective. A process stuck outside the running generation is fenced too, or it would
stay outside for good. A fenced process's launcher answers within FENCE_POLL_S; until it does, or FENCE_ANSWER_S
passes, the leader decides no smaller world without it (`unanswered_fences`): reads from before the fence cannot
show the answer, and a world shrunk at once would grow back when the replacement comes.
"""

from __future__ import annotations

import math
import time

import torch.distributed as dist

from ftcoord.config import FENCE_ANSWER_S, Timing
from ftcoord.liveness.heartbeat import LivenessObserver
from ftcoord.protocol import evidence, keys, restore
from ftcoord.protocol.generations import read_announcements, read_record
from ftcoord.protocol.keys import GONE, HEARTBEAT_STALE, HUNG
from ftcoord.protocol.nodes import NodeMap
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import SlotFacts

RELEASE_LOOKBACK = 4
"""How many generations back a silent process fenced outside the running generation is looked for among the members
(ftcoord.liveness.group_release): the generations decided without it since the one it was blocked in (a partial
quorum, a grow)."""



class Judge:
    """One leader duty's observations of the job's processes, and what it concludes from them."""

    def __init__(self, store: dist.Store, timing: Timing, progress_timeout: float | None, log: object) -> None:
        self._store = store
        self._timing = timing
        self._progress_timeout = progress_timeout
        self._log = log
        self.observer = LivenessObserver(timing.heartbeat_timeout)
        self.fenced: dict[tuple[int, int], float] = {}  # (slot, incarnation): when this leader fenced it
        self._fence_terms: dict[tuple[int, int], int] = {}  # (slot, incarnation): the term it was fenced in
        self.probe = evidence.Probe(store)
        self.nodes = NodeMap(store)

    def sooner(self, seconds: float) -> float:
        """`seconds`, or less when a heartbeat this process watches (every member's, as the leader; the leader's, as
        a follower) would reach the heartbeat timeout sooner: the round that judges it silent is then asked on the
        dot, not up to a step of the watcher's grid late (a tick; a deputy's interval, whose grid moves at each join:
        LivenessObserver.stale_at; tests/unit/test_silence_on_the_dot.py)."""
        due = self.observer.stale_at("hb/") + 0.001  # a timed wait may end a hair early
        return min(seconds, max(0.005, due - time.monotonic()))

    def next_look(self, seconds: float) -> float:
        """A follower's sleep until its next look at the leader: `seconds` (ftcoord.leader.cadence), or less when the
        leader's heartbeat would reach the timeout sooner (`sooner`), or when a question this follower asked (a probe,
        judging the leader on evidence) has its answers due: a follower that looks every few ticks (a large job's,
        while it joins) judges the leader then, as one that looked every tick did."""
        return self.sooner(self.probe.wait_at_most(self._timing.probe_grace, seconds))

    def write_back_fences(self, store: dist.Store, term: int) -> None:
        """The store restarted: write back the fences this leader issued in the term it holds (each as it was issued),
        unless the slot's key names a later incarnation. A fenced process that slept through the restart (its node
        paused or cut off) wakes to a store that no longer says so: without its fence its launcher would not replace
        it, and it would wait as a spare, left out of the generation that declared it dead, for good. A fence of an
        earlier term of ours is not written back: a leader deposed meanwhile may have let that process take part.

        Args:
            store: the restarted store (a rebuild's view of it).
            term: the term this leader holds, its claim being the one the store holds now.
        """
        for key in list(self.fenced):
            if self._fence_terms.get(key) == term:
                restore.fence(store, key[0], term, key[1])

    def rebuilt(self) -> None:
        """The store restarted: what was asked there is gone; ask again. The fences stay known (write_back_fences wrote
        them back, and does so again at the next restart: a fenced process may sleep through more than one)."""
        self.probe = evidence.Probe(self._store)

    def observe(self, facts: dict[int, SlotFacts], read_at: float, replacing: bool = True) -> None:
        """Feed a read of slots' counters, as of when it was asked (a store that hung during the read kept
        everyone from beating, and its silence is not theirs)."""
        for slot, fact in facts.items():
            # With the incarnation: a new one gets a timeout of its own (register bumps it before the counter).
            self.observer.observe(f"hb/{slot}", (fact.incarnation, fact.heartbeat), at=read_at)
            if replacing:  # a new announcement starts at beat 0, like the last one may have
                self.observer.observe(f"replacing/{slot}", (fact.replacing, fact.replacing_beat), at=read_at)

    def gone_by_evidence(self, record: GenerationRecord | None, joined: set[int] = frozenset()) -> set[int]:
        """Members of `record` gone by evidence: a connection closed under the generation, and they neither
        rejoined, nor said they were leaving, nor beat for `evidence_silence` or since they were asked to
        (a probe, answered within `probe_grace` by any live process: ftcoord.protocol.evidence)."""
        if record is None or record.failed is not None:
            return set()
        closed, leaving = evidence.read(self._store, record.generation)
        if not closed:
            return set()
        asked = self.probe.ask(record.generation)
        answered_by = asked + self._timing.probe_grace  # a read after this that shows no beat: no answer
        return {m for m in record.members if m not in joined and m not in leaving
                and (self.observer.silent_for(f"hb/{m}") >= self._timing.evidence_silence
                     or self.observer.silent_since(f"hb/{m}", asked, answered_by))}

    def outsiders_in_doubt(self, previous: GenerationRecord, lost: set[int], outsiders: set[int],
                           facts: dict[int, SlotFacts]) -> tuple[set[int], set[int]]:
        """(awaited, gone) among `outsiders` (live joiners that were not members of `previous`: hot spares,
        newcomers) that run on the node of a member of `previous` gone by evidence with no launcher to say so
        (`lost`: its node may be lost, and with it every process of that node). Such a joiner's announcement stands
        and its heartbeat is not heartbeat_timeout old yet: seated, it would keep the new generation from forming
        until it is. It is awaited until it beats after the leader's question (alive: seated), or
        stays silent for evidence_silence (gone with its node: decided without, like the members it ran beside; one
        alive after all is seated in the next generation). A joiner on another node, or whose node no launcher
        reported, is not in doubt for that.

        A joiner this leader saw silent for evidence_silence is in doubt too, wherever it runs: its announcement may be
        older than its silence (a hot spare announces itself ahead of the generation it may be seated in). It is
        awaited until it beats after the question (seated), or is gone once a read a heartbeat interval after the
        question (probe_grace, if longer) shows no beat: a spare that announced itself does not answer the question
        (its interrupt monitor reads no question once announced, ftcoord.liveness.interrupt_watch), its next beat
        does. A limit: a leader that took over a moment ago has watched no spare's silence (a follower watches the
        leader alone), and seats one it cannot vouch for; asking every spare then would cost each takeover a beat's
        wait."""
        def incarnations(slots: set[int]) -> dict[int, int]:
            return {s: facts[s].incarnation for s in slots if s in facts}

        awaited: set[int] = set()
        gone: set[int] = set()
        neighbours = self.nodes.beside(incarnations(outsiders), incarnations(lost)) if lost else set()
        late = {s for s in outsiders if self.observer.silent_for(f"hb/{s}") >= self._timing.evidence_silence}
        if not neighbours and not late:
            return awaited, gone
        asked = self.probe.ask(previous.generation)
        # A read after this that shows no beat: no answer (module docstring: by its next beat).
        answered_by = asked + max(self._timing.probe_grace, self._timing.heartbeat_interval)
        for slot in neighbours | late:
            name = f"hb/{slot}"
            if self.observer.changed_after(name, asked):
                continue  # alive: seated
            if slot in neighbours:
                (gone if self.observer.silent_for(name) >= self._timing.evidence_silence else awaited).add(slot)
            else:
                (gone if self.observer.silent_since(name, asked, answered_by) else awaited).add(slot)
        return awaited, gone

    def leader_gone_with_a_node(self, slot: int, incarnation: int, record: GenerationRecord | None) -> bool:
        """A leader from outside `record` (a hot spare that leads), silent for evidence_silence, on the node of a member
        that a closed-connection report of `record` names: gone with that node. A follower watches the leader alone,
        so gone_by_evidence, which judges members, never names it: without this, its deputies would wait for its
        heartbeat timeout."""
        if record is None or record.failed is not None or slot in record.members:
            return False
        if self.observer.silent_for(f"hb/{slot}") < self._timing.evidence_silence:
            return False
        named = evidence.closed_named(self._store, record.generation)
        members = {m: i for m, i in zip(record.members, record.incarnations, strict=True) if m in named}
        return bool(self.nodes.beside({slot: incarnation}, members))

    def alive(self, facts: SlotFacts, incarnation: int | None = None) -> bool:
        return not facts.is_gone(incarnation) and not self.observer.is_stale(f"hb/{facts.slot}")

    def interrupt_if_member_dead(self, record: GenerationRecord, facts: dict[int, SlotFacts], read_at: float,
                                 term: int) -> bool:
        """Interrupt the running generation when a member is dead or hung (True when this round did)."""
        members = [(m, i, facts[m]) for m, i in zip(record.members, record.incarnations, strict=True) if m in facts]
        hung = self.hung_members(record.generation, members, read_at)
        for member, inc, fact in members:
            if self.alive(fact, inc) and member not in hung:
                continue
            reason = HUNG if member in hung else (GONE if fact.is_gone(inc) else HEARTBEAT_STALE)
            if not fact.is_gone(inc):
                self._fence(member, inc, reason, term)  # a hung peer then fails the collectives at once
            declared = f"{reason}:slot={member}"
            if self._store.compare_set(keys.interrupt(record.generation), "", declared).decode() != declared:
                self._release_peers(record.generation, declared)  # another reason ended it a moment before
            self._log.warning("member_declared_dead", generation=record.generation, slot=member,
                              incarnation=inc, reason=reason,
                              silent_s=round(self.observer.silent_for(f"hb/{member}"), 3))
            return True
        return False

    def _release_peers(self, generation: int, declared: str) -> None:
        """Tell the members of `generation`, which another reason ended, that one of them is declared dead
        (`<reason>:slot=<member>`): one still blocked in a collective with it shuts its group down
        (ftcoord.liveness.group_release), rather than wait for pg_timeout. First declaration wins: one dead member
        dooms every collective."""
        if self._store.compare_set(keys.released(generation), "", declared).decode() == declared:
            self._log.warning("generation_released", generation=generation, declared=declared)

    def _fence(self, slot: int, incarnation: int, reason: str, term: int) -> bool:
        """Ask the slot's launcher to kill this incarnation (once; True when this call did). The term lets the
        launcher ignore a fence of a leader deposed before it could see the kill through."""
        if (slot, incarnation) in self.fenced:
            return False
        self._store.set(keys.fence(slot), f"{term}:{incarnation}")
        # One entry per slot: a fence of an older incarnation is answered (that process is gone) and never asked
        # about again, so a long-lived leader's memory does not grow with the fences of a long job.
        self.fenced = {key: at for key, at in self.fenced.items() if key[0] != slot}
        self._fence_terms = {key: t for key, t in self._fence_terms.items() if key[0] != slot}
        self.fenced[(slot, incarnation)] = time.monotonic()
        self._fence_terms[(slot, incarnation)] = term
        self._log.warning("rank_fenced", slot=slot, incarnation=incarnation, reason=reason)
        return True

    def unanswered_fences(self, facts: dict[int, SlotFacts], now: float) -> set[int]:
        """Slots this leader fenced less than FENCE_ANSWER_S ago whose launcher's answer these facts do not show yet
        (no replacement on its way, not dead): a decision waits for it (module docstring)."""
        return {slot for (slot, incarnation), at in self.fenced.items()
                if now - at < FENCE_ANSWER_S and slot in facts and facts[slot].incarnation == incarnation
                and not facts[slot].is_gone(incarnation) and not facts[slot].being_replaced}

    def fenced_alive(self, facts: dict[int, SlotFacts]) -> set[int]:
        """Slots whose process (the incarnation in `facts`) this leader fenced and that are not gone yet: its launcher
        has not killed it (not yet, or not at all: a launcher SIGSTOPped, or too busy to run; or none runs it). Not
        awaited, whatever its heartbeat says, once its launcher is past due (`unanswered_fences`): counted alive by
        its heartbeat, a rank fenced as hung whose launcher is paused would hold the next generation for
        join_timeout. One that announces itself is seated as any joiner: under a launcher it ends itself first while
        this leader leads (ftcoord.protocol.slots.fenced, from raise_if_superseded), and a deposed leader's fence
        names nobody (its launcher does not carry it out either); with no launcher to carry out its
        fence it is meant to take part again. Its next leader does not wait for it either: the record carries it as
        left out (the leader passes these to ftcoord.leader.readiness.still_left_out)."""
        return {slot for slot, incarnation in self.fenced
                if slot in facts and facts[slot].incarnation == incarnation and not facts[slot].is_gone(incarnation)}

    def until_fences_answered(self, now: float) -> float:
        """Seconds until the next fence's launcher is due to have answered (the leader looks again then); inf: none."""
        due = [at + FENCE_ANSWER_S - now for at in self.fenced.values() if at + FENCE_ANSWER_S > now]
        return max(0.01, min(due)) if due else math.inf

    def fence_hung_outsiders(self, running: GenerationRecord | None, facts: dict[int, SlotFacts], term: int,
                             current: int) -> None:
        """A process that hung while it was in no running generation (`running`: None when none runs) is judged by
        no interrupt: one joining, a hot spare, or a member of a generation that ended for another cause. Fence it
        too, so its launcher replaces it and its capacity is not lost for good. This holds for a member of the ended
        generation, before any generation is decided without it: a paused leader and a killed member at once may
        leave no member alive, and the new leader would wait join_timeout for the job's target size, then grow the
        job back.

        A member of a recent generation (`current` and the few before it) is declared dead to that generation's
        members too (keys.released): one of them may be blocked in a collective with it, with no launcher left to
        close its connections (its node stopped answering as another reason ended the generation), and would wait
        for pg_timeout (ftcoord.liveness.group_release)."""
        members = set(running.members) if running is not None else set()
        for slot, fact in facts.items():
            if slot not in members and not fact.is_gone() and self.observer.is_stale(f"hb/{slot}"):
                if self._fence(slot, fact.incarnation, HEARTBEAT_STALE, term):
                    self._release_last_generation_of(slot, fact.incarnation, current)

    def _release_last_generation_of(self, slot: int, incarnation: int, current: int) -> None:
        """_release_peers for the newest of the last RELEASE_LOOKBACK generations that lists this incarnation (a fence
        is rare: its records are read from the store)."""
        for generation in range(current, max(0, current - RELEASE_LOOKBACK), -1):
            record = read_record(self._store, generation)
            if record is not None and record.rank_of(slot, incarnation) is not None:
                self._release_peers(generation, f"{HEARTBEAT_STALE}:slot={slot}")
                return

    def fence_stuck_outsiders(self, record: GenerationRecord, facts: dict[int, SlotFacts], read_at: float,
                              next_generation: int, term: int) -> None:
        """A process alive outside the running generation `record` whose training thread trained here once (it
        pinged) but has not moved for progress_timeout, not waiting on peers, and has not announced itself for the
        next generation: stuck where no interrupt reaches it (it hung while its generation ended for another cause:
        a peer's fault). Nothing else judges it: its heartbeat runs, so each generation change would wait
        join_timeout for it, its capacity would be lost, and at the job's end its launcher would wait for it.
        Fenced, so its launcher replaces it. A hot spare or a process still starting has never pinged; a former
        member slow to come back, or seated as a spare, has announced itself (the announcements are read only when
        there is a candidate, rarely)."""
        if self._progress_timeout is None or math.isinf(self._progress_timeout):
            return
        members = set(record.members) | set(record.spares)  # a spare announces itself for the next one a moment later
        candidates = []
        for slot, fact in facts.items():
            name = f"outside/{slot}"
            if slot in members or fact.is_gone() or fact.progress == 0 or fact.waiting:
                self.observer.forget(name)  # measured from when it is next seen outside, not from an older visit
                continue
            # Its own account of its stillness, counted in a generation before this one (ftcoord.liveness.heartbeat).
            vouched = fact.still_s if fact.still_generation < record.generation else 0.0
            self.observer.observe(name, (fact.incarnation, fact.progress), at=read_at, vouched=vouched)
            if self.observer.is_stale(name, self._progress_timeout) and (slot, fact.incarnation) not in self.fenced:
                candidates.append(fact)
        if not candidates:
            return
        announced = {join.slot for join in read_announcements(self._store, next_generation)[0]}
        for fact in candidates:
            if fact.slot not in announced:
                self._log.warning("outsider_stuck", slot=fact.slot, incarnation=fact.incarnation,
                                  generation=record.generation,
                                  still_s=round(self.observer.silent_for(f"outside/{fact.slot}"), 3))
                self._fence(fact.slot, fact.incarnation, "stuck_outside", term)

    def fence_stuck_members_of_ended(self, ended: GenerationRecord, facts: dict[int, SlotFacts], read_at: float,
                                     next_generation: int, term: int) -> None:
        """A member of `ended` (a generation that ended for another cause: a newcomer asked in, a raise) stuck in it:
        alive, not waiting on its peers, its progress still for progress_timeout (hung_members, its stillness measured
        on from while the generation ran), and not announced for the next one. No interrupt reaches it, and its peers
        blocked in a collective with it cannot leave to rejoin. Fenced as the culprit, and declared to the ended
        generation's members (keys.released), so a peer blocked with it cuts its collective at once
        (ftcoord.liveness.group_release) rather than when its launcher's kill closes its connections."""
        if self._progress_timeout is None or math.isinf(self._progress_timeout) or ended.failed is not None:
            return
        members = [(m, i, facts[m]) for m, i in zip(ended.members, ended.incarnations, strict=True)
                   if m in facts and self.alive(facts[m], i)]
        hung = self.hung_members(ended.generation, members, read_at)
        if not hung:
            return
        announced = {join.slot for join in read_announcements(self._store, next_generation)[0]}
        for member, incarnation, _ in members:
            if member in hung and member not in announced and self._fence(member, incarnation, HUNG, term):
                self._log.warning("member_stuck_after_its_generation_ended", generation=ended.generation,
                                  slot=member, incarnation=incarnation,
                                  still_s=round(self.observer.silent_for(f"progress/{member}"), 3))
                self._release_peers(ended.generation, f"{HUNG}:slot={member}")

    def hung_members(self, generation: int, members: list[tuple[int, int, SlotFacts]], read_at: float) -> set[int]:
        """Members alive but making no progress for progress_timeout: the culprits only.

        Peers of a stuck rank block in their next collective and go silent too; those that sit in a collective
        are waiting, not stuck. If every silent member waits, the one behind the others by the step committed in
        this generation is the culprit (stuck in a collective its peers went past); if they are all level, or
        one has committed no step in this generation yet (it may wait in the heal), nobody is fenced (a
        collective deadlock: the process-group timeout ends it). Never by a count of pings: that count is a
        process's own, and a replacement's starts at 0, so the newest process would look furthest behind.
        """
        if self._progress_timeout is None or math.isinf(self._progress_timeout):
            return set()
        silent = []
        for member, _, fact in members:
            name = f"progress/{member}"  # one name per slot, the generation in its value: no growth per generation
            # Observed when it was read, not now: a duty thread paused between reading and judging (a GC) would
            # otherwise count its own pause as the member's silence.
            # Its own account of its stillness, if counted in this generation (an older one's says nothing of it).
            vouched = fact.still_s if fact.still_generation == generation else 0.0
            self.observer.observe(name, (generation, fact.progress), at=read_at, vouched=vouched)
            if self.observer.is_stale(name, self._progress_timeout):
                silent.append(fact)
        culprits = [f for f in silent if not f.waiting]
        if not culprits and silent and all(f.step >= 0 for f in silent):
            behind = min(f.step for f in silent)
            if any(f.step != behind for f in silent):
                culprits = [f for f in silent if f.step == behind]
        return {f.slot for f in culprits}
