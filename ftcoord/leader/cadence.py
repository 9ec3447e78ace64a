"""How often a process that does not lead looks at the leader: its deputies often, everyone else rarely.

A hung leader (alive, silent) is noticed only by someone reading its heartbeat. Every follower reading it
every tick cost the store ~8 requests per process per second; now the two ranks after the leader's in the
current generation (its deputies) read it every `Timing.watch_interval`, the others DEPUTY_FACTOR times less
often, so a silent leader is still replaced within heartbeat_timeout + watch_interval (and within
heartbeat_timeout + DEPUTY_FACTOR intervals if its deputies died with it). While a process joins a generation
(the leader may have died with the last one, with evidence to see) it looks more often, for a heartbeat timeout at
most: a hot spare, or a job that forms slowly, may wait long. A deputy looks every tick; the others share the watch:
every tick in a job of up to LOOKERS_PER_TICK of them, a tick more between two looks per LOOKERS_PER_TICK more, and
`Timing.evidence_silence` at most (3 ticks at the defaults: past 128 of them). The first of them to look after the
leader fell silent still looks within a tick / LOOKERS_PER_TICK on average, and the store serves their looks at
~LOOKERS_PER_TICK a tick until the cap, a third of what every tick cost past it. (Each of 4,096 looked every tick
once its turn came: up to ~16,000 reads a second while they joined, two requests each; `chaos bench --scale` at
4,096 counted 3.1 requests per participant per advance from them where advances took 2.6-6.9 s, 0.1-0.3 at 1,024.)
The cap is the span the evidence needs anyway between one follower's two looks (a leader silent for evidence_silence
is gone, ftcoord.leader.judge); a follower that asked the members to beat (a probe) looks again when its grace ends
(Judge.next_look), as every tick did.
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
        while it joins): within issue 17's store budget (tests/unit/test_store_load.py)."""
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
