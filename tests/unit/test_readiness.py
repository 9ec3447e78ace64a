"""When the leader may decide: a process it fenced a moment ago is waited for until its launcher answers."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

from ftcoord import StoreServer, connect, job_store
from ftcoord.config import FENCE_ANSWER_S, QuorumPolicy, Timing
from ftcoord.leader.judge import Judge
from ftcoord.leader.proposal import Proposer
from ftcoord.leader.readiness import OpenClock, Readiness, left_out_by, readiness, still_left_out
from ftcoord.liveness.heartbeat import LivenessObserver
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.record import GenerationRecord, JoinRequest
from ftcoord.protocol.slots import SlotFacts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _facts(slot: int, beat: int, dead: int = 0, replacing: int = 0) -> SlotFacts:
    return SlotFacts(slot=slot, incarnation=2, heartbeat=beat, progress=0, waiting=False, dead=dead, left=0,
                     replacing=replacing)


def test_a_fenced_member_is_waited_for_until_its_launcher_answers(store_server: StoreServer, job_id: str) -> None:
    """A member silent for heartbeat_timeout is fenced; its launcher answers within FENCE_POLL_S: a replacement on
    its way (then killed), or dead. The leader's reads of that round are from before the answer; deciding on them
    shrank the world, and the replacement grew it back a moment later (the demo's hung rank, CI). So the fenced
    slot is waited for until the answer shows, or FENCE_ANSWER_S pass (its node is lost too). Sabotage: without
    the wait, the first decision below is made at once."""
    timing, clock = Timing(), Clock()
    judge = Judge(job_store(connect(store_server.address), job_id), timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    previous = GenerationRecord(generation=3, members=(0, 1, 2), incarnations=(2, 2, 2), leader=0, leader_term=1,
                                target_world_size=3)
    facts = {s: _facts(s, beat=10) for s in (0, 1, 2)}
    judge.observe(facts, read_at=clock.now)
    clock.now += timing.heartbeat_timeout + 0.1
    facts = {0: _facts(0, beat=20), 1: _facts(1, beat=10), 2: _facts(2, beat=20)}  # slot 1 silent since
    judge.observe(facts, read_at=clock.now)
    assert judge.interrupt_if_member_dead(previous, facts, clock.now, term=1)  # fences slot 1's incarnation 2
    fenced_at = judge.fenced[(1, 2)]
    live = [JoinRequest(4, s, 2, 30) for s in (0, 2)]

    def decide(facts: dict[int, SlotFacts], at: float) -> bool:
        ready = readiness(live, len(live), facts, OpenClock(at, at), at, judge, previous, True, QuorumPolicy(3),
                          timing)
        return ready.decide

    assert not decide(facts, fenced_at + 0.01), "decided without the fenced member before its launcher answered"
    replacing = {**facts, 1: _facts(1, beat=10, replacing=3)}
    judge.observe(replacing, read_at=clock.now)  # the round that reads it observes it too
    assert not decide(replacing, fenced_at + 0.2), "a replacement on its way is waited for"
    dead = {**facts, 1: _facts(1, beat=10, dead=2)}
    assert decide(dead, fenced_at + 0.2), "dead with no replacement coming: decide without it at once"
    assert decide(facts, fenced_at + FENCE_ANSWER_S + 0.01), "no answer at all (its node is lost): decide"
    # ... and the leader looks again right when that is due, not a tick or a round later
    assert abs(judge.until_fences_answered(fenced_at + 0.1) - (FENCE_ANSWER_S - 0.1)) < 1e-6
    assert judge.until_fences_answered(fenced_at + FENCE_ANSWER_S + 0.01) == math.inf


def test_a_process_left_out_at_a_last_call_is_not_awaited_again_until_it_announces(store_server: StoreServer,
                                                                                    job_id: str) -> None:
    """Slot 2 is alive (its heartbeat runs) but its training thread never comes back to join (stuck while its
    generation ended for another cause). The first decision waits join_timeout for it, as for any slow process;
    every later one waited join_timeout again (random schedule, seed 777: four generation changes in a row, 3 s
    each). Left out once, it is not awaited again, until it announces itself or a new incarnation takes its slot."""
    timing, clock = Timing(), Clock()
    judge = Judge(job_store(connect(store_server.address), job_id), timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    facts = {s: _facts(s, beat=10) for s in (0, 1, 2)}
    judge.observe(facts, read_at=clock.now)
    clock.now += 1.0
    facts = {s: _facts(s, beat=12) for s in (0, 1, 2)}
    judge.observe(facts, read_at=clock.now)
    previous = GenerationRecord(generation=3, members=(0, 1, 2), incarnations=(2, 2, 2), leader=0, leader_term=1,
                                target_world_size=3)
    live = [JoinRequest(4, s, 2, 30) for s in (0, 1)]
    at = clock.now

    def leaving_out(left_out: dict[int, int]) -> GenerationRecord:
        """The previous generation's record as its leader wrote it (it carries who it left out), through JSON."""
        return GenerationRecord.from_json(replace(previous, left_out=tuple(sorted(left_out.items()))).to_json())

    def ready(left_out: dict[int, int], now: float, clock: OpenClock | None = None):  # type: ignore[no-untyped-def]
        return readiness(live, len(live), facts, clock or OpenClock(at, at), now, judge, leaving_out(left_out), True,
                         QuorumPolicy(3), timing)

    open_clock = OpenClock(at, at)
    first = ready({}, at, open_clock)
    assert not first.decide and first.missing == {2}, "a live process is waited for, the first time"
    last_call = ready({}, at + timing.join_timeout, open_clock)
    assert last_call.decide and not last_call.everyone and last_call.missing == {2}
    record = GenerationRecord(generation=4, members=(0, 1), incarnations=(2, 2), leader=0, leader_term=1,
                              target_world_size=3, considered=((0, 2), (1, 2)))
    left_out = still_left_out(record, last_call.missing, facts, previous)
    assert left_out == {2: 2}
    again = ready(left_out, at)
    assert again.decide and again.everyone, "a process left out at the last call was awaited again"
    # Still not announced at the next decision: it stays left out; announced, or a new incarnation: it does not.
    assert still_left_out(record, again.missing, facts, leaving_out(left_out)) == {2: 2}
    joined = GenerationRecord(generation=5, members=(0, 1, 2), incarnations=(2, 2, 2), leader=0, leader_term=1,
                              target_world_size=3, considered=((0, 2), (1, 2), (2, 2)))
    assert still_left_out(joined, frozenset(), facts, leaving_out(left_out)) == {}
    replaced = {**facts, 2: SlotFacts(slot=2, incarnation=3, heartbeat=1, progress=0, waiting=False, dead=0, left=0,
                                      replacing=0)}
    assert still_left_out(record, frozenset(), replaced, leaving_out(left_out)) == {}
    assert not ready({2: 1}, at).decide, "an older incarnation's absence excuses the newer one's"
    # Whoever leads next knows it from the record (or it would wait for it once more); nothing before the first.
    assert left_out_by(leaving_out(left_out)) == {2: 2}
    assert left_out_by(None) == {}


def test_members_gone_by_evidence_are_not_awaited_by_the_next_leader(store_server: StoreServer, job_id: str) -> None:
    """A node is lost (no launcher left to say so): its members' peers report closed connections, and the leader
    decides without them, silent for evidence_silence, long before their heartbeat timeout. Then that leader dies
    too. Its successor knew nothing of the evidence and saw the lost members alive by their heartbeats (not yet
    heartbeat_timeout old), so it waited for them until they went stale (mixed schedule L: 2.3 s, where the
    replacement of the dead leader announced itself 0.17 s after the kill). The record carries them as left out,
    as it carries those left out at a last call: the next leader decides at once."""
    timing, clock = Timing(), Clock()
    store = job_store(connect(store_server.address), job_id)
    judge = Judge(store, timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    old = GenerationRecord(generation=7, members=(0, 1, 2, 3), incarnations=(2, 2, 2, 2), leader=2, leader_term=1,
                           target_world_size=4)
    facts = {s: _facts(s, beat=10) for s in (0, 1, 2, 3)}
    judge.observe(facts, read_at=clock.now)
    clock.now += timing.evidence_silence + 0.1
    facts = {0: _facts(0, beat=10), 1: _facts(1, beat=10), 2: _facts(2, beat=14), 3: _facts(3, beat=14)}
    judge.observe(facts, read_at=clock.now)  # slots 0 and 1 silent since: their node is gone
    store.append(keys.evidence(7), "closed 0 2\n")
    live = [JoinRequest(8, s, 2, 70) for s in (2, 3)]
    at = clock.now
    first = readiness(live, 2, facts, OpenClock(at, at), at, judge, old, True, QuorumPolicy(4), timing)
    assert first.decide and first.everyone, "members gone by evidence are awaited"
    record = GenerationRecord(generation=8, members=(2, 3), incarnations=(2, 2), leader=2, leader_term=1,
                              target_world_size=4, considered=((2, 2), (3, 2)))
    left_out = still_left_out(record, first.missing | first.gone, facts, old)
    assert left_out == {0: 2, 1: 2}, "the record does not carry the members it left out on evidence"
    record = GenerationRecord.from_json(replace(record, left_out=tuple(sorted(left_out.items()))).to_json())

    # Slot 2 (the leader) dies at once; slot 3 leads, with a judge that saw none of it, and its replacement announces.
    successor = Judge(store, timing, None, get_logger())
    successor.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    facts = {**facts, 2: SlotFacts(slot=2, incarnation=3, heartbeat=1, progress=0, waiting=False, dead=0, left=0,
                                   replacing=0)}
    successor.observe(facts, read_at=clock.now)
    live = [JoinRequest(9, 2, 3, 80), JoinRequest(9, 3, 2, 80)]
    now = clock.now
    ready = readiness(live, 2, facts, OpenClock(now, now), now, successor, record, True, QuorumPolicy(4), timing)
    assert ready.decide and ready.everyone, f"the next leader waits for the lost node's members: {ready}"
    # A member left out so that announces itself (it was alive after all) is considered, and no longer left out.
    rejoined = replace(record, generation=9, members=(0, 2, 3), incarnations=(2, 3, 2),
                       considered=((0, 2), (2, 3), (3, 2)))
    assert still_left_out(rejoined, ready.missing | ready.gone, facts, record) == {1: 2}


def _launched(store: object, slot: int, launcher_pid: int) -> None:
    """What a launcher reports when it starts a slot's process (ftcoord.protocol.launcher_report): the node it runs
    on."""
    store.set(keys.launcher(slot), json.dumps({"host": "node", "launcher_pid": launcher_pid}))  # type: ignore[attr-defined]


def test_a_hot_spare_on_a_lost_node_is_not_seated_until_it_proves_alive(store_server: StoreServer,
                                                                          job_id: str) -> None:
    """A node is lost with its launcher, two members and the job's hot spare on it. The members are gone by the
    evidence of their peers' closed connections; the spare's announcement stands and its heartbeat is not
    heartbeat_timeout old, so it was seated, and the generation could not form until it was (chaos: 2.1 s at the
    scenario timing, 5 s at the defaults). A spare on the lost members' node is now awaited until it beats after the
    leader's question, or is gone with them after evidence_silence; one on another node is seated at once.
    Sabotage: without the doubt, the first decision below is made at once, with the dead spare."""
    timing, clock = Timing(), Clock()
    # the leader's question is timed on the real clock (ftcoord.protocol.evidence.Probe)
    clock.now = time.monotonic() - 1.0
    store = job_store(connect(store_server.address), job_id)
    judge = Judge(store, timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    spare, far_spare = 100000, 100002
    for slot, launcher_pid in ((0, 11), (1, 11), (spare, 11), (2, 22), (3, 22), (far_spare, 22)):
        _launched(store, slot, launcher_pid)
    old = GenerationRecord(generation=7, members=(0, 1, 2, 3), incarnations=(2, 2, 2, 2), leader=2, leader_term=1,
                           target_world_size=4)
    slots = (0, 1, 2, 3, spare, far_spare)
    judge.observe({s: _facts(s, beat=10) for s in slots}, read_at=clock.now)
    # Node 11 lost: its members silent since, its spare beat once more just before; node 22's beat.
    clock.now += timing.evidence_silence + 0.1
    facts = {s: _facts(s, beat=10 if s in (0, 1) else 11 if s == spare else 14) for s in slots}
    judge.observe(facts, read_at=clock.now)
    store.append(keys.evidence(7), "closed 0 2\n")

    def ready(joiners: tuple[int, ...], facts: dict[int, SlotFacts]) -> Readiness:
        """The readiness of a job whose slots are the old members and these joiners (one spare or the other)."""
        live = [JoinRequest(8, s, 2, 70) for s in joiners]
        facts = {s: f for s, f in facts.items() if s in old.members or s in joiners}
        return readiness(live, len(live), facts, OpenClock(clock.now, clock.now), clock.now, judge, old, True,
                         QuorumPolicy(4), timing)

    first = ready((2, 3, spare), facts)
    assert first.gone == {0, 1}, first
    assert not first.decide, "a hot spare on the lost node was seated before it proved alive"
    assert ready((2, 3, far_spare), facts).decide, "a hot spare on another node was not seated at once"
    # Still silent evidence_silence later: gone with its node, not seated.
    clock.now += timing.evidence_silence
    judge.observe(facts, read_at=clock.now)
    later = ready((2, 3, spare), facts)
    assert later.decide and later.not_live == {spare}, later
    near = {s: f for s, f in facts.items() if s != far_spare}
    proposal = Proposer(2, 1, QuorumPolicy(4), timing).propose(
        8, [JoinRequest(8, s, 2, 70) for s in (2, 3, spare)], 3, near, clock.now, OpenClock(clock.now, clock.now),
        clock.now, judge, old, True)
    assert proposal.record is not None and proposal.record.members == (2, 3), proposal.record
    # One that beats after the question is alive after all: seated.
    beating = {**facts, spare: _facts(spare, beat=12)}
    clock.now = max(clock.now, time.monotonic()) + 0.01
    judge.observe(beating, read_at=clock.now)
    alive = ready((2, 3, spare), beating)
    assert alive.decide and not alive.not_live, alive

    # A deputy that took over from a leader lost with the node asked its question as it took over, before its first
    # read of the spare: that first read is no beat (taken for one, the dead spare was seated: chaos, 2.4 s).
    successor = Judge(store, timing, None, get_logger())
    successor.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    successor.probe.ask(7)
    judge = successor
    clock.now = max(clock.now, time.monotonic()) + 0.01
    judge.observe(facts, read_at=clock.now)
    clock.now += timing.evidence_silence
    judge.observe(facts, read_at=clock.now)
    taken_over = ready((2, 3, spare), facts)
    assert taken_over.decide and taken_over.not_live == {spare}, taken_over


def test_a_hot_spare_seen_silent_is_not_seated_until_it_answers(store_server: StoreServer, job_id: str) -> None:
    """A hot spare announces itself ahead of the generation it may be seated in; SIGSTOPped since, its announcement
    stood, and a leader seated it in place of a killed member (its launcher said so: no node is lost): the generation
    could not form until the spare's heartbeat timeout (random schedule 33053: the spare led, a deputy judged it gone
    by its silence, took over and seated it; 3.5 s at the defaults). A spare this leader saw silent for
    evidence_silence is now asked: gone once a read a heartbeat interval after the question shows no beat (an
    announced spare answers by its next beat); seated when it beats. One whose silence this leader has not watched
    that long (it took over a moment ago) is seated at once.
    Sabotage: the doubt only for a lost node's neighbours, as before: the first decision below is made at once."""
    timing, clock = Timing(), Clock()
    # the leader's question is timed on the real clock (ftcoord.protocol.evidence.Probe)
    clock.now = time.monotonic() - 1.0
    store = job_store(connect(store_server.address), job_id)
    judge = Judge(store, timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    spare = 100000
    old = GenerationRecord(generation=4, members=(0, 1, 2), incarnations=(2, 2, 2), leader=2, leader_term=3,
                           target_world_size=3)
    slots = (0, 1, 2, spare)
    judge.observe({s: _facts(s, beat=10) for s in slots}, read_at=clock.now)
    clock.now += timing.evidence_silence + 0.1
    killed = {0: _facts(0, beat=20), 1: _facts(1, beat=20), 2: _facts(2, beat=10, dead=2), spare: _facts(spare, 10)}
    judge.observe(killed, read_at=clock.now)

    def ready(facts: dict[int, SlotFacts], judge: Judge = judge) -> Readiness:
        live = [JoinRequest(5, s, 2, 40) for s in (0, 1, spare)]
        return readiness(live, len(live), facts, OpenClock(clock.now, clock.now), clock.now, judge, old, True,
                         QuorumPolicy(3), timing)

    first = ready(killed)
    assert not first.decide, "a hot spare seen silent was seated before it answered"
    clock.now = max(clock.now, time.monotonic()) + timing.probe_grace + 0.01  # no beat since the question, but
    judge.observe(killed, read_at=clock.now)  # a spare that announced answers by its next beat, an interval after
    assert not ready(killed).decide, "a hot spare seen silent was judged before its next beat was due"
    clock.now += timing.heartbeat_interval  # no beat an interval after the question either
    judge.observe(killed, read_at=clock.now)
    unanswered = ready(killed)
    assert unanswered.decide and unanswered.not_live == {spare}, unanswered
    # Its launcher says the killed member's replacement is on its way: waited for, as below target without the spare
    # (counted as a joiner, it decided a world of one at once, grown back when the replacement came).
    coming = {**killed, 2: _facts(2, beat=10, dead=2, replacing=3)}
    judge.observe(coming, read_at=clock.now)
    waiting = ready(coming)
    assert not waiting.decide and waiting.missing == {2} and waiting.not_live == {spare}, waiting
    beating = {**killed, spare: _facts(spare, beat=11)}
    clock.now += 0.01
    judge.observe(beating, read_at=clock.now)
    answered = ready(beating)
    assert answered.decide and answered.everyone and not answered.not_live, answered

    fresh = Judge(store, timing, None, get_logger())  # took over a moment ago: it has watched nobody's silence
    fresh.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    fresh.observe(killed, read_at=clock.now)
    assert ready(killed, fresh).decide, "a hot spare whose silence this leader never watched was not seated at once"


def test_joiners_that_hold_no_state_wait_for_a_live_member_that_does(store_server: StoreServer, job_id: str) -> None:
    """Generation 3's members (0-2) are alive and have not rejoined (blocked in a collective behind a stuck peer, until
    the leader fences it: Judge.fence_stuck_members_of_ended); a replacement from outside (slot 5) announced itself.
    A last call at join_timeout decided it alone, from a checkpoint, and it trained there to the job's end while the
    members held the state it restarted (random schedule seed 33008). It waits as for a replacement on its way, up
    to barrier_timeout; once a member joins (the state goes on with it) the others get join_timeout, as before, and
    a new incarnation of a member's slot holds no state."""
    timing, clock = Timing(), Clock()
    judge = Judge(job_store(connect(store_server.address), job_id), timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    previous = GenerationRecord(generation=3, members=(0, 1, 2), incarnations=(2, 2, 2), leader=0, leader_term=1,
                                target_world_size=4)
    facts = {**{s: _facts(s, beat=10) for s in (0, 1, 2)}, 5: replace(_facts(5, beat=3), incarnation=1)}
    judge.observe(facts, read_at=clock.now)
    at = clock.now

    def ready(live: list[JoinRequest], now: float, facts: dict[int, SlotFacts] = facts) -> Readiness:
        clock = OpenClock(at, at, joiners_seen=len(live))  # they announced at `at`, nobody since
        return readiness(live, len(live), facts, clock, now, judge, previous, True, QuorumPolicy(4), timing)

    outsider = [JoinRequest(4, 5, 1, -1)]
    assert not ready(outsider, at + timing.join_timeout + 0.1).decide, "decided the joiners alone, the state left"
    assert ready(outsider, at + timing.barrier_timeout).decide
    a_member = [*outsider, JoinRequest(4, 1, 2, 30)]
    partial = ready(a_member, at + timing.join_timeout + 0.1)
    assert partial.decide and partial.missing == {0, 2}, "with a member, the others get join_timeout, as before"
    new_incarnation = {**facts, 1: replace(facts[1], incarnation=3)}
    assert not ready([*outsider, JoinRequest(4, 1, 3, -1)], at + timing.join_timeout + 0.1, new_incarnation).decide


def test_a_fenced_process_its_launcher_leaves_alive_is_not_awaited(store_server: StoreServer, job_id: str) -> None:
    """A member fenced for its silence comes back (SIGCONT) before its launcher killed it, and its launcher does not
    answer (SIGSTOPped itself, or too busy to run): the process beats again, alive by its heartbeat. It was awaited
    for join_timeout at every decision (a chaos schedule, pause-launcher: a rank fenced as hung whose launcher was
    paused held the next generation 3.2 s). Once its launcher is past due (FENCE_ANSWER_S), it is not awaited.
    Sabotage: counted alive by its heartbeat, as before: the first decision below waits for it."""
    timing, clock = Timing(), Clock()
    judge = Judge(job_store(connect(store_server.address), job_id), timing, None, get_logger())
    judge.observer = LivenessObserver(timing.heartbeat_timeout, clock=clock)
    previous = GenerationRecord(generation=3, members=(0, 1, 2), incarnations=(2, 2, 2), leader=0, leader_term=1,
                                target_world_size=3)
    judge.observe({s: _facts(s, beat=10) for s in (0, 1, 2)}, read_at=clock.now)
    clock.now += timing.heartbeat_timeout + 0.1
    silent = {0: _facts(0, beat=20), 1: _facts(1, beat=10), 2: _facts(2, beat=20)}
    judge.observe(silent, read_at=clock.now)
    assert judge.interrupt_if_member_dead(previous, silent, clock.now, term=1)  # fences slot 1's incarnation 2
    fenced_at = judge.fenced[(1, 2)]
    clock.now += 0.1
    back = {**silent, 1: _facts(1, beat=11)}  # beating again; no dead mark, no replacement: no answer
    judge.observe(back, read_at=clock.now)
    assert judge.alive(back[1]), "the fenced process must be alive by its heartbeat for this test"
    at = fenced_at + FENCE_ANSWER_S + 0.01
    others = [JoinRequest(4, s, 2, 30) for s in (0, 2)]
    ready = readiness(others, len(others), back, OpenClock(at, at), at, judge, previous, True, QuorumPolicy(3),
                      timing)
    assert ready.decide and 1 not in ready.missing, ready
