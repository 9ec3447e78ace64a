"""Who looks at the leader, and how often (ftcoord.leader.cadence): the deputies every tick while they join, the others
of
a large job sharing the watch, and a follower that asked the members to beat looking for the answers on time.

The cadence alone needs no store; the look after a question runs real Participants (threads) on a real store.
"""

from __future__ import annotations

import time

import pytest

from ftcoord import StoreServer
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.leader import cadence
from ftcoord.leader.cadence import DEPUTY_FACTOR, Cadence
from ftcoord.protocol.evidence import report_closed
from ftcoord.protocol.record import GenerationRecord
from ftcoord.wrapper.participant import Participant
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)

TIMING = Timing()  # the defaults: a tick of 0.25 s, evidence_silence 0.75 s, probe_grace 0.25 s


def _record(world: int) -> GenerationRecord:
    """A generation of `world` members in slot order, led by slot 0."""
    members = tuple(range(world))
    return GenerationRecord(generation=1, members=members, incarnations=tuple(1 for _ in members), leader=0,
                            leader_term=1, target_world_size=world)


def _cadence(slot: int, world: int) -> Cadence:
    cadence = Cadence(slot, 1, TIMING)
    cadence.note_record(_record(world))
    return cadence


def _hurried(cadence: Cadence) -> float:
    cadence.hurry(True)
    try:
        return cadence.interval()
    finally:
        cadence.hurry(False)


def test_a_large_jobs_followers_share_the_watch_while_they_join() -> None:
    """While it joins, a deputy looks every tick whatever the job's size, and so does every follower of a small job.
    In a large one the others share the watch: a tick more between two looks per LOOKERS_PER_TICK of them, up to
    evidence_silence. Each of 4,096 looked every tick (up to ~16,000 reads a second at the store while they joined;
    sabotage: every hurried follower looking every tick fails here)."""
    tick, most = TIMING.tick, TIMING.evidence_silence
    assert _hurried(_cadence(1, 4096)) == tick  # the leader's deputies: ranks 1 and 2
    assert _hurried(_cadence(2, 4096)) == tick
    assert _hurried(_cadence(5, 8)) == tick  # five others: a small job looks as before
    assert _hurried(_cadence(5, 3 + cadence.LOOKERS_PER_TICK)) == tick
    assert _hurried(_cadence(5, 4 + cadence.LOOKERS_PER_TICK)) == 2 * tick
    assert _hurried(_cadence(100, 4096)) == most
    assert _hurried(_cadence(5000, 4096)) == most  # a hot spare outside the generation shares it too
    # Between joins nothing changes: the deputies every watch_interval, the others DEPUTY_FACTOR times less often.
    assert _cadence(1, 4096).interval() == TIMING.watch_interval
    assert _cadence(100, 4096).interval() == DEPUTY_FACTOR * TIMING.watch_interval


def test_a_follower_that_asked_the_members_to_beat_looks_for_the_answers_when_the_grace_ends(
        store_server: StoreServer, job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower judging the leader on evidence (a connection closed under its generation) asks every member to
    beat (a probe), and the leader is gone if it stays silent for probe_grace after the question. Looking every tick,
    the follower's next look came when the grace ended; one of a large job looks every evidence_silence while it
    joins (three ticks), and must still look when the grace ends, or a leader lost with its deputies (a node) is
    replaced 0.5 s later. Six participants stand for a large job here (LOOKERS_PER_TICK = 1: the three others look
    every three ticks). Sabotage: Judge.next_look ignoring the question fails (its next look came 0.75 s after)."""
    monkeypatch.setattr(cadence, "LOOKERS_PER_TICK", 1)
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(6), TIMING).start() for slot in range(6)]
    try:
        join_together(*parts, timeout=30)
        follower = next(p for p in parts if not p.leader.is_leader and not p.leader._cadence.deputy)  # noqa: SLF001
        duty = follower.leader
        assert duty._cadence._hurried() == TIMING.evidence_silence  # noqa: SLF001 - it stands for a large job's
        record = follower.record
        assert record is not None
        report_closed(follower.store, record.generation, follower.slot,
                      ConnectionError("Connection closed by peer [127.0.0.1]:1"))
        with duty.hurried():
            duty.note_closed(record)
            duty._poke.set()  # noqa: SLF001 - look now (a follower's turn may be seconds away)
            wait_until(lambda: record.generation in duty._judge.probe._asked, 10,  # noqa: SLF001
                       "the follower to ask the members to beat")
            asked = time.monotonic()
            looks = follower.link.requests()[("leader", "multi_get")]
            wait_until(lambda: follower.link.requests()[("leader", "multi_get")] > looks, 5, "its next look")
            took = time.monotonic() - asked
        assert took < (TIMING.probe_grace + TIMING.evidence_silence) / 2, (
            f"the follower looked again {took:.2f} s after its question: not when its grace "
            f"({TIMING.probe_grace} s) ended, but at its next turn ({TIMING.evidence_silence} s)")
    finally:
        for p in parts:
            p.close()
