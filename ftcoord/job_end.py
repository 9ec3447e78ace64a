"""A launcher's processes once the job is done: each exits within a moment, or is ended after the grace period.

A member returns from the function and exits; a hot spare wakes on keys.ENDED and exits. A process whose training
thread is stuck exits never: its heartbeat thread keeps it alive, nothing in it is waiting for the job's end, and
its launcher (which waits for every child) would wait with it, an hour for `chaos`'s injected stall (random
schedule, seed 404: a rank stuck outside every generation when the job finished). The leader fences such a process
while the job runs (ftcoord.judgement: stuck members, stuck outsiders), but not one that got stuck less than the
progress timeout before the end, nor any when the progress timeout is off. So the launcher looks at keys.DONE
(every DONE_POLL_S, one request) and SIGKILLs a child still running grace_s after it first saw the job done; the
job is complete, so the launcher still exits 0 (and says what it ended).
"""

from __future__ import annotations

import math

import torch.distributed as dist

from ftcoord import keys

DONE_POLL_S = 1.0
"""How often a launcher with running children looks whether the job is done: one store request, at most once a
second per launcher (a thousand launchers: 1,000 requests per second, where their ranks send ~3 each)."""


class JobEndWatch:
    """When the job was first seen done, and which children have outstayed it by the grace period."""

    def __init__(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self._looked_at = -math.inf
        self.done_at: float | None = None

    def saw_done(self, now: float) -> None:
        """The job is known done (a child found keys.DONE when it exited)."""
        if self.done_at is None:
            self.done_at = now

    def outstayed(self, store: dist.Store, now: float) -> bool:
        """Are the children still running now past their time (the job done grace_s ago)? Looks at the store at
        most every DONE_POLL_S until the job is seen done."""
        if self.done_at is None and now - self._looked_at >= DONE_POLL_S:
            self._looked_at = now
            if store.check([keys.DONE]):
                self.done_at = now
        return self.done_at is not None and now - self.done_at >= self._grace_s
