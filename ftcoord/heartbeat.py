"""Heartbeats and liveness.

A process proves it is alive by bumping a counter; an observer decides liveness by *when
it saw the counter change*, on its own monotonic clock. No wall-clock time is compared
across hosts, so clock skew cannot kill a healthy process or keep a dead one alive.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

import torch.distributed as dist

from ftcoord import jobs, keys
from ftcoord.log import get_logger
from ftcoord.slot_report import SlotReport
from ftcoord.store import raise_to, wait_for_key

# Where a training thread sits while it waits for its peers (ftcoord's own generation.py: joining a
# generation, or finished and waiting for the others to finish).
_SLICE_S = 1.0  # the longest store wait of the heartbeat thread: how long `stop` may have to wait for it

WAITING_MODULES = ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/", "/ftcoord/generation.py")


class Heartbeat:
    """A daemon thread that bumps `hb/<slot>` every interval, on its own store client.

    It also publishes the training thread's progress counter (bumped by `ping()` with no
    store operation), so a process whose heartbeat thread runs but whose training thread
    is stuck can be told apart from a healthy one.
    """

    def __init__(self, store: dist.Store, slot: int, interval: float, report: SlotReport | None = None) -> None:
        self._store = store
        self.report = report
        self._published_status = ""
        self._first_commit_noted = False
        self._slot = slot
        self._interval = interval
        self._stop = threading.Event()
        self._progress = 0
        self._training_thread: int | None = None
        self._published_progress = ""
        self.beats = 0
        self.failed: BaseException | None = None
        self._asked = 0  # the newest probe answered
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-heartbeat-{slot}", daemon=True)
        self._log = get_logger(component="heartbeat", slot=slot)

    def start(self) -> None:
        """Beat once and start the thread. The probe counter is read here, before the beat, and not by the
        thread: a probe asked before the read is answered by this beat, one asked after it is waited for.
        (Read by the thread, a probe asked while the thread was still starting was missed, and the
        member stayed silent for a whole interval: a live process would have been declared gone.)"""
        self._asked = int(self._store.add(keys.PROBE, 0))
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        """One heartbeat now (also used at start, so observers see us at once)."""
        self.beats = int(self._store.add(keys.heartbeat(self._slot), 1))
        progress = f"{self._progress}:w" if self._waiting_on_peers() else str(self._progress)
        if progress != self._published_progress:
            self._store.set(keys.progress(self._slot), progress)
            self._published_progress = progress
        if self.report is not None:
            self._publish_report(self.report)

    def _publish_report(self, report: SlotReport) -> None:
        """The slot's status, when it changed, and the incidents this process measured (ftcoord.slot_report)."""
        status = json.dumps(report.status(), separators=(",", ":"))
        if status != self._published_status:
            if report.step >= 0 and not self._first_commit_noted:
                jobs.note_first_commit(self._store)
                self._first_commit_noted = True
            self._store.set(keys.status(self._slot), status)
            self._published_status = status
        for incident in report.take_incidents():
            self._store.append(keys.INCIDENTS, incident.to_json() + "\n")
            self._log.info("generation_changed", mono=time.monotonic(), **incident.__dict__)

    def rebuild(self) -> None:
        """The store restarted (ftcoord.rebuild): publish everything again; probes count from 0 there."""
        self._published_status = ""
        self._published_progress = ""
        self._first_commit_noted = False
        self._asked = 0

    def ping(self) -> None:
        """Record training progress: a local increment, published by the next beat."""
        self._progress += 1
        self._training_thread = threading.get_ident()

    def _waiting_on_peers(self) -> bool:
        """Is the training thread inside torch.distributed / autograd (waiting on peers)?

        When one rank is stuck, its peers block in the next collective and stop pinging
        too; this flag tells the leader which of the silent ranks is the culprit.
        """
        if self._training_thread is None:
            return False
        frame = frame_of(self._training_thread)
        for _ in range(4):
            if frame is None:
                return False
            name = frame.f_code.co_filename.replace("\\", "/")
            if any(part in name for part in WAITING_MODULES):
                return True
            frame = frame.f_back
        return False

    def _wait_for_probe(self, number: int) -> bool:
        """Wait up to one interval for probe `number`, in slices of at most a second (so `stop` is prompt)."""
        deadline = time.monotonic() + self._interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if wait_for_key(self._store, keys.probe(number), min(left, _SLICE_S)):
                return True
        return False

    def _run(self) -> None:
        """Beat every interval, and at once when a leader asks (a probe: ftcoord.evidence)."""
        try:
            while not self._stop.is_set():
                if self._wait_for_probe(self._asked + 1):
                    self._asked = int(self._store.add(keys.PROBE, 0))
                if self._stop.is_set():
                    return
                self.beat()
        except Exception as exc:  # the store is gone: nothing left to prove to
            if self._stop.is_set():
                return
            self.failed = exc
            self._log.error("heartbeat_failed", error=str(exc))

    def stop(self) -> None:
        """Stop beating, and wait (up to one wait slice and a second) for the thread to leave its store wait:
        a process that exits while a thread still sits inside a C++ store call can abort in the
        interpreter's teardown ("terminate called without an active exception", seen on a plain
        `python script.py` without ftcoord-launch, whose processes skip that teardown)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(min(self._interval, _SLICE_S) + 1.0)


def frame_of(thread_id: int) -> FrameType | None:
    """The current frame of another thread, without CPython 3.11's deadlock (python/cpython#106883).

    `sys._current_frames()` holds the runtime's thread-list lock while it allocates; an allocation can
    start a garbage collection whose finalizers take that lock again, and the thread then waits forever
    holding the GIL: the whole process froze (seen: a unit test stuck for 10 minutes, its timeout
    unable to fire; in a rank, every thread stops and the rank is fenced as hung). 3.12 disables the
    collector around the call; so do we, leaving it as we found it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames().get(thread_id)
    finally:
        if enabled:
            gc.enable()


class LivenessObserver:
    """Decides staleness of counters from when this observer saw them change.

    A fresh observer has seen nothing change yet, so it must watch for a full timeout
    before it may call anyone dead: a new leader never kills on stale data.

    Silence is measured between observations, never up to "now": a counter is silent for the time
    between the read that first showed its current value and the latest read. An observer that was
    itself paused (SIGSTOP, a long GC, swapping) between a read and its judgement therefore sees no
    silence that it did not observe; its next read shows whoever kept beating as alive.
    """

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._born = clock()
        self._seen: dict[str, tuple[object, float, float]] = {}  # value, first seen at, last read at

    def reset(self) -> None:
        """Forget everything (after this observer itself was paused, e.g. SIGSTOPped)."""
        self._born = self._clock()
        self._seen.clear()

    def observe(self, name: str, value: object, at: float | None = None) -> None:
        """Feed the latest value of a counter (any value compared with `!=`), read at `at` (this observer's
        clock; now when not given)."""
        now = self._clock() if at is None else at
        previous = self._seen.get(name)
        if previous is None or previous[0] != value:
            self._seen[name] = (value, now, now)
        else:
            self._seen[name] = (value, previous[1], now)

    def silent_for(self, name: str) -> float:
        """Seconds the counter was observed unchanged: from the read that first showed its value (or this
        observer's birth) to the latest read."""
        previous = self._seen.get(name)
        if previous is None:
            return 0.0
        return previous[2] - max(previous[1], self._born)

    def silent_since(self, name: str, moment: float, until: float) -> bool:
        """This observer watched the counter from before `moment` (its own clock), read it again at or after
        `until`, and saw no change after `moment`."""
        previous = self._seen.get(name)
        return (self._born <= moment and previous is not None and previous[1] <= moment
                and previous[2] >= until)

    def never_changed(self, name: str) -> bool:
        """The counter has shown one value since this observer was born (its silence is a lower bound)."""
        previous = self._seen.get(name)
        return previous is None or previous[1] <= self._born

    def is_stale(self, name: str, timeout: float | None = None) -> bool:
        return self.silent_for(name) >= (self.timeout if timeout is None else timeout)


def mark_dead(store: dist.Store, slot: int, incarnation: int) -> None:
    """Fast path for a local parent that saw the process die: no heartbeat timeout needed.

    Monotonic per slot: marking an older incarnation never revives a newer dead one.
    """
    raise_to(store, keys.dead(slot), incarnation)
