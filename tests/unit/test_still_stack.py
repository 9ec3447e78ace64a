"""A training thread that stands still is logged once, with where it stands, before the leader can fence it
(ftcoord.liveness.still_stack): a heartbeat of a real store client, the training thread a real thread."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import Any

import pytest

from ftcoord import Participant, QuorumPolicy, StoreServer, Timing, connect, job_store
from ftcoord.errors import JobFinished
from ftcoord.liveness.heartbeat import Heartbeat
from ftcoord.liveness.still_stack import StillStack
from ftcoord.protocol import keys
from ftcoord.protocol.slot_report import SlotReport
from ftcoord.store.client import get_or_none
from tests.helpers.frames import count_frame_looks
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until

AFTER_S = 0.4


class Recorded:
    """The log a StillStack writes to, kept in a list."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def warning(self, event: str, **facts: Any) -> None:
        self.events.append({"event": event, **facts})


def _heartbeat(store_server: StoreServer, job_id: str, log: Recorded, report: SlotReport | None = None) -> Heartbeat:
    return Heartbeat(job_store(connect(store_server.address), job_id), slot=2, interval=0.05, report=report,
                     still_stack=StillStack(AFTER_S, log))  # type: ignore[arg-type]


def _stuck_in_the_step(release: threading.Event) -> None:
    while not release.is_set():
        time.sleep(0.01)


def test_a_thread_stuck_after_its_join_is_logged_once_per_stillness_with_where_it_stands(
        store_server: StoreServer, job_id: str) -> None:
    """Stuck after a join, before any ping (a CI run once saw both ranks stand still at their first step, fenced
    with no clue where): logged once half the progress timeout after the join, however long it stays; again after
    it moved and stood still once more."""
    log = Recorded()
    report = SlotReport(slot=2)
    heartbeat = _heartbeat(store_server, job_id, log, report)
    first, second = threading.Event(), threading.Event()
    joined: list[float] = []

    def train() -> None:
        time.sleep(0.75 * AFTER_S)  # the process's start, before its first join: not part of the stillness
        heartbeat.joined()
        joined.append(time.monotonic())
        _stuck_in_the_step(first)
        heartbeat.ping()
        _stuck_in_the_step(second)

    heartbeat.start()
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        assert "still_at" not in report.status()
        wait_until(lambda: log.events, 10, "the still training thread logged")
        logged_after = time.monotonic() - joined[0]
        beats = heartbeat.beats
        wait_until(lambda: heartbeat.beats >= beats + 5, 10, "five more beats")
        (event,) = log.events
        assert event["event"] == "training_thread_still" and AFTER_S <= event["still_s"] <= logged_after, event
        assert event["at"].endswith(" in _stuck_in_the_step") and "test_still_stack.py" in event["at"], event
        assert "in train" in event["stack"] and event["stack"].rstrip().endswith("time.sleep(0.01)"), event["stack"]
        assert report.status()["still_at"] == event["at"]  # what `ftcoord status` shows, until the thread moves
        first.set()
        wait_until(lambda: len(log.events) == 2, 10, "the second stillness logged")
        assert log.events[1]["at"] == event["at"] and log.events[1]["still_s"] >= AFTER_S, log.events
    finally:
        first.set()
        second.set()
        heartbeat.stop()
        trainer.join(5)


def test_a_thread_waiting_in_its_join_is_not_logged_and_its_frames_are_not_looked_at(
        store_server: StoreServer, job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot spare waits in its join for the whole job: waiting on its peers by definition, so neither the stack log
    nor the ":w" flag takes a snapshot of the process's frames (O(threads): a quarter of a 64-participant process's CPU
    when every still beat looked, chaos bench --scale). Sabotage: the join not told to the heartbeat: not published
    waiting."""
    looked_at = count_frame_looks(monkeypatch, ("/no-such-module.py",))
    log = Recorded()
    heartbeat = _heartbeat(store_server, job_id, log)
    peers = threading.Event()
    joining: list[float] = []

    def train() -> None:
        heartbeat.joining()
        joining.append(time.monotonic())
        peers.wait(30)

    heartbeat.start()
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        wait_until(lambda: joining and time.monotonic() - joining[0] > 3 * AFTER_S, 10, "three times the stillness")
        store = job_store(connect(store_server.address), job_id)
        assert not log.events and looked_at == [], (log.events, looked_at)
        assert (get_or_none(store, keys.progress(2)) or b"").endswith(b":w")
    finally:
        peers.set()
        heartbeat.stop()
        trainer.join(5)


def test_a_spare_in_its_join_and_a_member_waiting_in_its_finish_wait_on_their_peers(
        store_server: StoreServer, job_id: str) -> None:
    """Real participants, half a second of stillness to look at (progress_timeout 1 s). A hot spare waits for its
    generation in ftcoord's join, and a member that finished waits for the other in ftcoord's finish: both wait on
    their peers, several frames below ftcoord.wrapper.generation_client in the store's client. Neither is shown as
    standing still,
    and the member that finished is published waiting (":w"), as one in a collective is: before, it was no different
    from a stuck member to the leader's culprit rule, and the spare was logged as still (a random chaos schedule)."""
    timing = Timing(heartbeat_interval=0.05, heartbeat_timeout=1.0, join_timeout=0.5, barrier_timeout=60.0)
    parts = [Participant(store_server.address, job_id, slot, QuorumPolicy(2), timing, progress_timeout=1.0).start()
             for slot in range(3)]
    store = parts[0].clone_store()
    try:
        join_together(*parts[:2])
        def spare() -> None:
            with contextlib.suppress(JobFinished):  # at the end of the test
                parts[2].join(0)

        threading.Thread(target=spare, daemon=True).start()

        def finish_first() -> None:
            parts[0].heartbeat.ping()
            parts[0].finish()

        threading.Thread(target=finish_first, daemon=True).start()
        wait_until(lambda: (get_or_none(store, keys.progress(0)) or b"").endswith(b":w"), 10,
                   "the member that finished published as waiting on its peers")
        beats = [p.heartbeat.beats for p in parts]
        wait_until(lambda: all(p.heartbeat.beats >= b + 40 for p, b in zip(parts, beats, strict=True)), 20,
                   "two seconds of beats: four times the stillness that is looked at")
        assert [p.report.status().get("still_at") for p in parts] == [None, None, None]
    finally:
        threading.Thread(target=parts[1].finish, daemon=True).start()
        for p in parts:
            p.close()


def test_a_thread_that_joined_and_waits_on_its_peers_before_its_first_ping_is_published_waiting(
        store_server: StoreServer, job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member waiting in its first all-reduce (here: a wait in threading.py, made a "peers" module) on a peer stuck
    in its first forward has not pinged yet. It was published not waiting, so the leader's culprit rule fenced it
    with the stuck one (CI: both replaced, the job restarted from step 0). Sabotage: only a thread that pinged is
    looked at, as before: never ":w"."""
    count_frame_looks(monkeypatch, ("/threading.py",))
    store = job_store(connect(store_server.address), job_id)
    heartbeat = Heartbeat(job_store(connect(store_server.address), job_id), slot=5, interval=0.05, publish_every=0.3)
    peers = threading.Event()

    def train() -> None:
        heartbeat.joined()
        peers.wait(30)

    heartbeat.start()
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        wait_until(lambda: (get_or_none(store, keys.progress(5)) or b"").endswith(b":w"), 10,
                   "the member that joined and waits published as waiting on its peers")
    finally:
        peers.set()
        heartbeat.stop()
        trainer.join(5)


def test_a_thread_blocked_in_native_code_is_logged_with_the_kernels_view_of_it(
        store_server: StoreServer, job_id: str) -> None:
    """A stack ends at the innermost Python frame: a thread blocked on a lock below it (CI: a rank forked from the
    warm standby stood 12 s in its first matmul, `linear.py:134 in forward` and nothing more) reads like one
    computing there. The log line says which: asleep on a futex, with its native id and CPU time."""
    log = Recorded()
    heartbeat = _heartbeat(store_server, job_id, log)
    held, native = threading.Lock(), []
    held.acquire()

    def train() -> None:
        native.append(threading.get_native_id())
        heartbeat.joined()
        held.acquire()  # blocked in the kernel, without the GIL, its innermost Python frame this line

    heartbeat.start()
    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        wait_until(lambda: log.events, 10, "the still training thread logged")
        (event,) = log.events
        assert event["at"].endswith(" in train"), event
        assert re.fullmatch(rf"{native[0]} [^:]+: S in futex\w*, [0-9.]+ s of CPU", event["thread"]), event
    finally:
        held.release()
        trainer.join(5)
        heartbeat.stop()
