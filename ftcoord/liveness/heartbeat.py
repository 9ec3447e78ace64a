"""Heartbeats and liveness.

A process proves it is alive by bumping a counter; an observer decides liveness by *when
it saw the counter change*, on its own monotonic clock. No wall-clock time is compared
across hosts, so clock skew cannot kill a healthy process or keep a dead one alive.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

import torch.distributed as dist

from ftcoord.liveness.still_stack import StillStack, waits_on_peers
from ftcoord.log import get_logger
from ftcoord.protocol import jobs, keys
from ftcoord.protocol.slot_report import SlotReport
from ftcoord.store.client import raise_to

_STOP_WAIT_S = 2.0  # how long `stop` waits for a beat in flight


class Heartbeat:
    """A daemon thread that bumps `hb/<slot>` every interval, on its own store client: one store request per
    beat at steady state (ftcoord's store load per process is bounded: `chaos bench --scale`).

    It also publishes the training thread's progress counter (bumped by `ping()` with no store operation) and the
    step it last committed in this generation (`<pings>/<step>`, `:w` appended while it waits on its peers), so a
    process whose heartbeat thread runs but whose training thread is stuck can be told apart from a healthy one, and
    the slot's status for operators: each when it changed, but a change that only counts on is published at most
    every `publish_every` seconds (a new generation, a first commit, stopping to wait on peers: at the next beat;
    waiting on peers: once the training thread stood still for `publish_every`, see `beat`). A training thread that
    trained here and stood still outside ftcoord's join for `publish_every` or more has its stillness published too
    (`@<seconds>,<generation>`, whole multiples of `publish_every`, counted from its last ping, its last join or the
    last beat that saw it waiting on its peers, whichever came later, in the generation it names; published at the
    next beat once it ends): a leader that takes over during the stillness counts from there, not from its
    own first read (ftcoord.leader.judge). The thread waits for nothing in the store: a leader's
    question ("beat now", ftcoord.protocol.evidence) reaches it through `beat_now()`, from the interrupt monitor.
    """

    def __init__(self, store: dist.Store, slot: int, interval: float, report: SlotReport | None = None,
                 publish_every: float | None = None,
                 before_beat: Callable[[dist.Store], None] | None = None,
                 tell_watch: Callable[[], None] = lambda: None, still_stack: StillStack | None = None) -> None:
        """`publish_every`: how stale published progress and status may be (default: 10 intervals); the
        leader's stuck-rank judgement needs it well below the progress timeout. `before_beat(store)`: run
        in this thread, on its client, before each beat (the monitor carries a local stop request).
        `tell_watch()`: called once this thread failed (ftcoord.liveness.helper_watch). `still_stack`: logs where a
        training thread that stood still stands (ftcoord.liveness.still_stack); None: nobody looks."""
        self._store = store
        self.report = report
        self._published_status = ""
        self._published_identity: tuple[int, int | None] | None = None
        self._first_commit_noted = False
        self._slot = slot
        self._interval = interval
        self._publish_every = 10 * interval if publish_every is None else publish_every
        self._before_beat = before_beat
        self._tell_watch = tell_watch
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._progress = 0
        self._training_thread: int | None = None  # the thread that joins generations and pings
        # Its kernel id, read by itself: a process forked from the warm standby keeps its template's in `threading`.
        self._training_native: int | None = None
        self._in_join = False  # that thread is in ftcoord's join: waiting on its peers, nothing to look at
        self._still_stack = still_stack
        self._published_progress = ""
        self._progress_at_beat = -1
        self._still_since = time.monotonic()  # when a beat last saw the progress counter move
        self._joined_at = -math.inf  # when the training thread last joined a generation
        self._waited_at = -math.inf  # when a beat last saw it waiting on its peers
        self._progress_at = -math.inf  # when progress (and, apart, status) was last published
        self._status_at = -math.inf
        self.beats = 0
        self.failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-heartbeat-{slot}", daemon=True)
        self._log = get_logger(component="heartbeat", slot=slot)

    def start(self) -> None:
        """Beat once and start the thread."""
        self.beat()
        self._thread.start()

    def beat_now(self) -> None:
        """Have the thread beat at once (a leader asked, or the generation ended); safe from any thread."""
        self._wake.set()

    def beat(self) -> None:
        """One heartbeat now (also used at start, so observers see us at once)."""
        self.beats = int(self._store.add(keys.heartbeat(self._slot), 1))
        now = time.monotonic()
        if self._progress != self._progress_at_beat:
            self._still_since = now
            if self._still_stack is not None:
                self._still_stack.moved()
        # Only a training thread whose progress stood still may be waiting on its peers, and the leader asks only
        # about one that stood still for progress_timeout: it is looked at once still for publish_every (at most a
        # quarter of that timeout), at every beat from then on. Looking costs a snapshot of every thread's frame,
        # O(threads in the process): too dear at every still beat in a process of many threads.
        waiting = (self._progress == self._progress_at_beat and now - self._still_since >= self._publish_every
                   and self._waiting_on_peers())
        if waiting:
            self._waited_at = now
        self._progress_at_beat = self._progress
        # With the step last committed in this generation: the leader compares still members by it, never by this
        # process's count of pings (a replacement's starts at 0: ftcoord.leader.judge.Judge.hung_members).
        step = self.report.step_in_generation() if self.report is not None else -1
        if self._still_stack is not None:
            if self._still_stack.due():
                thread = None if self._in_join else self._training_thread
                self._still_stack.look(frame_of(thread) if thread is not None else None, step, self._training_native)
            if self.report is not None:
                self.report.still_at = self._still_stack.at
        counted = f"{self._progress}/{step}" if step >= 0 else str(self._progress)
        still = self._still_for(now)
        if still > 0 and self.report is not None:  # counted in its generation, and said so
            counted = f"{counted}@{still:g},{self.report.generation}"
        progress = f"{counted}:w" if waiting else counted
        published = self._published_progress
        if progress != published and (waiting != published.endswith(":w") or ("@" in published) != ("@" in progress)
                                      or now - self._progress_at >= self._publish_every):
            self._store.set(keys.progress(self._slot), progress)
            self._published_progress, self._progress_at = progress, now
        if self.report is not None:
            self._publish_report(self.report, now)

    def _still_for(self, now: float) -> float:
        """How long the training thread has stood still on its own, as published: since its last ping, its last join
        or the last beat that saw it waiting on its peers, whichever came later, in whole multiples of publish_every,
        rounded down (a lower bound, and one more publication per publish_every at most, only while it stands still);
        0 in ftcoord's join (where a hot spare waits for hours) and before it ever pinged (a spare, a process
        starting). Never the time it waited on its peers: a peer that waited for a stuck rank, then left the
        collective when that rank was fenced, would publish that wait as stillness as it tore down, and a leader
        would fence it as stuck."""
        if self._in_join or self._progress == 0:
            return 0.0
        still = now - max(self._still_since, self._joined_at, self._waited_at)
        return math.floor(still / self._publish_every) * self._publish_every if still >= self._publish_every else 0.0

    def _publish_report(self, report: SlotReport, now: float) -> None:
        """The slot's status, when it changed (at most every publish_every unless its generation or rank did, or
        it committed its first step), and the incidents this process measured (ftcoord.protocol.slot_report)."""
        identity = (report.generation, report.rank)
        first_commit = report.step >= 0 and not self._first_commit_noted
        if identity != self._published_identity or first_commit or now - self._status_at >= self._publish_every:
            status = json.dumps(report.status(), separators=(",", ":"))
            self._status_at = now  # looked: the next look is publish_every away, whether it changed or not (a status
            # that stands still, a spare's or a member's waiting on its peers, is not encoded again at every beat)
            if status != self._published_status:
                if first_commit:
                    jobs.note_first_commit(self._store)
                    self._first_commit_noted = True
                self._store.set(keys.status(self._slot), status)
                self._published_status, self._published_identity = status, identity
        for incident in report.take_incidents():
            self._store.append(keys.INCIDENTS, incident.to_json() + "\n")
            self._log.info("generation_changed", mono=time.monotonic(), **incident.__dict__)

    def rebuild(self) -> None:
        """The store restarted (ftcoord.protocol.restore): publish everything again."""
        self._published_status = ""
        self._published_identity = None
        self._published_progress = ""
        self._progress_at = self._status_at = -math.inf
        self._first_commit_noted = False

    def ping(self) -> None:
        """Record training progress: a local increment, published by a later beat."""
        self._progress += 1
        self._training_thread, self._training_native = threading.get_ident(), threading.get_native_id()

    def joining(self) -> None:
        """The training thread waits in ftcoord's join: on its peers (published so, and looked at by nobody)."""
        self._in_join = True

    def joined(self) -> None:
        """The calling thread joined a generation: it is the training thread, and it moved
        (ftcoord.liveness.still_stack)."""
        self._training_thread, self._training_native = threading.get_ident(), threading.get_native_id()
        self._joined_at = time.monotonic()  # its stillness, as published, counts from here (a leader's does: a new
        # generation is a new value of its progress)
        self._in_join = False
        if self._still_stack is not None:
            self._still_stack.moved()

    def _waiting_on_peers(self) -> bool:
        """Is the training thread in a collective, or in ftcoord's join or finish (waiting on its peers:
        ftcoord.liveness.still_stack.waits_on_peers)? Before its first ping the training thread is the one that
        joined (`joined`): a member waiting in its first all-reduce on a peer stuck in its first forward is waiting,
        and must not be fenced with the culprit."""
        if self._in_join:  # no snapshot of every thread's frames: a spare waits there for hours (chaos bench --scale)
            return True
        return self._training_thread is not None and waits_on_peers(frame_of(self._training_thread))

    def _run(self) -> None:
        """Beat every interval, and at once when asked (`beat_now`)."""
        try:
            while not self._stop.is_set():
                self._wake.wait(self._interval)
                self._wake.clear()
                if self._stop.is_set():
                    return
                if self._before_beat is not None:
                    self._before_beat(self._store)
                self.beat()
        except Exception as exc:  # the store is gone: nothing left to prove to
            if self._stop.is_set():
                return
            self.failed = exc
            self._log.error("heartbeat_failed", error=str(exc))
            self._tell_watch()

    def stop(self) -> None:
        """Stop beating, and wait for the thread to leave (it waits for nothing in the store, so at once unless
        a beat is in flight): a process that exits while a thread still sits inside a C++ store call can abort
        in the interpreter's teardown ("terminate called without an active exception")."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_STOP_WAIT_S)


def frame_of(thread_id: int) -> FrameType | None:
    """The current frame of another thread, without CPython 3.11's deadlock (python/cpython#106883).

    `sys._current_frames()` holds the runtime's thread-list lock while it allocates; an allocation can
    start a garbage collection whose finalizers take that lock again, and the thread then waits forever
    holding the GIL: the whole process freezes (in a rank, every thread stops and the rank is fenced as
    hung). 3.12 disables the collector around the call; so do we, leaving it as we found it.
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

    One exception, for a counter whose owner vouches for its own silence: a training thread's progress, read with
    how long the process's heartbeat saw it stand still (`observe(..., vouched=s)`). That account is published by a
    live process, about itself, now (its heartbeat runs): it is not stale data. Its silence counts from there, a
    fresh observer's included, so a leader that takes over during a stall judges it as its predecessor would have.
    """

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._born = clock()
        self._seen: dict[str, tuple[object, float, float]] = {}  # value, first seen at, last read at
        self._changed_at: dict[str, float] = {}  # the read that showed a new value (not the first one observed)
        self._vouched: set[str] = set()  # counters whose silence counts from their owner's account (class docstring)
        self._newest = -math.inf  # when the newest read was asked

    def reset(self) -> None:
        """Forget everything (after this observer itself was paused, e.g. SIGSTOPped)."""
        self._born = self._clock()
        self._seen.clear()
        self._changed_at.clear()
        self._vouched.clear()
        self._newest = -math.inf

    def observe(self, name: str, value: object, at: float | None = None, vouched: float = 0.0) -> None:
        """Feed the latest value of a counter (any value compared with `!=`), read at `at` (this observer's
        clock; now when not given). `vouched`: seconds the counter's owner says it has stood still, read with it
        (its silence counts from then, if that is earlier: class docstring)."""
        now = self._clock() if at is None else at
        self._newest = max(self._newest, now)
        previous = self._seen.get(name)
        if previous is None or previous[0] != value:
            self._seen[name] = (value, now, now)
            self._vouched.discard(name)
            if previous is not None:
                self._changed_at[name] = now
        else:
            self._seen[name] = (value, previous[1], now)
        if vouched > 0 and now - vouched < self._seen[name][1]:
            self._seen[name] = (value, now - vouched, now)
            self._vouched.add(name)

    def forget(self, name: str) -> None:
        """Stop watching one counter: its silence is measured afresh from its next observation."""
        self._seen.pop(name, None)
        self._changed_at.pop(name, None)
        self._vouched.discard(name)

    def _silent_from(self, name: str, first: float) -> float:
        """When the counter's silence began, as this observer may count it: the read that first showed its value, or
        this observer's birth if later, unless its owner vouched for an earlier moment."""
        return first if name in self._vouched else max(first, self._born)

    def silent_for(self, name: str) -> float:
        """Seconds the counter was observed unchanged: from the read that first showed its value (or this
        observer's birth; or, vouched for, when its owner says it stood still) to the latest read."""
        previous = self._seen.get(name)
        if previous is None:
            return 0.0
        return previous[2] - self._silent_from(name, previous[1])

    def silent_since(self, name: str, moment: float, until: float) -> bool:
        """This observer watched the counter from before `moment` (its own clock), read it again at or after
        `until`, and saw no change after `moment`."""
        previous = self._seen.get(name)
        return (self._born <= moment and previous is not None and previous[1] <= moment
                and previous[2] >= until)

    def changed_after(self, name: str, moment: float) -> bool:
        """A read after `moment` (this observer's clock) showed the counter changed from the value read before it (as
        a process that beats after `moment` does; the first value this observer read is no change, or a leader that
        took over a moment ago would take a dead process's last beat for one)."""
        return self._changed_at.get(name, -math.inf) > moment

    def never_changed(self, name: str) -> bool:
        """The counter has shown one value since this observer was born (its silence is a lower bound)."""
        previous = self._seen.get(name)
        return previous is None or previous[1] <= self._born

    def stale_at(self, prefix: str) -> float:
        """When to ask a read that would find a counter named `prefix...` silent for the timeout if it stays as it is
        (this observer's clock; math.inf: none), among the counters the newest read showed unchanged and not yet
        silent that long. A watcher that reads on a grid (the leader's tick, a deputy's interval) finds a silence up
        to one step of its grid late; reading at this moment too, it finds it on the dot. A counter just seen changing
        is not due (a watcher that reads rarely is not woken early for it), nor one the newest read did not read (not
        watched any more: its moment would come again and again)."""
        timeout, newest, due = self.timeout, self._newest, math.inf
        for name, (_, first, last) in self._seen.items():
            if last == newest and last > first and name.startswith(prefix):
                at = self._silent_from(name, first) + timeout
                if last < at < due:
                    due = at
        return due

    def is_stale(self, name: str, timeout: float | None = None) -> bool:
        return self.silent_for(name) >= (self.timeout if timeout is None else timeout)


def mark_dead(store: dist.Store, slot: int, incarnation: int) -> None:
    """Fast path for a local parent that saw the process die: no heartbeat timeout needed.

    Monotonic per slot: marking an older incarnation never revives a newer dead one.

    Args:
        store: a store client of the job's.
        slot: the slot whose process died.
        incarnation: the incarnation of that slot that died; the slot's dead key (keys.dead) is raised to it,
            never lowered.
    """
    raise_to(store, keys.dead(slot), incarnation)
