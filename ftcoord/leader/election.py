"""Leader election: who holds the `leader` key, and who takes it over when its holder is gone.

Leadership is the `leader` key, "term:slot:incarnation" (ftcoord.protocol.generations.LeaderClaim), taken with
compare_set; a term only grows. Holding it only decides who proposes: safety comes from the record being written
once (ftcoord.leader.record_write). A leader confirms its claim before each round of writes (`Election.confirm`), and
its fences carry its term: a launcher kills on a fence only while no newer term holds the key, so a deposed leader
that wakes kills nobody. A follower reads only the holder's claim and counters (and its own incarnation, for
ftcoord.liveness.helper_watch), in one request, on the schedule of ftcoord.leader.cadence. It takes the key from a
holder that released it or is gone (ftcoord.leader.judge), and watches everyone else afresh: evidence needs no history.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
import torch.distributed as dist

from ftcoord.leader.judge import Judge
from ftcoord.protocol import keys, restore
from ftcoord.protocol.generations import LeaderClaim
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import SlotFacts, read_facts_and
from ftcoord.store.client import get_or_none


class Election:
    """One process's side of the election: the claim it holds, or the holder it follows."""

    def __init__(self, store: dist.Store, slot: int, incarnation: int, judge: Judge,
                 log: structlog.typing.FilteringBoundLogger, saw_incarnation: Callable[[int], None],
                 on_elected: Callable[[], None]) -> None:
        """`saw_incarnation(n)`: the newest incarnation of this process's slot, as a follower's round read it;
        `on_elected()`: this process took the leadership (a new term: what it saw open in an earlier one is stale)."""
        self._store = store
        self._slot = slot
        self._incarnation = incarnation
        self._judge = judge
        self._log = log
        self._saw_incarnation = saw_incarnation
        self._on_elected = on_elected
        self.claim: LeaderClaim | None = None
        """The claim this process holds (it leads), or None (it follows)."""
        self._holder: LeaderClaim | None = None  # as a follower: the claim last read
        self._last_holder: LeaderClaim | None = None  # the claim last read, kept while _holder is learnt afresh
        self._terms_seen = 0

    @property
    def term(self) -> int:
        """The term this process leads in; 0 when it follows."""
        return self.claim.term if self.claim else 0

    def follow(self, pinned: int) -> tuple[float, dict[int, SlotFacts], LeaderClaim | None]:
        """A follower's round: the leader's claim and its holder's counters (and our own incarnation), in one request,
        observed by the judge. Returns (read_at, facts, holder); holder None when there is nobody to judge yet (the
        key was absent and this process claimed the first term, or a new holder is judged from the next round on).
        `pinned`: the store instance the round's observations must come from (ftcoord.store.link)."""
        read_at = time.monotonic()
        holder = self._holder
        if holder is None:  # absent: claim the first term; present: learn the holder
            first = LeaderClaim(1, self._slot, self._incarnation)
            holder = LeaderClaim.parse(self._store.compare_set(keys.LEADER, "", str(first)))
            if holder == first:
                self._become(first)
                return read_at, {}, None
        watched = [holder.slot] if holder.slot is not None else []
        values, facts = read_facts_and(self._store, watched, [keys.LEADER, keys.incarnation(self._slot)],
                                       pinned=pinned)
        self._saw_incarnation(int(values[1] or 0))
        claim = LeaderClaim.parse(values[0])
        self._terms_seen = max(self._terms_seen, claim.term)
        if claim.slot == self._slot and claim.incarnation == self._incarnation:  # written back for us (a restart)
            self._become(claim)
            return read_at, {}, None
        if claim != holder:  # a new holder: judged from the next round on
            self._holder = claim
            return read_at, {}, None
        self._holder = holder
        self._judge.observe(facts, read_at, replacing=False)
        return read_at, facts, holder

    def try_acquire(self, holder: LeaderClaim, facts: dict[int, SlotFacts], closed_in: GenerationRecord | None) -> None:
        """Take the leadership from a holder that released it, or is gone (by evidence or silence). `closed_in`: a
        generation whose collective closed under this process (a hint to look at the evidence about its members)."""
        if holder.slot is not None:
            fact, judge = facts.get(holder.slot), self._judge
            if fact is None or (judge.alive(fact, holder.incarnation)
                                and holder.slot not in judge.gone_by_evidence(closed_in)
                                and not judge.leader_gone_with_a_node(holder.slot, holder.incarnation, closed_in)):
                return
        mine = LeaderClaim(holder.term + 1, self._slot, self._incarnation)
        won = self._store.compare_set(keys.LEADER, str(holder), str(mine)).decode()
        if won == str(mine):
            silent = self._judge.observer.silent_for(f"hb/{holder.slot}") if holder.slot is not None else None
            self._become(mine, previous=holder, previous_silent_s=None if silent is None else round(silent, 3))
        else:
            self._holder = None  # someone else moved first: learn who next round

    def confirm(self) -> bool:
        """Before a round of writes: the key still holds our claim (else we lost it, and follow from now on)."""
        held = get_or_none(self._store, keys.LEADER)
        if held is not None and held.decode() == str(self.claim):
            return True
        self.lose(LeaderClaim.parse(held or b"0"))
        return False

    def lose(self, held: LeaderClaim) -> None:
        """Another claim holds the key: follow its holder."""
        self._log.warning("leader_lost", term=self.claim.term if self.claim else None, holder=str(held))
        self.claim = None
        self._holder = held
        self._terms_seen = max(self._terms_seen, held.term)

    def release(self) -> None:
        """Hand the leadership over (this process stops): the key says "term:released", so a follower takes the next
        term at once, without waiting to judge us gone."""
        if self.claim is None:
            return
        released = LeaderClaim(self.claim.term, None, None)
        try:
            self._store.compare_set(keys.LEADER, str(self.claim), str(released))
            self._log.info("leader_released", term=self.claim.term)
        except Exception:  # the store is gone: nobody to hand over to
            pass
        self.claim = None

    def rebuild(self, store: dist.Store, record: GenerationRecord | None) -> bool:
        """The store restarted (ftcoord.protocol.restore): write back the newest term known (a term only grows): our
        claim, or as a follower the holder's claim we last read when it is of that term. Not "term:released" then:
        that hands the lead over at once, and a follower that came back first would depose a live leader (whose
        fences and judgement would go with it). True when the key holds our own claim after it."""
        claim = self.claim
        holder = self._holder or self._last_holder
        term = max(self._terms_seen, claim.term if claim else 0, record.leader_term if record else 0,
                   holder.term if holder else 0)
        written = claim
        if claim is None and holder is not None and holder.slot is not None and holder.term == term:
            written = holder
        held = restore.leader_term(store, str(written) if written is not None else None, term)
        return claim is not None and held == str(claim)

    def forget_holder(self) -> None:
        """The store restarted: learn the holder afresh from the new instance (the last one read is kept for a rebuild
        meanwhile: a second restart before the next round)."""
        self._last_holder, self._holder = self._holder or self._last_holder, None

    def _become(self, claim: LeaderClaim, previous: LeaderClaim | None = None,
                previous_silent_s: float | None = None) -> None:
        """`previous_silent_s`: how long the holder taken over from was seen silent (its heartbeat)."""
        self.claim = claim
        self._on_elected()
        self._log.info("leader_elected", term=claim.term, previous=str(previous) if previous else None,
                       **({"previous_silent_s": previous_silent_s} if previous_silent_s is not None else {}))
