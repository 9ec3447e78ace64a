"""When the leader may decide an open generation: who it waits for, and for how long.

Recovery at the speed of evidence, not of timeouts: the leader decides at once when every live slot has joined (a
starting job: every worker; spares only at last call). A slot is dead without waiting when there is evidence
(ftcoord.leader.judge); silence for heartbeat_timeout is the last resort; a fenced process is awaited until its
launcher answers. A replacement on its way, or a live member holding state no joiner holds, is waited for up to
barrier_timeout; a process alive but slow to join, up to join_timeout after the last arrival; then a partial quorum.
Once: a process left out so is not awaited again until it announces itself (`still_left_out`; the record carries it).
The rule reads nothing from the store: the leader (ftcoord.leader.duty) brings what it observed, and one OpenClock.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftcoord.config import QuorumPolicy, Timing
from ftcoord.leader.judge import Judge
from ftcoord.protocol.record import GenerationRecord, JoinRequest
from ftcoord.protocol.slots import SlotFacts
from ftcoord.protocol.spares import SPARE_SLOT_BASE


@dataclass
class OpenClock:
    """The leader's own clock on a generation that may be decided."""

    first_seen: float
    last_change: float
    joiners_seen: int = -1


@dataclass(frozen=True)
class Readiness:
    decide: bool
    """Decide now: everyone awaited joined, or it is the last call."""
    everyone: bool
    """Everyone awaited joined (otherwise a decision now is a partial quorum)."""
    expecting: int
    """How many announcements to poll for before judging again: the next one, or, when some
    are missing, all of theirs."""
    missing: frozenset[int] = frozenset()
    """Slots awaited that have not joined (a decision now leaves them out)."""
    gone: frozenset[int] = frozenset()
    """Members of the previous generation not awaited on the evidence of a closed connection, though alive by their
    heartbeats (not yet heartbeat_timeout old): a decision now leaves them out too, and its record says so, so that
    a next leader, which saw none of the evidence, does not wait for them either (`still_left_out`)."""
    not_live: frozenset[int] = frozenset()
    """Joiners from outside the previous generation (hot spares) gone with a node lost under it, or silent and
    unanswering: not seated (Judge.outsiders_in_doubt)."""


def readiness(live: list[JoinRequest], announced: int, facts: dict[int, SlotFacts], clock: OpenClock, now: float,
              judge: Judge, previous: GenerationRecord | None, running: bool, policy: QuorumPolicy,
              timing: Timing) -> Readiness:
    """Whether to decide now, given the live joiners (announcements whose incarnation is alive) and `announced`
    (how many announcements were made); `running`: a member of the previous generation is alive. Who `previous`
    left out at a last call is not awaited again (`still_left_out`)."""
    if len(live) != clock.joiners_seen:
        clock.joiners_seen, clock.last_change = len(live), now
    joined_slots = {j.slot for j in live}
    # Members gone by the evidence of a closed connection: no waiting for their heartbeat timeout.
    gone = judge.gone_by_evidence(previous, joined_slots)
    # A hot spare on the node of members gone so (no launcher said so: the node is lost), or one silent for
    # evidence_silence, is awaited until it proves alive, or is gone.
    lost = {s for s in gone if s in facts and not facts[s].is_gone()}
    outsiders = joined_slots - set(previous.members) if previous is not None else set()
    doubted: set[int] = set()
    not_live: set[int] = set()
    if outsiders and previous is not None:
        doubted, not_live = judge.outsiders_in_doubt(previous, lost, outsiders, facts)
    left_out = left_out_by(previous)
    fenced = judge.fenced_alive(facts)  # out, whatever their heartbeats say (awaited below until answered)
    expected = {s for s, f in facts.items()
                if judge.alive(f) and s not in gone and s not in fenced and left_out.get(s) != f.incarnation}
    on_its_way: set[int] = set()
    if len(live) - len(not_live) < policy.target_world_size:  # a spare not seated is no joiner
        # Below target: wait for replacements a launcher is starting, rather than shrink now
        # and grow back a moment later. At target (a hot spare stepped in) nothing to wait for.
        on_its_way = {s for s, f in facts.items() if f.being_replaced and s not in joined_slots
                      and not judge.observer.is_stale(f"replacing/{s}")}
        # A process fenced a moment ago: its launcher has not said yet whether a replacement comes
        # (ftcoord.leader.judge).
        expected |= on_its_way | judge.unanswered_fences(facts, now)
    # A job starting (or restarting as a whole: no member of the last generation is
    # alive) waits for its target size of workers (a spare is seated only at last call, when
    # a worker is still missing); a running job re-forms with whoever is alive.
    workers = sum(1 for j in live if j.slot < SPARE_SLOT_BASE)
    everyone = expected <= joined_slots and (running or workers >= policy.target_world_size) and not doubted
    # Last call: join_timeout after the last arrival for processes that are alive but slow to
    # join; a replacement whose launcher keeps saying it is on its way (a cold start on a busy
    # node), or a live member holding the state no joiner holds, is waited for up to barrier_timeout.
    missing = expected - joined_slots
    if missing and (missing <= on_its_way or _state_left_behind(live, missing, facts, previous, running)):
        last_call = now - clock.first_seen >= timing.barrier_timeout
    else:
        last_call = now - clock.last_change >= timing.join_timeout
    return Readiness(decide=(everyone or last_call) and not doubted, everyone=everyone,
                     expecting=announced + max(1, len(missing)), missing=frozenset(missing),
                     gone=frozenset(s for s in gone if s in facts and judge.alive(facts[s])),  # none joined
                     not_live=frozenset(not_live))


def _state_left_behind(live: list[JoinRequest], missing: set[int], facts: dict[int, SlotFacts],
                       previous: GenerationRecord | None, running: bool) -> bool:
    """No joiner holds the running state (none is a member of `previous`, in the same incarnation), and a member
    that does is alive and missing: slow, or blocked in a collective behind a stuck peer until the leader fences that
    one (Judge.fence_stuck_members_of_ended). A last call would decide the joiners alone, from a checkpoint, while
    the state they would continue stands in live processes. Such a member is awaited as a replacement on its way
    is, up to barrier_timeout; once one member joins, the state goes on with it and the others are awaited
    join_timeout. The price: a sole holder that is stuck (not blocked) holds the decision until it is fenced at
    progress_timeout."""
    if not running or previous is None or previous.failed is not None:
        return False
    if any(previous.rank_of(j.slot, j.incarnation) is not None for j in live):
        return False
    return any(s in facts and previous.rank_of(s, facts[s].incarnation) is not None for s in missing)


def left_out_by(record: GenerationRecord | None) -> dict[int, int]:
    """slot -> incarnation of the processes `record` lists as left out (the record carries them, so whoever leads
    next knows them)."""
    return dict(record.left_out) if record is not None and record.failed is None else {}


def still_left_out(record: GenerationRecord, missing: frozenset[int], facts: dict[int, SlotFacts],
                   previous: GenerationRecord | None) -> dict[int, int]:
    """After deciding `record` without the slots `missing` (Readiness.missing and .gone: awaited at a last call, or
    gone by evidence): slot -> incarnation of the processes alive and left out, not to be awaited again
    (`previous`'s, carried on, and `missing`). One stays so until it announces itself (the record considered it) or
    its slot has a new incarnation; a replacement on its way is a new incarnation, never left out. A leader that
    decides after a leader that died knows them from the record, and does not wait for their heartbeat timeout: a
    lost node's members, left out on the evidence of their peers' closed connections, and the processes the deciding
    leader fenced that are not dead yet (the leader passes them with `missing`), whose silence it never watched."""
    considered = {slot for slot, _ in record.considered}
    kept = {s: i for s, i in left_out_by(previous).items()
            if s not in considered and s in facts and facts[s].incarnation == i}
    kept.update({s: facts[s].incarnation for s in missing if s in facts and not facts[s].being_replaced
                 and s not in considered})
    return kept
