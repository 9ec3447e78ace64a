"""When the leader deletes an old generation's keys: once the members of the newest have read its record.

A generation's keys are deleted KEEP_GENERATIONS decisions later (ftcoord.decisions.forget: a dozen keys, plus
one rendezvous key per member, one request each: ~1,000 at 1,024 members). The leader used to delete them in
the round right after a decision, which is when every member reads the new record and meets at its rendezvous:
at 1,024 simulated participants (`chaos bench --scale`) ~1,000 deletes, ~46 ms of requests, queued among the
members' in the store. Now they wait until the new generation runs and its members all arrived at its
rendezvous (keys.all_arrived: each of them holds the record), or a heartbeat timeout after the decision (a
member that never arrives, or a loop that meets at no rendezvous of ours). A leader that decides faster than
that (a storm of faults) deletes them anyway once BACKLOG generations wait, so the store stays flat however
often it advances.

A leader that loses its leadership with generations still waiting leaves their keys behind (a few keys per
change of leader, as when the old rule's one pending generation was lost the same way).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from ftcoord import keys
from ftcoord.decisions import forget

KEEP_GENERATIONS = 4
"""A generation's keys are deleted this many decisions after it (the newest generations stay readable)."""
BACKLOG = 4
"""Generations waiting to be forgotten at most: past it they are deleted at the next round, quiet or not."""


class ForgetSchedule:
    """The leader's list of generations to forget, and when it may."""

    def __init__(self, patience_s: float) -> None:
        """`patience_s`: how long after a decision to wait for its members to arrive before forgetting anyway."""
        self._patience_s = patience_s
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
            forget(store, generation)
        self._waiting.clear()
        return True

    def _quiet(self, store: dist.Store, running: int | None) -> bool:
        if running is None:
            return False  # a generation being decided: its members read the store now
        return time.monotonic() - self._decided_at >= self._patience_s or bool(store.check([keys.all_arrived(running)]))
