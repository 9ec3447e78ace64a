"""How often a process that does not lead looks at the leader: its deputies often, everyone else rarely.

A hung leader (alive, silent) is noticed only by someone reading its heartbeat. The two ranks after the leader's in
the current generation (its deputies) read it every `Timing.watch_interval`, the others DEPUTY_FACTOR times less
often: a silent leader is replaced within heartbeat_timeout + watch_interval (heartbeat_timeout + DEPUTY_FACTOR
intervals if its deputies died with it). While a process joins a generation it looks more often, for a heartbeat
timeout at most: a deputy every tick; the others share the watch, one tick more between two looks per
LOOKERS_PER_TICK of them, and `Timing.evidence_silence` at most (the span the evidence needs anyway: a leader silent
that long is gone, ftcoord.leader.judge). A follower that asked a probe looks again when its grace ends.
"""

from __future__ import annotations

import math
import time

from ftcoord.config import Timing
from ftcoord.protocol.record import GenerationRecord

DEPUTY_FACTOR = 4
LOOKERS_PER_TICK = 64
"""Followers other than the deputies that share a tick between their looks while they join (module docstring)."""


class Cadence:
    """One follower's schedule for reading the leader's claim and heartbeat."""

    def __init__(self, slot: int, incarnation: int, timing: Timing) -> None:
        self._slot = slot
        self._incarnation = incarnation
        self._timing = timing
        self.deputy = True  # until a record says otherwise
        self._others = 0  # followers that are not deputies, in the last record noted
        self._urgent_since: float | None = None

    def note_record(self, record: GenerationRecord) -> None:
        """The generation this process joined, or waits to follow: a deputy is one of the two ranks after the
        leader's (everyone in a generation of three or fewer). A process outside it (a hot spare) is none: that
        generation's deputies watch its leader, and the spare, which may wait for hours, looks rarely (more often
        while it joins), within the store budget of tests/unit/test_store_load.py."""
        self._others = max(0, record.world_size - 3)
        rank = record.rank_of(self._slot, self._incarnation)
        if rank is None:
            self.deputy = False
            return
        leader = record.rank_of_member(record.leader) or 0  # a lookup, not a scan of thousands of members
        self.deputy = record.world_size <= 3 or (rank - leader) % record.world_size in (1, 2)

    def hurry(self, urgent: bool) -> bool:
        """This process starts (True) or stops (False) waiting in a join or a finish; True when it should look at
        the leader at once (a deputy: the others look at their next turn, not all at the same moment)."""
        self._urgent_since = time.monotonic() if urgent else None
        return urgent and self.deputy

    def interval(self) -> float:
        """Seconds until the next look."""
        hurried = self._urgent_since
        if hurried is not None and time.monotonic() - hurried < self._timing.heartbeat_timeout:
            return self._hurried()
        return self._timing.watch_interval * (1 if self.deputy else DEPUTY_FACTOR)

    def _hurried(self) -> float:
        """Seconds between two looks while this process joins: a tick for a deputy, more for the others of a large
        job (module docstring)."""
        tick = self._timing.tick
        if self.deputy:
            return tick
        ticks = max(1, math.ceil(self._others / LOOKERS_PER_TICK))
        return min(ticks * tick, self._timing.evidence_silence)  # 1.5 intervals: always past a tick (half one at most)
