"""When the leader deletes an old generation's keys: once the members of the newest have read its record.

A generation's keys (ftcoord.protocol.generations.forget: one request per key, one key per member) are deleted
KEEP_GENERATIONS decisions later, once the newest generation runs and its members all arrived at its rendezvous
(keys.all_arrived), or a heartbeat timeout after the decision: deletes must not queue among the members' reads of a
new record. Past BACKLOG waiting generations they go at the next round anyway, so the store stays flat however often
the job advances. A thread of the leader's process deletes them (`Forgetter`, on a client of its own), so the leader
hears interrupts meanwhile; one BACKLOG generations behind takes no more, and the leader deletes the next itself.
A leader that loses its leadership leaves the generations still waiting behind (a few keys per change of leader).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ftcoord.errors import StoreLost
from ftcoord.protocol import keys
from ftcoord.protocol.generations import forget

KEEP_GENERATIONS = 4
"""A generation's keys are deleted this many decisions after it (the newest generations stay readable)."""
BACKLOG = 4
"""Generations waiting to be forgotten at most: past it they are deleted at the next round, quiet or not."""


class ForgetSchedule:
    """The leader's list of generations to forget, and when it may."""

    def __init__(self, patience_s: float, forgetter: Forgetter | None = None) -> None:
        """`patience_s`: how long after a decision to wait for its members to arrive before forgetting anyway.
        `forgetter`: who deletes a generation due (None: `run`'s caller, on its own client)."""
        self._patience_s = patience_s
        self._forgetter = forgetter
        self._waiting: list[int] = []
        self._decided_at = 0.0  # when this leader last decided

    @property
    def waiting(self) -> list[int]:
        return list(self._waiting)

    def decided(self, generation: int) -> None:
        """This leader decided `generation`: the one KEEP_GENERATIONS before it may be forgotten."""
        if generation - KEEP_GENERATIONS >= 1:
            self._waiting.append(generation - KEEP_GENERATIONS)
        self._decided_at = time.monotonic()

    def run(self, store: dist.Store, running: int | None) -> bool:
        """Forget what waits when it is time: `running` is the generation now running, not interrupted (None when
        none is). True when something was forgotten."""
        if not self._waiting:
            return False
        if len(self._waiting) <= BACKLOG and not self._quiet(store, running):
            return False
        for generation in self._waiting:
            if self._forgetter is None or not self._forgetter.hand(generation):
                forget(store, generation)  # no forgetter, or one BACKLOG behind: here, and the leader's round waits
        self._waiting.clear()
        return True

    def _quiet(self, store: dist.Store, running: int | None) -> bool:
        if running is None:
            return False  # a generation being decided: its members read the store now
        return time.monotonic() - self._decided_at >= self._patience_s or bool(store.check([keys.all_arrived(running)]))


class Forgetter:
    """A thread that deletes the generations a leader hands it (ftcoord.protocol.generations.forget), on a client of
    its own, so that the leader's round does not wait for their round trips (module docstring)."""

    def __init__(self, open_client: Callable[[], dist.Store], name: str, log: Any) -> None:
        """`open_client()`: the thread's own store client, opened by the thread at the first hand-over (a process
        that never leads opens none). `name`: the thread's (ftcoord-forget-<slot>: its requests are counted apart)."""
        self._open_client = open_client
        self._name = name
        self._log = log
        self._due: queue.Queue[int | None] = queue.Queue(maxsize=BACKLOG)
        self._thread: threading.Thread | None = None
        self._client: dist.Store | None = None
        self._stopping = threading.Event()
        self.failed: BaseException | None = None
        """Why the thread ended early (its client could not be opened; the store was lost): it takes nothing more."""

    @property
    def thread(self) -> threading.Thread | None:
        """Its thread, once the first generation was handed over."""
        return self._thread

    def hand(self, generation: int) -> bool:
        """Have the thread delete `generation`'s keys. False when it cannot take it now (BACKLOG generations wait, or
        the thread ended): the caller deletes them itself."""
        if self.failed is not None or self._stopping.is_set():
            return False
        try:
            self._due.put_nowait(generation)
        except queue.Full:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return True

    def stop(self, wait_s: float) -> None:
        """End the thread once what it holds is deleted, waiting up to `wait_s` for that (0: a store away right now
        is not waited for, ftcoord.wrapper.participant's close); past it, a delete in flight is cut (its client
        closed)."""
        self._stopping.set()
        if self._thread is None:
            return
        try:
            self._due.put_nowait(None)
        except queue.Full:
            pass  # it stops once what it holds is deleted
        if wait_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
        if self._thread.is_alive():
            self._close_client()

    def _run(self) -> None:
        try:
            self._client = self._open_client()
        except Exception as exc:  # noqa: BLE001 - the leader deletes them itself from now on
            self._end(exc)
            return
        try:
            while (generation := self._due.get()) is not None:
                try:
                    forget(self._client, generation)
                except StoreLost as exc:
                    self._end(exc)
                    return
                except Exception as exc:  # noqa: BLE001 - keys left behind, not a fault of the job's
                    if self._stopping.is_set():
                        return  # cut by stop
                    self._log.warning("generation_not_forgotten", generation=generation, error=str(exc)[:200])
                if self._stopping.is_set() and self._due.empty():
                    return  # stopped while BACKLOG waited: no end mark reached the queue
        finally:
            self._close_client()  # however it ends: its connection is the store's descriptor

    def _close_client(self) -> None:
        close = getattr(self._client, "close", None)  # a LinkedStore's cuts a call in flight, from any thread
        if close is not None:
            close()

    def _end(self, exc: BaseException) -> None:
        self.failed = exc
        self._log.warning("forgetter_ended", error=str(exc)[:200])
        while True:  # what it still held is left behind (a few generations' keys), as on a lost leadership
            try:
                self._due.get_nowait()
            except queue.Empty:
                return
