"""The interrupt watch: a thread that waits on `gen/<g>/interrupt` and flags the trainer.

The training thread only reads local flags at each step boundary (`interrupted`,
`should_stop`), so the steady-state step does no store operation at all. The same thread
carries a stop request (SIGTERM) to the whole job: the first process asked to stop writes
the `stop` key and interrupts the generation, so every member stops at the same step.
"""

from __future__ import annotations

import threading

import torch.distributed as dist

from ftcoord import keys
from ftcoord.errors import StoreLost
from ftcoord.log import get_logger
from ftcoord.store import get_or_none, wait_for_key


def stale_stop(store: dist.Store) -> bytes | None:
    """The `stop` request of an earlier run of this job (it was stopped, and has been relaunched), or None.

    A stop that ran its course is followed by `stopped`, the generation in which every member returned
    through should_stop, which is newer than the generation the stop was asked in. A stop still in
    progress is not stale: a replacement that starts meanwhile stops with the others.
    """
    stop = get_or_none(store, keys.STOP)
    if stop is None:
        return None
    stopped = get_or_none(store, keys.STOPPED)
    asked_in = int(stop.decode().split(":")[0] or 0)
    return stop if stopped is not None and int(stopped or 0) > asked_in else None


class InterruptMonitor:
    """Watches one generation at a time, on its own store client."""

    def __init__(self, store: dist.Store, slot: int, incarnation: int, slice_s: float = 0.1) -> None:
        self._store = store
        self._slot = slot
        self._incarnation = incarnation
        self._slice_s = slice_s
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._fired = threading.Event()
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
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._slice_s + 2.0)

    def watch(self, generation: int) -> None:
        """Switch to a new generation (clears the interrupt flag)."""
        with self._lock:
            self._generation = generation
            self._fired.clear()
            self.reason = None

    def request_stop(self) -> None:
        """Ask the whole job to stop (safe to call from a signal handler)."""
        self._local_stop.set()

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until the watched generation is interrupted or `timeout` passes."""
        return self._fired.wait(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                generation = self._generation
            try:
                self._carry_stop(generation)
                if generation is None or self._fired.is_set():
                    self._stop.wait(self._slice_s)
                    continue
                if wait_for_key(self._store, keys.interrupt(generation), self._slice_s):
                    reason = (get_or_none(self._store, keys.interrupt(generation)) or b"").decode()
                elif int(get_or_none(self._store, keys.CURRENT) or 0) > generation:
                    # Decided past us while we were paused: its keys may be gone already.
                    reason = "superseded"
                else:
                    continue
            except StoreLost as exc:
                self.store_lost = exc
                self.stop_requested.set()
                self._log.error("monitor_store_lost", error=str(exc))
                return
            except Exception as exc:  # store gone: the trainer will see it on its own
                if not self._stop.is_set():
                    self.failed = exc
                    self._fired.set()
                    self._log.error("monitor_failed", error=str(exc))
                return
            with self._lock:
                if generation != self._generation:
                    continue
                self.reason = reason
                self._fired.set()
            self._log.info("generation_interrupted", generation=generation, reason=reason)

    def _carry_stop(self, generation: int | None) -> None:
        """Publish a local stop request; notice one made anywhere in the job."""
        if self._local_stop.is_set() and not self.stop_requested.is_set():
            value = f"{generation or 0}:{self._slot}:{self._incarnation}"
            self._store.compare_set(keys.STOP, (self._stale_stop or b"").decode(), value)
            self._log.info("stop_requested", generation=generation)
        requested = get_or_none(self._store, keys.STOP)
        if requested is not None and requested != self._stale_stop and not self.stop_requested.is_set():
            # The generation ends first, so every member stops at the same step: they meet in
            # the next generation (healed, level) and stop at its first boundary.
            if generation is not None:
                self._store.compare_set(keys.interrupt(generation), "", f"stop:slot={self._slot}")
                with self._lock:
                    if generation == self._generation:
                        self.reason = "stop"
                        self._fired.set()
            self.stop_requested.set()
