"""The interrupt watch: a thread that waits on `gen/<g>/interrupt` and flags the trainer.

The training thread only reads a local flag at each step boundary (`interrupted`), so the
steady-state step does no store operation at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch.distributed as dist

from ftcoord import keys
from ftcoord.log import get_logger
from ftcoord.store import get_or_none, wait_for_key


class InterruptMonitor:
    """Watches one generation at a time, on its own store client."""

    def __init__(self, store: dist.Store, slot: int, slice_s: float = 0.1) -> None:
        self._store = store
        self._slice_s = slice_s
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._fired = threading.Event()
        self._callbacks: list[Callable[[int, str], None]] = []
        self._stop = threading.Event()
        self.reason: str | None = None
        self.failed: BaseException | None = None
        self._log = get_logger(component="monitor", slot=slot)
        self._thread = threading.Thread(target=self._run, name=f"ftcoord-monitor-{slot}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._slice_s + 2.0)

    def on_interrupt(self, callback: Callable[[int, str], None]) -> None:
        """Called from the monitor thread when the watched generation is interrupted."""
        self._callbacks.append(callback)

    def watch(self, generation: int) -> None:
        """Switch to a new generation (clears the flag)."""
        with self._lock:
            self._generation = generation
            self._fired.clear()
            self.reason = None

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
            if generation is None or self._fired.is_set():
                self._stop.wait(self._slice_s)
                continue
            try:
                if not wait_for_key(self._store, keys.interrupt(generation), self._slice_s):
                    continue
                reason = (get_or_none(self._store, keys.interrupt(generation)) or b"").decode()
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
            for callback in self._callbacks:
                callback(generation, reason)
