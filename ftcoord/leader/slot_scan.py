"""The leader's read of every slot, once a round: its claim, the registered slots and every slot's counters.

Only the leader reads every slot (ftcoord.leader.duty); a follower reads the leader alone (ftcoord.leader.election).
The read goes READ_SLOTS_PER_REQUEST slots to a request, each cut again by its bytes
(ftcoord.store.link.bounded_multi_get), and while a generation runs the leader looks at its interrupt between the
requests, on the same connection: once it is set the read stops, and the round stands on the last whole read, as if
the interrupt had come just before it (liveness is judged on observations only, so facts judged once are judged alike
again). A read that is cut observes nothing. The keys' names, and each slot's facts while its values stay, are kept
from read to read (ftcoord.protocol.slots.FactsCache).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from ftcoord.protocol import keys
from ftcoord.protocol.slots import FactsCache, SlotFacts, parse_slots, read_facts_and, read_facts_unless

READ_SLOTS_PER_REQUEST = 256
"""Slots in one request of the read (1,536 keys)."""


class SlotScan:
    """One leader's reads of every slot, and the last whole one."""

    def __init__(self, store: dist.Store) -> None:
        self._store = store
        self.slots: list[int] = []
        """The registered slots, as last read."""
        self.read_s = 0.0
        """How long the last whole read took (what judging afresh costs: ftcoord.leader.duty._follow_rejoin)."""
        self._whole: tuple[int, float, dict[int, SlotFacts]] | None = None  # its store instance, when, the facts
        self._cache = FactsCache()  # every slot's keys, and facts not parsed again while their values stay

    def forget(self, slots: bool = False) -> None:
        """What was read is stale (the leader paused, or took a new term); `slots`: the registered slots too (the
        store restarted: they register again)."""
        self._whole = None
        if slots:
            self.slots = []
            self._cache = FactsCache()

    def read(self, instance: int, running: int | None) -> tuple[float, dict[int, SlotFacts], bytes, bool]:
        """Read the leader's claim, the registered slots and every slot's counters from store instance `instance`
        (pinned: ftcoord.store.link.pinned_multi_get). `running`: the generation the leader's last wait found
        running (None: none it has not seen interrupted), whose interrupt stops the read (the module docstring).

        Returns when the read was asked (a dead mark older than that is seen; a store that hung during the read kept
        everyone from beating, and its silence is not theirs), the facts, the `leader` key's value, and whether they
        are this read's (False: the last whole read's, and when it was asked)."""
        read_at = time.monotonic()
        standing = self._whole
        listen = self._listen(instance, running, standing)
        values, facts, whole = read_facts_unless(self._store, self.slots, [keys.LEADER, keys.SLOTS], instance, listen,
                                                 READ_SLOTS_PER_REQUEST, self._cache)
        if not whole:
            assert standing is not None  # _listen asks nothing without it
            _, read_at, facts = standing
            return read_at, facts, values[0], False
        self.read_s = time.monotonic() - read_at
        slots = parse_slots(values[1])
        if slots != self.slots:
            new = [s for s in slots if s not in facts]
            facts.update(read_facts_and(self._store, new, [], pinned=instance, cache=self._cache)[1])
            self.slots = slots
            self._cache.keep(slots)
        self._whole = (instance, read_at, facts)
        return read_at, facts, values[0], True

    def _listen(self, instance: int, running: int | None,
                standing: tuple[int, float, dict[int, SlotFacts]] | None) -> Callable[[], bool] | None:
        """What the read asks between its requests: whether `running` was interrupted since. None (read it all) when
        no generation runs, or no whole read of this store instance stands to fall back on."""
        if running is None or standing is None or standing[0] != instance:
            return None
        interrupt = keys.interrupt(running)
        return lambda: bool(self._store.check([interrupt]))
