"""Liveness is judged by when an observer saw a counter change, on its own clock."""

from __future__ import annotations

import threading
import time

import pytest

from ftcoord import StoreServer, connect, job_store
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.liveness.heartbeat import Heartbeat, LivenessObserver
from ftcoord.liveness.interrupt_watch import InterruptWatch
from ftcoord.protocol import keys
from ftcoord.protocol.evidence import Probe
from ftcoord.protocol.generations import LeaderClaim
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slot_report import SlotReport
from ftcoord.store.client import get_or_none
from ftcoord.wrapper.participant import Participant
from tests.helpers.frames import count_frame_looks
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fresh_observer_waits_a_full_timeout_before_calling_anyone_dead() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=5.0, clock=clock)
    observer.observe("hb/1", 42)  # a counter that never changes again
    clock.now += 4.9
    observer.observe("hb/1", 42)
    assert not observer.is_stale("hb/1")
    assert not observer.is_stale("hb/never-seen")  # never read: no evidence either way
    clock.now += 0.2
    observer.observe("hb/1", 42)
    assert observer.is_stale("hb/1")


def test_a_watcher_is_told_when_a_read_would_find_a_silence_on_the_dot() -> None:
    """stale_at: the moment a counter the newest read showed unchanged would be silent for the timeout; none for a
    counter just seen changing (a rare reader is not woken early for it), none already silent that long, none the
    newest read did not read (no longer watched), none for other prefixes."""
    clock = FakeClock()
    observer = LivenessObserver(timeout=5.0, clock=clock)
    for name in ("hb/1", "hb/2", "hb/3", "progress/1"):
        observer.observe(name, 1)
    assert observer.stale_at("hb/") == float("inf")  # read once each: no silence seen yet
    clock.now += 0.25
    observer.observe("hb/1", 1)  # unchanged: silent since 100.0
    observer.observe("hb/2", 2)  # changed: not due
    observer.observe("hb/3", 1)  # unchanged
    observer.observe("progress/1", 1)
    assert observer.stale_at("hb/") == 105.0
    assert observer.stale_at("outside/") == float("inf")
    clock.now += 0.25
    observer.observe("hb/2", 2)  # unchanged since 100.25; hb/1 and hb/3 are not read this time (no longer watched)
    assert observer.stale_at("hb/") == 105.25
    clock.now = 105.0  # a read a hair before hb/2's moment: still due
    observer.observe("hb/2", 2)
    assert observer.stale_at("hb/") == 105.25
    clock.now = 105.3
    observer.observe("hb/2", 2)
    assert observer.is_stale("hb/2") and observer.stale_at("hb/") == float("inf")  # found silent: nothing due


def test_silence_is_only_what_was_observed_so_a_paused_observer_kills_nobody() -> None:
    """The observer read every counter, then was paused (SIGSTOP, a GC) before judging: the pause is not
    silence of the others. Its next read decides."""
    clock = FakeClock()
    observer = LivenessObserver(timeout=1.0, clock=clock)
    for _ in range(5):
        clock.now += 0.1
        observer.observe("hb/0", clock.now)  # beating
    clock.now += 30.0  # paused here, between a read and the judgement
    assert not observer.is_stale("hb/0")
    observer.observe("hb/0", clock.now)  # it kept beating meanwhile
    assert not observer.is_stale("hb/0")


def test_a_changing_counter_stays_alive_whatever_its_values() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=1.0, clock=clock)
    for value in (7, 8, 3, 9):  # values from another host mean nothing but "changed"
        clock.now += 0.9
        observer.observe("hb/0", value)
        assert not observer.is_stale("hb/0")


def test_reset_after_a_pause_forgets_old_observations() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=1.0, clock=clock)
    observer.observe("hb/0", 1)
    clock.now += 30.0  # this observer itself was stopped
    observer.reset()
    assert not observer.is_stale("hb/0")


def test_silence_since_a_question_counts_only_for_an_observer_that_watched_before_it() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=5.0, clock=clock)
    observer.observe("hb/0", 1)
    observer.observe("hb/1", 1)
    clock.now += 0.1
    asked = clock.now
    clock.now += 0.1
    observer.observe("hb/1", 2)  # answered
    assert not observer.silent_since("hb/0", asked, asked + 0.1)  # not read again since the question
    observer.observe("hb/0", 1)
    assert observer.silent_since("hb/0", asked, asked + 0.1) and not observer.silent_since("hb/1", asked, asked)
    assert not observer.silent_since("hb/0", asked, asked + 0.5)  # the grace is not over at the last read
    observer.reset()  # this observer was paused: it knows nothing about the time of the question
    assert not observer.silent_since("hb/0", asked, asked)


def _member(store_server: StoreServer, job_id: str, slot: int) -> tuple[Heartbeat, InterruptWatch]:
    """A member's heartbeat (30 s interval) and interrupt monitor (30 s slices), wired as a Participant wires them."""
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=slot, interval=30.0)
    monitor = InterruptWatch(job_store(connect(store_server.address), job_id), slot, 1, slice_s=30.0,
                               on_beat=heartbeat.beat_now)
    heartbeat.start()
    monitor.start()
    return heartbeat, monitor


def test_a_training_thread_still_on_its_peers_is_published_waiting_looked_at_only_once_it_stood_still(
        store_server: StoreServer, job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's culprit rule needs to know which still member waits on its peers (":w" on its progress), and
    only for one still for progress_timeout. Looking is a snapshot of every thread's frame, O(threads): it is taken
    once the training thread stood still for publish_every (at most a quarter of that timeout), not at every still
    beat (a quarter of a 64-participant process's CPU, chaos bench --scale)."""
    looked_at = count_frame_looks(monkeypatch, ("/tests/unit/test_liveness.py",))
    store = job_store(connect(store_server.address), job_id)
    publish_every = 0.6
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=3, interval=0.05,
                          publish_every=publish_every)
    peers_done = threading.Event()
    pinged: list[float] = []

    def train() -> None:
        heartbeat.ping()
        pinged.append(time.monotonic())
        peers_done.wait(20)  # a frame of this file: "waiting on its peers", as monkeypatched above
        heartbeat.ping()

    heartbeat.start()
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        def progress() -> str:
            return (get_or_none(store, keys.progress(3)) or b"").decode()

        wait_until(lambda: progress().endswith(":w"), 10, "the still training thread published as waiting")
        published = time.monotonic()
        assert published - pinged[0] >= publish_every, f"published waiting {published - pinged[0]:.3f}s after a ping"
        assert looked_at and min(looked_at) - pinged[0] >= publish_every, (
            f"looked at the training thread's frame {min(looked_at) - pinged[0]:.3f}s after its last ping")
        peers_done.set()
        wait_until(lambda: progress() == "2", 5, "progress again, no longer waiting")
    finally:
        peers_done.set()
        heartbeat.stop()


def test_a_status_that_stands_still_is_looked_at_once_per_publish_every_not_at_every_beat(
        store_server: StoreServer, job_id: str) -> None:
    """A slot's status (for operators) is published when it changed, looked at most every publish_every: a spare's
    or a member's waiting on its peers stands still, and was encoded again (a dataclass copied, JSON) at every beat
    once publish_every had passed since it was last published."""
    store = job_store(connect(store_server.address), job_id)
    report = SlotReport(slot=4)
    looks: list[float] = []
    real_status = report.status

    def status() -> dict[str, object]:
        looks.append(time.monotonic())
        return real_status()

    report.status = status  # type: ignore[method-assign]
    publish_every = 0.3
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=4, interval=0.02, report=report,
                          publish_every=publish_every)
    t0 = time.monotonic()
    beats = 0
    while time.monotonic() - t0 < 4 * publish_every:
        heartbeat.beat()
        beats += 1
        time.sleep(0.02)
    assert get_or_none(store, keys.status(4)) is not None  # published once, at the first beat
    assert beats >= 20
    # The first beat's, then one a publish_every (4 in all, 5 with a late beat), not one at each of ~45 beats.
    assert len(looks) <= 5, f"the still status was looked at {len(looks)} times in {beats} beats"
    gaps = [b - a for a, b in zip(looks, looks[1:], strict=False)]
    assert all(gap >= publish_every - 0.01 for gap in gaps), gaps


@pytest.mark.parametrize("interrupted_first", [False, True], ids=["running", "already-interrupted"])
def test_a_member_answers_a_probe_at_once_whatever_its_interval(store_server: StoreServer, job_id: str,
                                                                interrupted_first: bool) -> None:
    """The evidence path's keystone: a live member beats within milliseconds of a leader's question, so silence
    after one is proof enough (ftcoord.protocol.evidence). Asked while its generation runs (the question ends it) and
    after it was interrupted by someone else (its monitor then waits on the question itself)."""
    store = job_store(connect(store_server.address), job_id)
    heartbeat, monitor = _member(store_server, job_id, slot=3)
    try:
        monitor.watch(7)
        if interrupted_first:
            store.compare_set(keys.interrupt(7), "", "rejoin:slot=1")
            wait_until(lambda: monitor.fired, 5.0, "the interrupt")
            time.sleep(0.3)  # its beat for the interrupt is long past when the question comes
        before = int(store.add(keys.heartbeat(3), 0))
        probe = Probe(store)
        asked = probe.ask(generation=7)
        assert probe.ask(generation=7) == asked  # once per generation
        wait_until(lambda: int(store.add(keys.heartbeat(3), 0)) > before, 10.0, "an answer to the probe")
        answered = time.monotonic() - asked
        assert answered < 1.0, f"answered after {answered:.3f}s: a live member would be declared gone"
        assert monitor.fired and heartbeat.failed is None and monitor.failed is None
    finally:
        monitor.stop()
        heartbeat.stop()


def test_a_probe_asked_while_the_monitor_thread_starts_is_answered(store_server: StoreServer, job_id: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine starts a thread late: a question asked before the monitor's thread ran is still answered
    at once (the probe key stays; a heartbeat thread that counted probes missed one once, and stayed silent for
    its whole 30 s interval)."""
    asked = threading.Event()
    run = InterruptWatch._run

    def late_run(self: InterruptWatch) -> None:
        asked.wait(10.0)
        run(self)

    monkeypatch.setattr(InterruptWatch, "_run", late_run)
    store = job_store(connect(store_server.address), job_id)
    heartbeat, monitor = _member(store_server, job_id, slot=5)
    try:
        monitor.watch(1)
        before = int(store.add(keys.heartbeat(5), 0))
        Probe(store).ask(generation=1)
        asked.set()
        wait_until(lambda: int(store.add(keys.heartbeat(5), 0)) > before, 5.0, "an answer to the probe")
    finally:
        monitor.stop()
        heartbeat.stop()


def test_a_decision_releases_the_monitors_of_the_generation_before(store_server: StoreServer, job_id: str) -> None:
    """After its generation was interrupted, a member's monitor waits for a question about it (30 s slices here);
    the leader's decision of the next generation ends that wait, so an interrupt of the next one is seen at once
    (sabotage: without the leader's release, the second interrupt waited for the slice)."""
    timing = Timing(heartbeat_interval=0.5, heartbeat_timeout=15.0, join_timeout=0.5, barrier_timeout=30.0)
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), timing).start() for slot in range(2)]
    try:
        join_together(*parts)
        assert parts[0].generation == parts[1].generation == 1
        parts[0].interrupt("test")
        wait_until(lambda: all(p.interrupted for p in parts), 5.0, "generation 1 interrupted")
        join_together(*parts)
        assert parts[0].generation == parts[1].generation == 2
        asked = time.monotonic()
        parts[1].interrupt("test again")
        wait_until(lambda: all(p.interrupted for p in parts), 5.0, "generation 2's interrupt seen by both")
        assert time.monotonic() - asked < 2.0
    finally:
        for p in parts:
            p.close()


def test_the_release_after_a_decision_is_not_a_question(store_server: StoreServer, job_id: str) -> None:
    """The leader's release of a generation's monitors (keys.PROBE_RELEASED) ends their wait without a beat: every
    member beating as the next record is read was one more request each in that burst (chaos bench --scale). A
    question asked first stays one (the release does not overwrite it) and is answered."""
    store = job_store(connect(store_server.address), job_id)
    heartbeat, monitor = _member(store_server, job_id, slot=4)
    try:
        for generation, asked in ((7, False), (8, True)):
            monitor.watch(generation)
            store.compare_set(keys.interrupt(generation), "", "rejoin:slot=1")
            wait_until(lambda: monitor.fired, 5.0, "the interrupt")
            before = int(store.add(keys.heartbeat(4), 0))
            if asked:
                Probe(store).ask(generation)
            store.compare_set(keys.probe(generation), "", keys.PROBE_RELEASED)  # as the leader releases
            wait_until(lambda g=generation: monitor._answered == g, 5.0, "the monitor out of its wait")
            if asked:
                wait_until(lambda b=before: int(store.add(keys.heartbeat(4), 0)) > b, 5.0, "an answer")
            else:
                time.sleep(0.3)  # a beat asked for would be in by now (they take milliseconds)
                assert int(store.add(keys.heartbeat(4), 0)) == before, "the release was answered as a question"
    finally:
        monitor.stop()
        heartbeat.stop()


class _ReadsSeen:
    """A real store client that notes the keys read through it with `get`."""

    def __init__(self, store: object) -> None:
        self._store = store
        self.read: list[str] = []

    def get(self, key: str) -> bytes:
        self.read.append(key)
        return self._store.get(key)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def test_a_member_that_rejoined_reads_nothing_when_woken_by_the_probe(store_server: StoreServer, job_id: str) -> None:
    """Once its trainer announced itself for the next generation, a member's monitor reads nothing when the probe
    key wakes it (at 1,024 participants, a thousand reads in the burst of record reads): the announcement answers any
    question (the leader asks no member that rejoined) and a release asks nothing. So it neither reads the key nor
    beats, for a release and for a question alike (sabotage: reading the woken key fails this)."""
    store = job_store(connect(store_server.address), job_id)
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=6, interval=30.0)
    spied = _ReadsSeen(job_store(connect(store_server.address), job_id))
    monitor = InterruptWatch(spied, 6, 1, slice_s=30.0, on_beat=heartbeat.beat_now)  # type: ignore[arg-type]
    heartbeat.start()
    monitor.start()
    try:
        for generation, asked in ((7, False), (8, True)):
            monitor.watch(generation)
            store.compare_set(keys.interrupt(generation), "", "rejoin:slot=1")
            wait_until(lambda: monitor.fired, 5.0, "the interrupt")
            monitor.announced(generation + 1)  # as its trainer does, once its announcement is in
            before = int(store.add(keys.heartbeat(6), 0))
            if asked:
                Probe(store).ask(generation)
            store.compare_set(keys.probe(generation), "", keys.PROBE_RELEASED)  # as the leader releases
            wait_until(lambda g=generation: monitor._answered == g, 5.0, "the monitor out of its wait")
            assert keys.probe(generation) not in spied.read, "a member that rejoined read the probe key"
            assert int(store.add(keys.heartbeat(6), 0)) == before, "a member that rejoined beat for the probe"
        assert spied.read == [keys.interrupt(7), keys.interrupt(8)]  # the interrupts' reasons only
    finally:
        monitor.stop()
        heartbeat.stop()


def test_an_operator_reading_the_job_does_not_wake_its_members(store_server: StoreServer, job_id: str) -> None:
    """`ftcoord status` shows whether each recent generation was interrupted. Read from the running generation's
    absent interrupt key (a compare_set), that woke every member's interrupt watch at each refresh: a few requests
    per member, a burst of thousands at scale. It looks first."""
    from ftcoord.observe.job_view import _recent
    from ftcoord.store.link import StoreLink

    store = job_store(connect(store_server.address), job_id)
    store.compare_set(keys.record(7), "", GenerationRecord(generation=7, members=(0,), incarnations=(1,), leader=0,
                                                           leader_term=1, target_world_size=1).to_json())
    link = StoreLink(store_server.address, job_id)
    watch = link.client()
    monitor = InterruptWatch(watch, 0, 1, slice_s=30.0)
    try:
        monitor.start()
        monitor.watch(7)
        wait_until(lambda: watch.requests[("monitor", "get")] >= 2, 5.0, "the monitor waiting on the interrupt")
        time.sleep(0.1)
        before = sum(watch.requests.values())
        for _ in range(3):
            assert _recent(store, 7)[0]["interrupted"] is None
        time.sleep(0.3)  # a woken watch reads at once (milliseconds)
        assert sum(watch.requests.values()) == before, dict(watch.requests)
        store.compare_set(keys.interrupt(7), "", "test")
        wait_until(lambda: monitor.fired, 5.0, "the interrupt")
        assert _recent(store, 7)[0]["interrupted"] == "test"
    finally:
        monitor.stop()
        link.close()


def test_leader_claim_round_trips() -> None:
    assert LeaderClaim.parse(b"3:2:7") == LeaderClaim(3, 2, 7)
    assert str(LeaderClaim.parse("3:released")) == "3:released"
    assert LeaderClaim.parse("3:released").slot is None


def test_a_stopped_heartbeat_has_left_its_store_wait(store_server: StoreServer, job_id: str) -> None:
    """A process that exits while its heartbeat thread sits in a C++ store wait can abort in the interpreter's
    teardown ("terminate called without an active exception": a plain `python examples/own_loop.py` did)."""
    store = job_store(connect(store_server.address), job_id)
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=4, interval=0.5)
    heartbeat.start()
    wait_until(lambda: int(store.add(keys.heartbeat(4), 0)) > 0, 10, "the first beat")  # then it waits a whole interval
    heartbeat.stop()
    assert not heartbeat._thread.is_alive(), "stop() returned while the thread was still in a store wait"


def test_reading_another_threads_frame_keeps_the_collector_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.11's sys._current_frames() can deadlock with a garbage collection started inside it
    (python/cpython#106883): a heartbeat thread froze a whole process, GIL held. The collector must be off
    during the read and as it was after (a user who disabled it keeps it disabled)."""
    import gc
    import sys

    from ftcoord.liveness.heartbeat import frame_of

    real, seen = sys._current_frames, []

    def recording() -> dict:
        seen.append(gc.isenabled())
        return real()

    monkeypatch.setattr(sys, "_current_frames", recording)
    assert frame_of(threading.get_ident()) is not None
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        frame_of(threading.get_ident())
        assert not gc.isenabled()
    finally:
        gc.enable()
