"""Safety under pauses, each interleaving reproduced with a pause point (ftcoord.pausepoints): participants
in threads against a real store; a paused *process* is a paused thread whose heartbeat also stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from ftcoord import Participant, QuorumPolicy, StoreServer, Timing, connect, job_store, pausepoints
from ftcoord.errors import Superseded
from ftcoord.leader.duty import LeaderDuty
from ftcoord.leader.forgetter import KEEP_GENERATIONS
from ftcoord.protocol import keys
from ftcoord.protocol.generations import advance_current, read_record
from ftcoord.protocol.slots import SlotFacts, fenced
from ftcoord.store.client import get_or_none
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)

FAST = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0, join_timeout=0.3, barrier_timeout=10.0)


@pytest.fixture
def participants() -> Iterator[list[Participant]]:
    started: list[Participant] = []
    yield started
    for gate in list(pausepoints._gates.values()):
        gate.release()
    for p in started:
        p.close()


def start(started: list[Participant], address: str, job_id: str, slot: int, policy: QuorumPolicy,
          **kwargs: object) -> Participant:
    """A participant whose helper watch reports to `p.ended` instead of ending the test's process."""
    ended: list[str] = []
    kwargs.setdefault("on_helper_failure", ended.append)
    p = Participant(address, job_id, slot, policy, FAST, **kwargs).start()  # type: ignore[arg-type]
    p.ended = ended  # type: ignore[attr-defined]
    started.append(p)
    return p


def current(p: Participant) -> int:
    return int(get_or_none(p.store, keys.CURRENT) or 0)


def paused_before_its_write(participants: list[Participant], address: str,
                            job_id: str) -> tuple[Participant, Participant, pausepoints.Gate]:
    """Slot 0 leads and stops (its whole process: heartbeat too) at its write of generation 2's record; slot 1, which
    alone joined generation 1 (slot 0 never joins), takes over and decides generation 2 itself. Returns the stopped
    leader, its successor and the gate that wakes the stopped one."""
    policy = QuorumPolicy(2)
    stale = start(participants, address, job_id, 0, policy)
    wait_until(lambda: stale.leader.is_leader, 5, "slot 0 to lead")
    other = start(participants, address, job_id, 1, policy)
    assert other.join(0).members == (1,)  # slot 0 never joins: a partial generation after join_timeout

    gate = pausepoints.hold(pausepoints.LEADER_BEFORE_RECORD)
    other.interrupt("test")
    joined = threading.Thread(target=other.join, args=(0,), daemon=True)
    joined.start()
    assert gate.wait_reached(5), "the leader never came to write generation 2"
    stale.heartbeat.stop()  # the whole process is paused now: the other takes over after heartbeat_timeout
    joined.join(10)
    assert other.generation == 2 and other.leader.is_leader
    return stale, other, gate


def test_a_leader_paused_before_its_record_write_never_recreates_a_forgotten_generation(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    stale, other, gate = paused_before_its_write(participants, store_server.address, job_id)
    while other.generation < 2 + KEEP_GENERATIONS + 1:  # generation 2 decided, then forgotten
        other.interrupt("test")
        other.join(0)
    wait_until(lambda: get_or_none(other.store, keys.record(2)) == keys.FORGOTTEN.encode(), 5 * FAST.heartbeat_timeout,
               "generation 2 to be forgotten")  # once the newest runs quietly (ftcoord.leader.forgetter)
    newest = current(other)

    gate.release()  # the paused leader wakes with its proposal for generation 2
    wait_until(lambda: not stale.leader.is_leader, 5, "the paused leader to notice it was deposed")
    assert read_record(other.store, 2) is None, "a forgotten generation's record was written again"
    assert current(other) >= newest, f"gen/current moved back from {newest} to {current(other)}"


def test_a_leader_paused_before_its_record_write_never_overwrites_the_decision_made_meanwhile(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    """The pause comes after the leader confirmed its claim, just before its write: it wakes as a deposed leader
    whose proposal is for a generation decided meanwhile. The write is a compare_set from absent, so the decision
    made by its successor stands (a plain write forked the generation: its members held two records)."""
    stale, other, gate = paused_before_its_write(participants, store_server.address, job_id)
    decided = get_or_none(other.store, keys.record(2))

    gate.release()  # the paused leader wakes and writes its proposal for generation 2
    wait_until(lambda: not stale.leader.is_leader, 5, "the paused leader to notice it was deposed")
    assert get_or_none(other.store, keys.record(2)) == decided, "the decision of generation 2 was overwritten"


def test_a_leader_paused_after_its_leadership_check_fences_and_interrupts_nobody(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    policy = QuorumPolicy(2)
    leader = start(participants, store_server.address, job_id, 0, policy, progress_timeout=0.5)
    wait_until(lambda: leader.leader.is_leader, 5, "slot 0 to lead")
    member = start(participants, store_server.address, job_id, 1, policy)
    join_together(leader, member)
    assert leader.generation == member.generation == 1

    stop_pinging = threading.Event()

    def train() -> None:  # both make progress, as healthy ranks do
        while not stop_pinging.is_set():
            leader.heartbeat.ping()
            member.heartbeat.ping()
            time.sleep(0.02)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    gate = pausepoints.hold(pausepoints.LEADER_CHECKED)
    assert gate.wait_reached(5)
    time.sleep(2 * FAST.heartbeat_timeout)  # the duty thread is paused (a long GC); everyone else is healthy
    next_round = pausepoints.hold(pausepoints.LEADER_CHECKED)
    gate.release()  # it judges on its (old) observations and writes what it decided...
    assert next_round.wait_reached(5), "the leader duty never came round again"  # ...a whole round done
    next_round.release()
    stop_pinging.set()
    fence = get_or_none(member.store, keys.fence(1))
    assert fence is None or fence.decode() in ("", "0"), f"a healthy rank was fenced: {fence!r}"
    assert not member.generations.is_interrupted(1), get_or_none(member.store, keys.interrupt(1))


def test_a_superseded_incarnation_exits_instead_of_interrupting_every_generation(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    policy = QuorumPolicy(2)
    ghost = start(participants, store_server.address, job_id, 0, policy)
    # The ghost's process was paused; its launcher gave up on it and started a new incarnation of slot 0.
    ghost.heartbeat.stop()
    fresh = start(participants, store_server.address, job_id, 0, policy)
    other = start(participants, store_server.address, job_id, 1, policy)
    join_together(fresh, other)
    assert fresh.generation == other.generation == 1
    assert (fresh.incarnation, ghost.incarnation) == (2, 1)

    with pytest.raises(Superseded, match="incarnation 1 of slot 0"):
        ghost.join(0)  # the ghost wakes and tries to take part again
    assert not other.generations.is_interrupted(1), get_or_none(other.store, keys.interrupt(1))
    # Wherever its threads are, its helper watch ends the ghost's process (by default: exit, so a
    # launcher would replace it); the others go on.
    wait_until(lambda: ghost.ended, 3, "the ghost's helper watch to end it")  # type: ignore[attr-defined]
    assert "superseded by incarnation 2" in ghost.ended[0]  # type: ignore[attr-defined]
    assert not fresh.ended and not other.ended  # type: ignore[attr-defined]


def test_a_fenced_incarnation_exits_instead_of_asking_the_members_to_grow_for_it(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    """A node paused as a whole (its launcher too) while its rank was fenced: the rank woke before its launcher read
    the fence, found itself left out of the generation decided without it, and interrupted that generation to grow;
    the members changed generation without it, for nothing (chaos partition under load: 4 generations where 3). The
    newest leader's fence ends a process that has a launcher like a newer incarnation does. (One without a launcher
    takes part again: tests/integration/test_generations.py, the hung process that wakes.)"""
    policy = QuorumPolicy(3)
    leader = start(participants, store_server.address, job_id, 0, policy)
    wait_until(lambda: leader.leader.is_leader, 5, "slot 0 to lead")
    member = start(participants, store_server.address, job_id, 1, policy)
    ghost = start(participants, store_server.address, job_id, 2, policy, launched=True)  # its launcher kills it
    join_together(leader, member, ghost)
    assert leader.generation == member.generation == ghost.generation == 1
    ghost.heartbeat.stop()  # its whole node is paused now, launcher and all: the fence waits unread
    wait_until(lambda: get_or_none(leader.store, keys.fence(2)) not in (None, b"0"), 5 * FAST.heartbeat_timeout,
               "the leader to fence the silent member")
    join_together(leader, member)
    assert leader.generation == member.generation == 2

    outcome: list[BaseException | None] = []

    def wake() -> None:
        try:
            ghost.join(1)  # it wakes and takes part again, as its training loop would
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the ghost's join ended with is the finding
            outcome.append(exc)

    threading.Thread(target=wake, daemon=True).start()
    wait_until(lambda: outcome, 5, "the fenced ghost to end its join")
    assert isinstance(outcome[0], Superseded) and "fenced by the leader" in str(outcome[0]), outcome
    assert not member.generations.is_interrupted(2), get_or_none(member.store, keys.interrupt(2))


def test_only_the_newest_leaders_fence_of_an_incarnation_ends_it(store_server: StoreServer, job_id: str) -> None:
    """A deposed leader's fence is carried out by no launcher (the newest leader judges again), so a process it names
    takes part on; a fence of an older incarnation names a process gone already."""
    store = job_store(connect(store_server.address), job_id)
    store.set(keys.fence(3), "2:5")
    store.set(keys.LEADER, "2:0:1")
    assert "fenced by the leader of term 2" in (fenced(store, 3, 5) or "")
    assert fenced(store, 3, 6) is None  # its replacement
    store.set(keys.LEADER, "3:1:1")  # a newer leader took over since: the fence is moot
    assert fenced(store, 3, 5) is None
    assert fenced(store, 4, 1) is None  # never fenced ("0")


def test_gen_current_only_moves_forward(store_server: StoreServer, job_id: str) -> None:
    store = job_store(connect(store_server.address), job_id)
    advance_current(store, 7)
    advance_current(store, 3)  # a writer that paused and is late
    assert get_or_none(store, keys.CURRENT) == b"7"
    advance_current(store, 9)
    assert get_or_none(store, keys.CURRENT) == b"9"


def test_a_dead_leader_duty_thread_ends_its_process(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    p = start(participants, store_server.address, job_id, 0, QuorumPolicy(1))
    died = p.ended  # type: ignore[attr-defined]
    wait_until(lambda: p.leader.is_leader, 5, "slot 0 to lead")

    class Broken:
        def __getattr__(self, name: str) -> object:
            raise RuntimeError("store connection lost")

    p.leader._store = Broken()  # type: ignore[assignment]
    wait_until(lambda: died, 3, "the participant to notice its leader duty thread died")
    assert "leader" in died[0] and "store connection lost" in died[0]


def fenced_outsider(store_server: StoreServer, job_id: str,
                    participants: list[Participant]) -> tuple[Participant, Participant]:
    """Slots 0 (leading) and 1 form a generation; slot 2 hangs before it ever joins and is fenced.
    Returns (leader, outsider)."""
    policy = QuorumPolicy(2)
    leader = start(participants, store_server.address, job_id, 0, policy)
    wait_until(lambda: leader.leader.is_leader, 5, "slot 0 to lead")
    member = start(participants, store_server.address, job_id, 1, policy)
    outsider = start(participants, store_server.address, job_id, 2, policy)
    join_together(leader, member)
    assert leader.record is not None and 2 not in leader.record.members
    outsider.heartbeat.stop()  # it hangs (SIGSTOP, a deadlock) before it ever joins
    wait_until(lambda: get_or_none(leader.store, keys.fence(2)) not in (None, b"0"), 4 * FAST.heartbeat_timeout,
               "the hung outsider to be fenced")
    return leader, outsider


def test_a_process_that_hangs_outside_every_generation_is_fenced_too(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    """A process that hung while it was not a member (joining, or a hot spare) used to be judged by nobody:
    never fenced, never replaced, its capacity lost for good."""
    leader, outsider = fenced_outsider(store_server, job_id, participants)
    term = int(get_or_none(leader.store, keys.LEADER).decode().split(":")[0])  # type: ignore[union-attr]
    assert get_or_none(leader.store, keys.fence(2)) == f"{term}:{outsider.incarnation}".encode()
    assert get_or_none(leader.store, keys.fence(1)) == b"0"  # the healthy member is left alone


def test_a_replacement_gets_a_full_timeout_of_its_own_before_it_can_be_fenced(
    store_server: StoreServer, job_id: str, participants: list[Participant]
) -> None:
    """Registering bumps the incarnation before the heartbeat counter (ftcoord.protocol.slots.register): a leader that
    read between the two, judging the slot's counter alone, saw the new incarnation silent since the old one
    hung and fenced it at once (seen in the pause scenario: a replacement killed 0.05 s after it started).
    The incarnation is held here at that point: registered, not yet counted."""
    leader, _ = fenced_outsider(store_server, job_id, participants)
    replacement = int(leader.store.add(keys.incarnation(2), 1))  # register()'s first write, and nothing more
    registered = time.monotonic()
    old_fence = get_or_none(leader.store, keys.fence(2))
    while time.monotonic() - registered < 0.7 * FAST.heartbeat_timeout:  # an absence: shown over a window
        assert get_or_none(leader.store, keys.fence(2)) == old_fence, "the replacement was fenced before its timeout"
        time.sleep(0.02)
    # It never beats: after a full timeout of its own it is a hung outsider like any other.
    wait_until(lambda: get_or_none(leader.store, keys.fence(2)) != old_fence, 4 * FAST.heartbeat_timeout,
               "the silent replacement to be fenced after its own timeout")
    assert get_or_none(leader.store, keys.fence(2)).decode().endswith(f":{replacement}")  # type: ignore[union-attr]


def test_a_pause_between_reading_and_judging_is_not_a_members_silence(store_server: StoreServer,
                                                                      job_id: str) -> None:
    """Progress is judged as of when it was read: a leader duty paused after its read (a GC, a pause point)
    and before its judgement must not count the pause as a healthy member's silence (CI: the leader of
    test_a_leader_paused_after_its_leadership_check... fenced its own, healthy slot as hung)."""
    duty = LeaderDuty(job_store(connect(store_server.address), job_id), 0, 1, FAST, QuorumPolicy(2),
                      progress_timeout=0.5)
    member = (1, 1, SlotFacts(1, 1, heartbeat=5, progress=7, waiting=False, dead=0, left=0, replacing=0))
    first = time.monotonic()
    assert duty._judge.hung_members(1, [member], first) == set()
    second = time.monotonic()  # read again: the member published nothing new in between (one beat apart)
    time.sleep(0.8)  # paused between that read and the judgement, longer than the progress timeout
    assert duty._judge.hung_members(1, [member], second) == set(), "the leader's own pause was taken for silence"
    assert duty._judge.hung_members(1, [member], time.monotonic()) == {1}, "a real silence is still seen"
