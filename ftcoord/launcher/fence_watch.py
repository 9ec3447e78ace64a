"""The launcher's side of a fence: which of its children the leader declared dead (keys.fence).

The leader writes `<term>:<incarnation>` to a slot's fence key when it declares that process dead (hung, silent,
stuck: ftcoord.leader.judge); the process's launcher kills it at once, so its connections close and its peers stop
waiting on it. The keys are read every FENCE_POLL_S, not every tick: a fence follows a heartbeat timeout of silence
at the soonest, and a thousand launchers polling every 20 ms would load the store more than all their ranks.

A fence of a leader deposed since (it paused after its judgement, say) is not carried out: the leader of the newest
term judges again. It is said once; a newer leader's fence of the same process is carried out.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import torch.distributed as dist

from ftcoord.config import FENCE_POLL_S
from ftcoord.protocol import keys
from ftcoord.protocol.generations import newest_term
from ftcoord.protocol.slots import parse_fence


class Child(Protocol):
    slot: int
    incarnation: int
    fence_killed: bool
    fence_ignored: bytes


C = TypeVar("C", bound=Child)


class FenceWatch:
    """Reads the fences of a launcher's running children (at most every FENCE_POLL_S)."""

    def __init__(self, store: dist.Store, log: Any) -> None:
        self._store = store
        self._log = log
        self._due = 0.0

    def fenced(self, running: list[C], now: float) -> list[C]:
        """The children of `running` (each with a live process) that the newest leader fenced and that were
        not killed for it yet; [] between two reads."""
        if not running or now < self._due:
            return []
        self._due = now + FENCE_POLL_S
        values = self._store.multi_get([keys.fence(child.slot) for child in running])
        term: int | None = None
        fenced: list[C] = []
        for child, value in zip(running, values, strict=True):
            fenced_term, incarnation = parse_fence(value)
            if incarnation < child.incarnation or child.fence_killed or value == child.fence_ignored:
                continue
            term = term if term is not None else newest_term(self._store)
            if fenced_term < term:
                self._log.warning("fence_ignored", slot=child.slot, incarnation=child.incarnation,
                                  fence_term=fenced_term, leader_term=term)
                child.fence_ignored = value
                continue
            fenced.append(child)
        return fenced
