"""The interrupt watch: a thread that waits on `gen/<g>/interrupt` and flags the trainer.

The training thread only reads local flags at each step boundary (`interrupted`,
`should_stop`), so the steady-state step does no store operation at all. The same thread
carries a stop request (SIGTERM) to the whole job: the first process asked to stop writes
the `stop` key and interrupts the generation, so every member stops at the same step. When another
reason won that interrupt, the next generation's record carries the stop (its leader looks for one as
it decides it), or, when the stop was asked after that look, the process that asked interrupts that
generation and the next one carries it; the members read nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch.distributed as dist

from ftcoord.errors import StoreLost
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none, wait_get, woken


def stale_stop(store: dist.Store) -> bytes | None:
    """The `stop` request of an earlier run of this job (it was stopped, and has been relaunched), or None.

    A stop that ran its course is followed by `stopped`, the generation in which every member returned
    through should_stop, which is newer than the generation the stop was asked in. A stop still in
    progress is not stale: a replacement that starts meanwhile stops with the others.
    """
    stop = get_or_none(store, keys.STOP)
    return stop if stop is not None and ran_its_course(store, stop) else None


def stop_asked(store: dist.Store) -> bool:
    """A stop was asked anywhere in the job (SIGTERM to a rank) in this run, not an earlier run's that ran its course.
    The leader reads it once per decision, and the generation it decides carries it (GenerationRecord.stop), so its
    members stop together at its first boundary, though the stop's own interrupt may have lost to another reason, and
    no member reads the stop itself; a stop asked after this read is carried into the next generation by the process
    that asked (InterruptWatch)."""
    stop = get_or_none(store, keys.STOP)
    return stop is not None and not ran_its_course(store, stop)


def ran_its_course(store: dist.Store, stop: bytes) -> bool:
    """The `stop` value read is followed by `stopped` (see stale_stop): one read, of `stopped`."""
    stopped = get_or_none(store, keys.STOPPED)
    asked_in = int(stop.decode().split(":")[0] or 0)
    return stopped is not None and int(stopped or 0) > asked_in


class InterruptWatch:
    """Watches one generation at a time, on its own store client.

    While the watched generation runs, the thread sits in one store wait on its interrupt key (slices of
    `slice_s`, 10 s at the defaults: a few requests per slice, whatever the job's size); when it fires, it
    waits on the generation's probe key (ftcoord.protocol.evidence) and has the heartbeat beat at once (`on_beat`)
    when a leader asks, until the process watches a newer generation (the leader sets the probe key to
    keys.PROBE_RELEASED once the next one is decided, which ends that wait without a beat: no member adds a beat
    and a status write to the burst of record reads). A wake after this process announced itself for a later
    generation (`announced`) is not even read: the announcement answers any question (the leader asks no member
    that rejoined: ftcoord.leader.judge), and a release asks nothing; so no member adds a read to that burst
    either. A leader asks by setting the interrupt, then the probe: a member still in the generation, or already out
    of it, answers after the question, never before.
    A local stop request is carried to the store by the heartbeat thread (`carry_local_stop`); one made
    anywhere in the job interrupts the generation, so it is seen here at once (or in the next generation, when
    another reason won that interrupt: see the module docstring).
    """

    def __init__(self, store: dist.Store, slot: int, incarnation: int, slice_s: float = 10.0,
                 on_beat: Callable[[], None] | None = None, tell_watch: Callable[[], None] = lambda: None) -> None:
        """`on_beat()`: have the heartbeat beat now (a leader's question); `tell_watch()`: called once this
        thread failed (ftcoord.liveness.helper_watch)."""
        self._store = store
        self._slot = slot
        self._incarnation = incarnation
        self._slice_s = slice_s
        self._on_beat = on_beat or (lambda: None)
        self._tell_watch = tell_watch
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._answered: int | None = None  # the generation whose probe this process answered
        self._announced = 0  # the newest generation this process announced itself for (its trainer thread sets it)
        self._stop_carried_in: int | None = None  # the newest generation this process's own stop interrupted
        self._fired = threading.Event()
        self._changed = threading.Event()  # a new generation to watch, or stop
        self._stop = threading.Event()
        self._local_stop = threading.Event()
        self._stale_stop = stale_stop(store)
        self.stop_requested = threading.Event()
        self.reason: str | None = None
        self.failed: BaseException | None = None
        self.store_lost: StoreLost | None = None
        """The store stayed away past store_timeout: training stops at its next boundary (should_stop), the
        generation is not interrupted (a checkpoint is written first; nobody can rejoin anyway)."""
        self._log = get_logger(component="monitor", slot=slot, incarnation=incarnation)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-monitor-{slot}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a wait it sits in is cut (`close` of its LinkedStore) rather than waited out."""
        self._stop.set()
        self._changed.set()
        close = getattr(self._store, "close", None)
        if close is not None:
            close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0 if close is not None else self._slice_s + 2.0)

    def watch(self, generation: int, stopping: bool = False) -> None:
        """Switch to a new generation (clears the interrupt flag); `stopping`: its record carries a stop (its members
        stop at its first boundary)."""
        with self._lock:
            self._generation = generation
            self._fired.clear()
            self.reason = None
            if stopping:
                self._stop_carried_in = generation  # every member knows: nothing to interrupt
                self.stop_requested.set()
        self._changed.set()

    def announced(self, generation: int) -> None:
        """This process announced itself for `generation` (the trainer thread, after the announcement's requests)."""
        self._announced = max(self._announced, generation)

    def request_stop(self) -> None:
        """Ask the whole job to stop: the heartbeat thread carries it at once. Safe from a signal handler, which runs
        in the training thread between two bytecodes: it sets only Events that thread never sets itself, so it never
        waits for a lock that thread holds (not `_changed`, which `watch` sets)."""
        self._local_stop.set()
        self._on_beat()

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until the watched generation is interrupted or `timeout` passes."""
        return self._fired.wait(timeout)

    def _run(self) -> None:
        try:
            self._carry_stop(self._store, None)  # a process that starts while the job stops stops too
            while not self._stop.is_set():
                self._round()
        except StoreLost as exc:
            self.store_lost = exc
            self.stop_requested.set()
            self._log.error("monitor_store_lost", error=str(exc))
        except Exception as exc:  # store gone: the trainer will see it on its own
            if not self._stop.is_set():
                self.failed = exc
                self._fired.set()
                self._log.error("monitor_failed", error=str(exc))
                self._tell_watch()

    def _round(self) -> None:
        self.carry_local_stop(self._store)  # the heartbeat thread carries it at once; this is the fallback
        with self._lock:
            generation, fired = self._generation, self._fired.is_set()
        if generation is None or (fired and self._answered == generation):
            self._changed.wait(self._slice_s)  # nothing to wait for in the store
            self._changed.clear()
            return
        if fired:
            if not woken(self._store, keys.probe(generation), self._slice_s):
                return
            if self._announced > generation:  # it rejoined: nothing to answer, no read (class docstring)
                self._answered = generation
                return
            asked = wait_get(self._store, keys.probe(generation), self._slice_s)  # woken: there (or woken for nothing)
            if asked:
                self._answered = generation
                if asked.decode() != keys.PROBE_RELEASED:  # a question (the release is not: no beat for it)
                    self._on_beat()
            return
        if self._local_stop.is_set() and self._stop_carried_in != generation:
            # This process asked for a stop, and this generation's record does not carry it (asked after its leader
            # looked: ftcoord.leader.duty): it ends the generation, and the next one carries the stop.
            self._stop_carried_in = generation
            self._store.compare_set(keys.interrupt(generation), "", f"stop:slot={self._slot}")
        value = wait_get(self._store, keys.interrupt(generation), self._slice_s)  # never empty: GenerationClient
        if value:
            reason = value.decode()
        elif int(get_or_none(self._store, keys.CURRENT) or 0) > generation:
            reason = "superseded"  # decided past us while we were paused: its keys may be gone already
        else:
            return
        with self._lock:
            if generation != self._generation:
                return
            self.reason = reason
            self._fired.set()
        self._log.info("generation_interrupted", generation=generation, reason=reason)
        if reason.startswith("stop"):
            self.stop_requested.set()
        # A stop asked while another reason won this interrupt reaches the members with the next generation's record
        # (its leader looks for a stop as it decides it: GenerationRecord.stop), or, asked after that look, by the
        # process that asked interrupting that generation (then the one after carries it). Every member stops at the
        # same step, and reads nothing here or at the start of a generation for it.

    def carry_local_stop(self, store: dist.Store) -> None:
        """Publish a local stop request (the heartbeat thread calls this before each beat, on its own client)."""
        if self._local_stop.is_set() and not self.stop_requested.is_set():
            with self._lock:
                generation = self._generation
            self._carry_stop(store, generation)

    def _carry_stop(self, store: dist.Store, generation: int | None) -> bool:
        """Publish a local stop request; notice one made anywhere in the job. True when one was noticed."""
        if self._local_stop.is_set() and not self.stop_requested.is_set():
            value = f"{generation or 0}:{self._slot}:{self._incarnation}"
            store.compare_set(keys.STOP, (self._stale_stop or b"").decode(), value)
            self._log.info("stop_requested", generation=generation)
        if self.stop_requested.is_set():
            return False
        requested = get_or_none(store, keys.STOP)
        if requested is None or requested == self._stale_stop:
            return False
        # The generation ends first, so every member stops at the same step: they meet in
        # the next generation (healed, level) and stop at its first boundary.
        if generation is not None:
            store.compare_set(keys.interrupt(generation), "", f"stop:slot={self._slot}")
            with self._lock:
                if generation == self._generation:
                    self.reason = "stop"
                    self._fired.set()
        self.stop_requested.set()
        return True
