"""What the store says about every slot of a job: registration and the facts of liveness."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ftcoord import keys
from ftcoord.launch_config import SPARE_SLOT_BASE  # noqa: F401 - the leader seats workers before spares
from ftcoord.store import get_or_none, read_int

# Keys created (as "0") at registration, so multi_get never blocks on them.
ZERO_KEYS = (keys.dead, keys.left, keys.replacing, keys.progress, keys.fence)


def register(store: dist.Store, slot: int) -> int:
    """Give this process a new incarnation of `slot` and list the slot in the job.

    Returns the incarnation: it tells a restarted process apart from its ghost.
    """
    incarnation = int(store.add(keys.incarnation(slot), 1))
    for key in ZERO_KEYS:
        store.compare_set(key(slot), "", "0")
    store.add(keys.heartbeat(slot), 1)
    if slot not in registered_slots(store):
        store.append(keys.SLOTS, f"{slot},")
    return incarnation


def superseded(store: dist.Store, slot: int, incarnation: int) -> str | None:
    """Why `incarnation` of `slot` must not take part any more (a newer one registered), or None."""
    newest = read_int(store, keys.incarnation(slot))
    if newest <= incarnation:
        return None
    return (f"incarnation {incarnation} of slot {slot} was superseded by incarnation {newest} (this process was "
            f"paused or cut off long enough to be replaced)")


def registered_slots(store: dist.Store) -> list[int]:
    """Every slot that ever registered in this job, ascending."""
    raw = get_or_none(store, keys.SLOTS)
    if not raw:
        return []
    return sorted({int(s) for s in raw.decode().split(",") if s})


@dataclass(frozen=True)
class SlotFacts:
    """One read of a slot's counters (a snapshot, taken with one multi_get)."""

    slot: int
    incarnation: int
    heartbeat: int
    progress: int
    waiting: bool
    """The training thread was inside a collective at the last beat."""
    dead: int
    left: int
    replacing: int
    replacing_beat: int = 0
    """Bumped by the launcher while the replacement is still starting (see keys.replacing)."""

    def is_gone(self, incarnation: int | None = None) -> bool:
        """Dead, left or superseded: `incarnation` (default: the newest) will not come back."""
        inc = self.incarnation if incarnation is None else incarnation
        return inc < self.incarnation or self.dead >= inc or self.left >= inc

    @property
    def being_replaced(self) -> bool:
        """A launcher is starting a new incarnation for this dead slot right now."""
        return self.replacing > self.incarnation


def read_facts(store: dist.Store, slots: list[int]) -> dict[int, SlotFacts]:
    """Read every slot's counters in one round trip."""
    if not slots:
        return {}
    per_slot = (keys.incarnation, keys.heartbeat, keys.progress, keys.dead, keys.left, keys.replacing)
    values = store.multi_get([key(slot) for slot in slots for key in per_slot])
    facts = {}
    for i, slot in enumerate(slots):
        raw = [v.decode() for v in values[i * 6 : i * 6 + 6]]
        progress, _, waiting = raw[2].partition(":")
        replacing, _, beat = raw[5].partition(":")
        inc, hb, dead, left = (int(v or 0) for v in (raw[0], raw[1], raw[3], raw[4]))
        facts[slot] = SlotFacts(slot, inc, hb, int(progress or 0), waiting == "w", dead, left, int(replacing or 0),
                                int(beat or 0))
    return facts
