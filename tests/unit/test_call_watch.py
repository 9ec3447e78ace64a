"""The store link's watchdog (ftcoord.store.call_watch): a silent store's calls are cut at op_timeout; a slow one's,
while
it answers the process's other calls, are waited for (up to SLOW_LIMIT op_timeouts), not cut and sent again.

The rule on its own, with real threads and time; then through a real store behind a proxy that holds its answers
back (tests/helpers/slow_store.py): slow, not silent.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ftcoord import StoreProcess
from ftcoord.host import group_sockets
from ftcoord.store.call_watch import SLOW_LIMIT, CallWatch
from ftcoord.store.link import StoreLink
from tests.helpers.slow_store import SlowProxy
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)


class Said:
    """The watch's log: what it warned of, and when."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []

    def warning(self, event: str, **facts: Any) -> None:
        self.events.append((time.monotonic(), event, facts))

    def names(self) -> list[str]:
        return [name for _, name, _ in self.events]


@pytest.fixture
def cuts(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the watch shut a call's sockets down (it shuts none here: the calls are pretend)."""
    seen: list[float] = []
    monkeypatch.setattr(group_sockets, "shut_down", lambda sockets: seen.append(time.monotonic()) or 0)
    return seen


@pytest.fixture
def watch() -> Iterator[tuple[CallWatch, Said]]:
    closed, said = threading.Event(), Said()
    calls = CallWatch(1.0, closed, lambda before: {}, said)
    calls.start()
    yield calls, said
    closed.set()


def answering(calls: CallWatch, every: float, until: float) -> threading.Thread:
    """The store answers this process's other calls every `every` s until `until` (monotonic)."""

    def run() -> None:
        while time.monotonic() < until:
            calls.answered()
            threading.Event().wait(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_call_to_a_silent_store_is_cut_at_op_timeout(watch: tuple[CallWatch, Said], cuts: list[float]) -> None:
    calls, said = watch
    calls.answered()
    started = time.monotonic()
    calls.watch(1.0, {}, {})
    wait_until(lambda: cuts, 5, "the call to be cut")
    assert 1.0 <= cuts[0] - started < 1.4, f"cut {cuts[0] - started:.2f}s after it started (op_timeout 1 s)"
    assert said.names() == ["store_call_unanswered"]


def test_a_call_to_a_slow_store_that_answers_others_is_cut_only_at_the_limit(
        watch: tuple[CallWatch, Said], cuts: list[float]) -> None:
    """Sabotage: without the look at the store's latest answer, this call is cut at 1 s."""
    calls, said = watch
    started = time.monotonic()
    answering(calls, 0.2, started + 10)
    calls.watch(1.0, {}, {})
    wait_until(lambda: cuts, 8, "the call to be cut at the limit")
    assert SLOW_LIMIT <= cuts[0] - started < SLOW_LIMIT + 0.4, f"cut {cuts[0] - started:.2f}s after it started"
    assert said.names() == ["store_call_slow", "store_call_unanswered"]  # told once as slow, once as cut


def test_a_store_that_falls_silent_has_the_call_cut_op_timeout_after_its_last_answer(
        watch: tuple[CallWatch, Said], cuts: list[float]) -> None:
    calls, _ = watch
    started = time.monotonic()
    answering(calls, 0.1, started + 0.5).join()
    calls.watch(0.8, {}, {})  # due at 0.8 s after the answers stopped (a shorter call's own deadline)
    last = calls.answered_at
    wait_until(lambda: cuts, 5, "the call to be cut")
    assert last + 1.0 <= cuts[0] < last + 1.4, f"cut {cuts[0] - last:.2f}s after the store's last answer"


def test_a_slow_store_is_waited_for_not_cut_and_reconnected_to(job_id: str, cuts: list[float]) -> None:
    """A real store behind a proxy that delays each answer by 1.6 s, longer than op_timeout (1 s), while six threads
    of the process keep calling it (a process's heartbeat, leader duty, watch...): an add is answered once, 1.6 s
    late; nothing is cut, the store is never taken for away. Sabotage: LinkedStore not telling the watch of its
    answers, or the watch cutting at the deadline, and the calls are cut and sent again until the store is lost."""
    server = StoreProcess.start("127.0.0.1", 0)
    proxy = SlowProxy(server.address)
    link = StoreLink(proxy.address, job_id, op_timeout=1.0, store_timeout=15.0, may_start_job=True)
    stop = threading.Event()
    answers = [0] * 6
    try:
        client = link.connect()
        others = [link.client() for _ in answers]
        for other in others:
            other.add("beats", 1)  # connected while the store is fast: a slow one's connection is its own question

        def beat(i: int) -> None:
            stop.wait(i * 0.25)  # spread out, as a process's threads are
            while not stop.is_set():
                others[i].add("beats", 1)
                answers[i] += 1

        threads = [threading.Thread(target=beat, args=(i,), daemon=True) for i in range(len(others))]
        for thread in threads:
            thread.start()
        proxy.slow_down(to=1.6, over=4.0)
        wait_until(lambda: proxy.delay() >= 1.6 and sum(answers) >= 24, 20, "the store to answer 1.6 s late")
        assert not cuts, "a call was cut while the store fell behind"
        started = time.monotonic()
        assert client.add("n", 1) == 1, "sent more than once"
        took = time.monotonic() - started
        assert 1.6 <= took < 2.6, f"the add took {took:.2f}s (answers 1.6 s late)"
        assert not cuts and not link.down, "the slow store was taken for away"
        stop.set()
        for thread in threads:
            thread.join(5)
    finally:
        stop.set()
        link.close()
        proxy.close()
        server.stop()


def test_calls_watched_and_unwatched_from_many_threads_while_the_watch_reads_them() -> None:
    """Watching takes no lock (every store call watches and unwatches): the watch's read of the calls it watches
    (until_due here; its thread's cut reads them the same way, a copy) is never broken by threads that watch and
    unwatch meanwhile, every call gets a token of its own, and a call unwatched is no longer watched."""
    closed, said = threading.Event(), Said()
    calls = CallWatch(60.0, closed, lambda before: {}, said)  # not started: this test reads it as its thread would
    for _ in range(5000):
        calls.watch(60.0, {}, {})
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the interpreter lock over as often as it can be, mid-read included
    stop, tokens = threading.Event(), []

    def churn() -> None:
        while not stop.is_set():
            token = calls.watch(60.0, {}, {})
            tokens.append(token)
            calls.unwatch(token)

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(50):
            assert 0 < calls.until_due() <= 60.0
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        sys.setswitchinterval(switch)
    assert len(tokens) == len(set(tokens)) > 0  # every call its own token
    assert len(calls._watched) == 5000 and not set(tokens) & set(calls._watched)
