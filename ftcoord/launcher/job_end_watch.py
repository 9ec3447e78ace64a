"""A launcher's processes once the job is done or stopped: each exits within a moment, or is killed after grace_s.

A member returns from the function and exits; a hot spare wakes on keys.ENDED and exits. A process whose training
thread is stuck never exits (its heartbeat thread keeps it alive), and its launcher, which waits for every child,
would wait with it. The leader fences such a process while the job runs, but not one stuck for less than the
progress timeout at the end, nor any when that timeout is off. So the launcher looks at keys.DONE and keys.STOPPED
(a stop in this run, not an earlier run's) every DONE_POLL_S and SIGKILLs a child still running grace_s after it
first saw the job end; the job is complete, so the launcher still exits 0. Once the job ended, a child that exits
with an error is not restarted: nothing is left to join.
"""

from __future__ import annotations

import math

import torch.distributed as dist

from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none

DONE_POLL_S = 1.0
"""How often a launcher with running children looks whether the job ended: two store requests, at most once a
second per launcher, fewer than each of its ranks sends."""


class JobEndWatch:
    """When the job was first seen ended (done, or stopped in this run), and which children have outstayed it by the
    grace period."""

    def __init__(self, grace_s: float, stale_stopped: bytes | None) -> None:
        """`stale_stopped`: keys.STOPPED as it was when the launcher started (an earlier run's stop, or None)."""
        self._grace_s = grace_s
        self._stale_stopped = stale_stopped
        self._looked_at = -math.inf
        self.ended_at: float | None = None

    def ended(self, store: dist.Store, now: float) -> bool:
        """Has the job ended (done, or stopped in this run)? Reads the store (two requests) until it has."""
        if self.ended_at is None and (store.check([keys.DONE]) or self._stopped_in_this_run(store)):
            self.ended_at = now
        return self.ended_at is not None

    def _stopped_in_this_run(self, store: dist.Store) -> bool:
        stopped = get_or_none(store, keys.STOPPED)
        return stopped is not None and stopped != self._stale_stopped

    def outstayed(self, store: dist.Store, now: float) -> bool:
        """Are the children still running now past their time (the job ended grace_s ago)? Looks at the store at
        most every DONE_POLL_S until the job is seen ended."""
        if self.ended_at is None and now - self._looked_at >= DONE_POLL_S:
            self._looked_at = now
            self.ended(store, now)
        return self.ended_at is not None and now - self.ended_at >= self._grace_s
