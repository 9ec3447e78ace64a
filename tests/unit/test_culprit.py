"""Whom the leader fences as stuck (ftcoord.leader.judge): among silent members the culprit, never a peer that waits
for it in a collective (Judge.hung_members); outside the running generation a process whose training thread
stopped where no interrupt reaches it (Judge.fence_stuck_outsiders). The judgement is fed reads as the leader
makes them (facts and the time they were read) against a real store; the step each member publishes is checked
through a real heartbeat."""

from __future__ import annotations

import threading
import time

import pytest

from ftcoord import StoreServer, Timing, connect, job_store
from ftcoord.leader.judge import Judge
from ftcoord.liveness.heartbeat import Heartbeat
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.record import GenerationRecord, JoinRequest
from ftcoord.protocol.slot_report import SlotReport
from ftcoord.protocol.slots import SlotFacts, read_facts, register
from ftcoord.store.client import get_or_none
from tests.helpers.frames import count_frame_looks
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(30)

PROGRESS_TIMEOUT = 1.0
TIMING = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0, join_timeout=0.3, barrier_timeout=10.0)


def member(slot: int, pings: int, step: int, waiting: bool) -> tuple[int, int, SlotFacts]:
    """A member as one read shows it: `pings` is its process's own count, `step` its last committed step."""
    return slot, 1, SlotFacts(slot, 1, heartbeat=100, progress=pings, waiting=waiting, dead=0, left=0, replacing=0,
                              step=step)


def judge(store_server: StoreServer, job_id: str) -> Judge:
    return Judge(job_store(connect(store_server.address), job_id), TIMING, PROGRESS_TIMEOUT, get_logger())


def test_members_waiting_on_a_member_not_silent_yet_are_not_fenced(store_server: StoreServer, job_id: str) -> None:
    """Seed 404 of the random schedule: slot 2 stalls at a step boundary; slots 0 and 1 wait for it in the next
    step's all-reduce. Slot 0 is a replacement (its count of pings is 6 where its peers' are ~40), and slot 2's
    last progress reached the store a moment after its peers' (its publication is rate-limited, and it was
    paused). For that moment the waiters were silent and slot 2 not yet: the leader fenced slot 0, the fresh
    process furthest behind by pings, and slot 2 then sat outside every generation."""
    judgement = judge(store_server, job_id)
    t0 = time.monotonic()
    waiters = [member(0, 6, 18, waiting=True), member(1, 41, 18, waiting=True)]
    assert judgement.hung_members(3, [*waiters, member(2, 39, 17, waiting=False)], t0) == set()
    late = t0 + 0.4  # slot 2's last progress, published a moment after its peers'
    culprit = member(2, 40, 18, waiting=False)
    assert judgement.hung_members(3, [*waiters, culprit], late) == set()
    waiters_silent = t0 + PROGRESS_TIMEOUT + 0.1  # the waiters are silent, slot 2 not for another 0.3 s
    assert judgement.hung_members(3, [*waiters, culprit], waiters_silent) == set(), (
        "a member waiting for a peer that is not silent yet was fenced")
    culprit_silent = late + PROGRESS_TIMEOUT + 0.1
    assert judgement.hung_members(3, [*waiters, culprit], culprit_silent) == {2}


def test_members_all_waiting_are_judged_by_step_not_by_their_own_count_of_pings(store_server: StoreServer,
                                                                                job_id: str) -> None:
    """Every silent member waiting: the culprit is the one a step behind (stuck in a collective its peers went
    past); all level is a collective deadlock, left to the process-group timeout. A replacement's count of pings
    is lower than its peers' and says nothing about where it is."""
    judgement = judge(store_server, job_id)
    t0 = time.monotonic()
    level = [member(0, 6, 18, waiting=True), member(1, 41, 18, waiting=True), member(2, 40, 18, waiting=True)]
    judgement.hung_members(3, level, t0)
    assert judgement.hung_members(3, level, t0 + PROGRESS_TIMEOUT + 0.1) == set(), (
        "the replacement, lowest by its count of pings, was fenced though every member is at the same step")
    behind = [member(0, 6, 18, waiting=True), member(1, 40, 17, waiting=True), member(2, 40, 18, waiting=True)]
    judgement.hung_members(4, behind, t0)
    assert judgement.hung_members(4, behind, t0 + PROGRESS_TIMEOUT + 0.1) == {1}
    # No step committed in this generation yet (-1: in the heal, or a loop that never sets call.step): unknown,
    # not behind; the deadlock is left to the process-group timeout.
    unknown = [member(0, 6, -1, waiting=True), member(1, 40, 18, waiting=True), member(2, 40, 18, waiting=True)]
    judgement.hung_members(5, unknown, t0)
    assert judgement.hung_members(5, unknown, t0 + PROGRESS_TIMEOUT + 0.1) == set(), (
        "a member whose step in this generation is unknown was taken for the one behind")


def test_a_member_publishes_its_last_committed_step_with_its_progress(store_server: StoreServer,
                                                                      job_id: str) -> None:
    """What the rule above compares reaches the leader: the step the training thread last committed in its
    generation, read back with the slot's facts (-1 before any commit in it)."""
    store = job_store(connect(store_server.address), job_id)
    register(store, 5)
    report = SlotReport(slot=5)
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=5, interval=0.05, report=report,
                          publish_every=0.1)
    heartbeat.start()
    try:
        wait_until(lambda: read_facts(store, [5])[5].heartbeat > 1, 5, "the heartbeat to beat")
        assert read_facts(store, [5])[5].step == -1
        for step in range(1, 8):
            heartbeat.ping()
            report.committed(step)
        facts = wait_until(lambda: (f := read_facts(store, [5])[5]).step == 7 and f, 5, "step 7 published")
        assert facts.progress == 7 and not facts.waiting
        report.joined(generation=2, rank=0, heal_source=0, start_step=7, world_size=1)
        heartbeat.ping()  # a change of progress, so the next publication (at most publish_every away) carries it
        wait_until(lambda: read_facts(store, [5])[5].step == -1, 5, "no step in the new generation yet")
    finally:
        heartbeat.stop()


def outsider(slot: int, pings: int, waiting: bool = False) -> SlotFacts:
    return SlotFacts(slot, 1, heartbeat=100, progress=pings, waiting=waiting, dead=0, left=0, replacing=0)


def running(generation: int, members: list[int], spares: tuple[int, ...] = ()) -> GenerationRecord:
    return GenerationRecord(generation=generation, members=tuple(members), incarnations=tuple(1 for _ in members),
                            leader=0, leader_term=1, target_world_size=3, spares=spares)


def test_a_process_stuck_outside_the_running_generation_is_fenced_and_nobody_else(store_server: StoreServer,
                                                                                   job_id: str) -> None:
    """Outside generation 4 (members 0 and 1), all alive and still for the progress timeout: slot 2 trained here
    once and never came back (stuck: fenced); slot 3 trained once and has announced itself for generation 5 (slow
    to come back, not stuck); slot 4 is a seated spare (it announces itself for the next one a moment after each
    decision); slot 5 waits on its peers; spare 100000 never trained (a hot spare, or a process starting)."""
    store = job_store(connect(store_server.address), job_id)
    judgement = judge(store_server, job_id)
    store.append(keys.joiners(5), JoinRequest(5, 3, 1, 12).to_json() + "\n")
    # TCPStore answers no set or append: the judgement's own client could read before the server took it (CI: slot 3
    # fenced, its announcement not there yet). A read on the same connection comes back only after it.
    assert get_or_none(store, keys.joiners(5)) is not None
    facts = {2: outsider(2, 40), 3: outsider(3, 12), 4: outsider(4, 30), 5: outsider(5, 9, waiting=True),
             100000: outsider(100000, 0)}
    t0 = time.monotonic()
    judgement.fence_stuck_outsiders(running(4, [0, 1], spares=(4,)), facts, t0, 5, term=1)
    assert not judgement.fenced, "fenced before the progress timeout"
    judgement.fence_stuck_outsiders(running(4, [0, 1], spares=(4,)), facts, t0 + PROGRESS_TIMEOUT + 0.1, 5, term=1)
    assert set(judgement.fenced) == {(2, 1)}
    assert get_or_none(store, keys.fence(2)) == b"1:1"


def test_an_outsiders_stillness_is_measured_from_when_it_is_seen_outside_again(store_server: StoreServer,
                                                                              job_id: str) -> None:
    """A process seen outside, then a member (it joined; no step yet), then outside again (its generation ended
    before its first step): its stillness starts again when it leaves, not at the first sighting."""
    judgement = judge(store_server, job_id)
    facts = {2: outsider(2, 40)}
    t0 = time.monotonic()
    judgement.fence_stuck_outsiders(running(4, [0, 1]), facts, t0, 5, term=1)
    judgement.fence_stuck_outsiders(running(5, [0, 1, 2]), facts, t0 + 0.5, 6, term=1)
    judgement.fence_stuck_outsiders(running(6, [0, 1]), facts, t0 + PROGRESS_TIMEOUT + 0.1, 7, term=1)
    assert not judgement.fenced, "a process that was a member a moment ago was fenced as stuck outside"
    judgement.fence_stuck_outsiders(running(6, [0, 1]), facts, t0 + 2 * PROGRESS_TIMEOUT + 0.2, 7, term=1)
    assert set(judgement.fenced) == {(2, 1)}


def test_a_replacement_not_beating_yet_is_not_judged_by_its_predecessors_progress(store_server: StoreServer,
                                                                                   job_id: str) -> None:
    """Slot 2's stuck process was fenced and killed; its replacement registered (a new incarnation) but its heartbeat
    has not published yet (it is still starting: a busy machine, a slow connection). The slot's facts must not show
    the dead process's progress as the replacement's: read still for the progress timeout, that replacement would be
    fenced as stuck outside before it ever trained (CI: the stuck slot judged twice)."""
    store = job_store(connect(store_server.address), job_id)
    judgement = judge(store_server, job_id)
    assert register(store, 2) == 1
    store.set(keys.progress(2), "40/20@3,4")  # the stuck process: 40 pings, step 20, still 3 s in generation 4
    assert register(store, 2) == 2  # its replacement, not beating yet
    facts = read_facts(store, [2])
    assert facts[2].incarnation == 2 and facts[2].progress == 0, facts[2]
    t0 = time.monotonic()
    for read_at in (t0, t0 + PROGRESS_TIMEOUT + 0.1, t0 + 2 * PROGRESS_TIMEOUT + 0.2):
        judgement.fence_stuck_outsiders(running(4, [0, 1]), read_facts(store, [2]), read_at, 5, term=1)
    assert not judgement.fenced, "a replacement was fenced as stuck for its predecessor's stillness"


def test_the_leader_remembers_one_fence_per_slot(store_server: StoreServer, job_id: str) -> None:
    """A fence is remembered so it is written once; a newer incarnation's fence replaces the older one's (that process
    is gone), so a leader's memory of fences stays one entry per slot over a long job."""
    judgement = judge(store_server, job_id)
    t0 = time.monotonic()
    for incarnation in range(1, 6):
        facts = {2: SlotFacts(2, incarnation, heartbeat=100, progress=40, waiting=False, dead=0, left=0,
                              replacing=0)}
        judgement.fence_stuck_outsiders(running(4, [0, 1]), facts, t0 + incarnation * 10, 5, term=1)
        judgement.fence_stuck_outsiders(running(4, [0, 1]), facts, t0 + incarnation * 10 + PROGRESS_TIMEOUT + 0.1, 5,
                                        term=1)
    assert list(judgement.fenced) == [(2, 5)]


def test_a_member_stuck_in_a_generation_that_ended_for_another_cause_is_fenced_and_declared(
        store_server: StoreServer, job_id: str) -> None:
    """Generation 4 (members 0-3) ends for another cause (a replacement from outside asks in) while slot 0 stands still
    at a step boundary and slots 1 and 2 wait for it in a collective: deaf to the interrupt, they cannot rejoin, and no
    interrupt judgement looks at an ended generation (random schedule seed 33008: a generation of one, from a
    checkpoint 14 steps back, trained to the job's end while three live ranks stood still). Slot 0 is fenced as the
    culprit once still for the progress timeout, measured from while the generation ran, and declared to generation
    4's members (keys.released: a peer blocked with it cuts its collective, ftcoord.liveness.group_release); slot 3, as
    still but
    announced for generation 5, is not (it rejoined: waiting for the record), nor are the waiters."""
    store = job_store(connect(store_server.address), job_id)
    judgement = judge(store_server, job_id)
    ended = running(4, [0, 1, 2, 3])
    members = [member(0, 40, 17, waiting=False), member(1, 41, 18, waiting=True), member(2, 39, 18, waiting=True),
               member(3, 12, 18, waiting=False)]
    facts = {slot: fact for slot, _, fact in members}
    t0 = time.monotonic()
    assert judgement.hung_members(4, members, t0) == set()  # the leader's round while generation 4 ran
    store.append(keys.joiners(5), JoinRequest(5, 3, 1, 18).to_json() + "\n")
    assert get_or_none(store, keys.joiners(5)) is not None  # on the same connection: the append was taken
    judgement.fence_stuck_members_of_ended(ended, facts, t0 + PROGRESS_TIMEOUT / 2, 5, term=1)
    assert not judgement.fenced, "fenced before the progress timeout"
    judgement.fence_stuck_members_of_ended(ended, facts, t0 + PROGRESS_TIMEOUT + 0.1, 5, term=1)
    assert set(judgement.fenced) == {(0, 1)}, judgement.fenced
    assert get_or_none(store, keys.fence(0)) == b"1:1"
    assert get_or_none(store, keys.released(4)) == b"hung:slot=0"
    judgement.fence_stuck_members_of_ended(ended, facts, t0 + PROGRESS_TIMEOUT + 0.2, 5, term=1)  # once
    assert set(judgement.fenced) == {(0, 1)}


def still_heartbeat(store_server: StoreServer, job_id: str, slot: int, generation: int,
                    publish_every: float) -> tuple[object, Heartbeat, SlotReport]:
    """A slot's real heartbeat, its process a member of `generation` (its stillness is counted in one), started."""
    store = job_store(connect(store_server.address), job_id)
    register(store, slot)
    report = SlotReport(slot=slot)
    report.joined(generation=generation, rank=0, heal_source=0, start_step=0, world_size=2)
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=slot, interval=0.02, report=report,
                          publish_every=publish_every)
    heartbeat.start()
    return store, heartbeat, report


def test_a_leader_that_takes_over_during_a_stall_counts_it_from_when_the_process_says_it_began(
        store_server: StoreServer, job_id: str) -> None:
    """A rank stuck, then its leader killed (chaos hand schedule h-s, progress timeout 6 s): the next leader measured
    the stillness from its own first read, fenced the rank 6 s late, and the job trained one rank short for twice the
    timeout (full size 12.6 s after the stall; 6.6 s since). The rank's heartbeat publishes how long its training
    thread has stood still (a lower bound, in multiples of publish_every, in its generation), and a fresh judge counts
    from there: here it fences as soon as the stillness reaches the timeout, not a full timeout after it was born;
    and never before."""
    store, heartbeat, _ = still_heartbeat(store_server, job_id, 2, generation=3, publish_every=0.2)
    try:
        heartbeat.joined()
        for _ in range(40):
            heartbeat.ping()  # trained here; then stands still, not waiting on its peers (this thread's frames)
        pinged = time.monotonic()
        facts = wait_until(lambda: (f := read_facts(store, [2])[2]).still_s >= 0.6 and f, 5, "0.6 s still published")
        assert facts.still_generation == 3, facts
        judgement = judge(store_server, job_id)  # the leader that takes over now
        born = time.monotonic()

        def fenced() -> bool:
            read_at = time.monotonic()
            judgement.fence_stuck_outsiders(running(4, [0, 1]), read_facts(store, [2]), read_at, 5, term=1)
            return bool(judgement.fenced)

        wait_until(fenced, 5, "the stuck process fenced", poll=0.01)
        at = time.monotonic()
        assert at - pinged >= PROGRESS_TIMEOUT, f"fenced {at - pinged:.3f}s into a stillness, before the timeout"
        assert at - born < PROGRESS_TIMEOUT - 0.05, (
            f"fenced {at - born:.3f}s after the judge was born: its stillness counted from its own first read")
    finally:
        heartbeat.stop()


def test_a_stillness_is_published_from_the_last_join_and_never_while_in_one(store_server: StoreServer,
                                                                              job_id: str) -> None:
    """What a process vouches for must not make a new leader fence a healthy one. A member waiting in ftcoord's join (a
    hot spare waits there for hours) publishes no stillness; one that joined a generation counts from its join, as a
    leader's clock does (a new generation is a new value of its progress), not from its last ping before the join. A
    judge of a generation other than the one a stillness was counted in does not take it: in CI a peer's stillness of
    24 s, published as it left a collective, fenced it in each of seven generations it decided as leader."""
    store, heartbeat, report = still_heartbeat(store_server, job_id, 3, generation=5, publish_every=0.1)
    try:
        heartbeat.ping()
        heartbeat.joining()
        in_join = time.monotonic()
        while time.monotonic() - in_join < 0.8:
            assert read_facts(store, [3])[3].still_s == 0, "a stillness published while in a join"
            time.sleep(0.05)
        heartbeat.joined()
        joined = time.monotonic()
        facts = wait_until(lambda: (f := read_facts(store, [3])[3]).still_s > 0 and f, 5, "a stillness published")
        assert facts.still_s <= time.monotonic() - joined, (
            f"{facts.still_s}s of stillness published {time.monotonic() - joined:.3f}s after the join")
        wait_until(lambda: read_facts(store, [3])[3].still_s >= PROGRESS_TIMEOUT + 0.2, 5, "a long stillness")
        judgement = judge(store_server, job_id)
        t0 = time.monotonic()
        member_of_6 = (3, 1, read_facts(store, [3])[3])  # counted in generation 5
        assert judgement.hung_members(6, [member_of_6], t0) == set(), "a stillness of another generation was taken"
        assert judgement.hung_members(5, [member_of_6], t0) == {3}
        report.joined(generation=6, rank=0, heal_source=0, start_step=0, world_size=2)
        heartbeat.ping()
        wait_until(lambda: read_facts(store, [3])[3].still_s == 0, 5, "the stillness cleared by a ping")
    finally:
        heartbeat.stop()


def test_a_stillness_never_counts_the_time_a_thread_waited_on_its_peers(store_server: StoreServer, job_id: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer of a stuck rank waits in a collective (published waiting); once the culprit is fenced it leaves the
    collective and tears its group down, still, not waiting. Its stillness counts from when it stopped waiting: in CI
    it counted from its last ping, 24 s before, and the leader it became fenced itself in every generation it
    decided."""
    count_frame_looks(monkeypatch, ("/threading.py",))  # a wait in threading stands for a collective
    store, heartbeat, _ = still_heartbeat(store_server, job_id, 4, generation=2, publish_every=0.1)
    peers_done = threading.Event()

    def train() -> None:
        heartbeat.joined()
        heartbeat.ping()
        peers_done.wait(20)  # "in a collective", as patched above
        time.sleep(3.0)  # still, no longer waiting (no frame of threading.py)

    trainer = threading.Thread(target=train, daemon=True)
    try:
        trainer.start()
        wait_until(lambda: read_facts(store, [4])[4].waiting, 5, "the training thread published waiting")
        time.sleep(0.6)  # waits on its peers for six publish_every
        assert read_facts(store, [4])[4].still_s == 0, "a thread waiting on its peers published a stillness"
        peers_done.set()
        left = time.monotonic()
        facts = wait_until(lambda: (f := read_facts(store, [4])[4]).still_s > 0 and not f.waiting and f, 5,
                           "still, no longer waiting")
        assert facts.still_s <= time.monotonic() - left + 0.05, (
            f"{facts.still_s}s of stillness published {time.monotonic() - left:.3f}s after it stopped waiting")
    finally:
        peers_done.set()
        heartbeat.stop()
