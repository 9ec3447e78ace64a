"""What the leader writes for an open generation: the record it proposes from the announcements it read.

When to decide is ftcoord.leader.readiness; who is in is ftcoord.leader.quorum; this puts them together into the
record (or, once barrier_timeout passed with too few live joiners, a failed record). Pure: it reads nothing from the
store.

The facts may be older than the announcements (ftcoord.leader.duty decides a rejoin on the round it read before the
interrupt, so that no read of every slot is on the rejoin's critical path). Then an announcement from an incarnation
the facts do not know (a process that registered since) proposes nothing: left out as not live, it would be one more
generation change at once; the leader reads afresh instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftcoord.config import QuorumPolicy, Timing
from ftcoord.leader.judge import Judge
from ftcoord.leader.quorum import choose_members
from ftcoord.leader.readiness import OpenClock, Readiness, readiness
from ftcoord.protocol.record import GenerationRecord, JoinRequest
from ftcoord.protocol.slots import SlotFacts


@dataclass(frozen=True)
class Proposal:
    ready: Readiness
    record: GenerationRecord | None
    """What to write now (None: nothing yet)."""


@dataclass(frozen=True)
class Proposer:
    """The leader's side of a proposal: who proposes, under which rules."""

    slot: int
    term: int
    policy: QuorumPolicy
    timing: Timing

    def propose(self, generation: int, joins: list[JoinRequest], announced: int, facts: dict[int, SlotFacts],
                read_at: float, clock: OpenClock, now: float, judge: Judge, previous: GenerationRecord | None,
                running: bool, fresh: bool = True) -> Proposal:
        """`joins`: the generation's announcements (`announced` made); `facts`: every slot as read at `read_at`;
        `fresh`: read after the last announcement was made (see the module docstring)."""
        live = [j for j in joins if j.slot in facts and j.incarnation == facts[j.slot].incarnation
                and judge.alive(facts[j.slot])]
        ready = readiness(live, announced, facts, clock, now, judge, previous, running, self.policy, self.timing)
        if not ready.decide:
            return Proposal(ready, None)
        if not fresh and any(j.slot not in facts or j.incarnation > facts[j.slot].incarnation for j in joins):
            return Proposal(ready, None)
        live = [j for j in live if j.slot not in ready.not_live]
        decision = choose_members(live, self.policy)
        if decision is None:
            if now - clock.first_seen < self.timing.barrier_timeout:
                return Proposal(ready, None)
            reason = (
                f"only {len(live)} live process(es) joined generation {generation} within "
                f"barrier_timeout={self.timing.barrier_timeout}s; min_world_size is "
                f"{self.policy.min_world_size}; start more processes or lower min_world_size"
            )
            return Proposal(ready, self.failed(generation, reason, read_at))
        members = decision.members
        return Proposal(ready, GenerationRecord(
            generation=generation,
            members=tuple(j.slot for j in members),
            incarnations=tuple(j.incarnation for j in members),
            leader=self.slot,
            leader_term=self.term,
            target_world_size=self.policy.target_world_size,
            heal_source=decision.heal_source,
            start_step=max((j.step for j in members), default=-1),
            spares=tuple(j.slot for j in decision.spares),
            considered=tuple(sorted((j.slot, j.incarnation) for j in live)),
            liveness_read_at=read_at,
            steps=tuple(j.step for j in members),
        ))

    def failed(self, generation: int, reason: str, read_at: float) -> GenerationRecord:
        return GenerationRecord(
            generation=generation, members=(), incarnations=(), leader=self.slot, leader_term=self.term,
            target_world_size=self.policy.target_world_size, liveness_read_at=read_at, failed=reason,
        )
