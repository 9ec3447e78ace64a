"""What the store says about every slot of a job: registration and the facts of liveness."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from ftcoord.protocol import keys, tally
from ftcoord.protocol.generations import newest_term
from ftcoord.store.client import get_or_none, read_int
from ftcoord.store.link import bounded_multi_get

# Keys created (as "0") at registration, so multi_get never blocks on them.
ZERO_KEYS = (keys.dead, keys.left, keys.replacing, keys.progress, keys.fence)


def register(store: dist.Store, slot: int) -> int:
    """Give this process a new incarnation of `slot` and list the slot in the job.

    Returns the incarnation: it tells a restarted process apart from its ghost. One per start, however often a
    request is retried (one process registers a slot at a time: its launcher starts the next after this one ended).
    """
    incarnation = tally.increment(store, keys.incarnation(slot))
    # A slot's progress describes its newest incarnation: the one before may have stood still for long (it was
    # stuck, then fenced), and until this process's heartbeat publishes, that stillness would read as its own.
    store.set(keys.progress(slot), "0")
    for key in ZERO_KEYS:
        store.compare_set(key(slot), "", "0")
    store.add(keys.heartbeat(slot), 1)
    if slot not in registered_slots(store):
        store.append(keys.SLOTS, f"{slot},")
    return incarnation


def superseded(store: dist.Store, slot: int, incarnation: int) -> str | None:
    """Why `incarnation` of `slot` must not take part any more (a newer one registered), or None."""
    return superseded_by(slot, incarnation, read_int(store, keys.incarnation(slot)))


def fenced(store: dist.Store, slot: int, incarnation: int) -> str | None:
    """Why `incarnation` of `slot` must not take part any more (the newest leader fenced it: declared it dead, and its
    launcher kills it once it reads the fence), or None. A fence of a leader deposed since names nobody: launchers do
    not carry it out either (ftcoord.launcher.fence_watch)."""
    term, named = parse_fence(get_or_none(store, keys.fence(slot)) or b"0")
    if named < incarnation:
        return None
    if term < newest_term(store):
        return None
    return (f"incarnation {incarnation} of slot {slot} was fenced by the leader of term {term} (declared dead: it "
            f"was silent, hung or stuck, paused or cut off)")


def parse_fence(value: bytes) -> tuple[int, int]:
    """A fence key's value: the term of the leader that wrote it and the incarnation it names ((0, 0): none yet)."""
    term, _, incarnation = value.decode().rpartition(":")
    return int(term or 0), int(incarnation or 0)


def superseded_by(slot: int, incarnation: int, newest: int) -> str | None:
    """Why `incarnation` of `slot` must not take part any more, given the newest one registered, or None."""
    if newest <= incarnation:
        return None
    return (f"incarnation {incarnation} of slot {slot} was superseded by incarnation {newest} (this process was "
            f"paused or cut off long enough to be replaced)")


def registered_slots(store: dist.Store) -> list[int]:
    """Every slot that ever registered in this job, ascending."""
    return parse_slots(get_or_none(store, keys.SLOTS))


def parse_slots(raw: bytes | None) -> list[int]:
    """The `slots` key's value, as the registered slots, ascending."""
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
    step: int = -1
    """The last step its training thread committed in its generation (published with its progress; -1: none yet,
    or not told)."""
    still_s: float = 0.0
    """How long its training thread had stood still on its own (not in ftcoord's join, not waiting on its peers) when
    its progress was last published, by its own heartbeat's account, in generation `still_generation` (a lower bound;
    0: moving, waiting, or not told: ftcoord.liveness.heartbeat)."""
    still_generation: int = -1

    def is_gone(self, incarnation: int | None = None) -> bool:
        """Dead, left or superseded: `incarnation` (default: the newest) will not come back."""
        inc = self.incarnation if incarnation is None else incarnation
        return inc < self.incarnation or self.dead >= inc or self.left >= inc

    @property
    def being_replaced(self) -> bool:
        """A launcher is starting a new incarnation for this dead slot right now."""
        return self.replacing > self.incarnation


FACT_KEYS = (keys.incarnation, keys.heartbeat, keys.progress, keys.dead, keys.left, keys.replacing)
"""A slot's keys in one read of its facts; every one exists from registration on (multi_get never blocks)."""


def read_facts(store: dist.Store, slots: list[int]) -> dict[int, SlotFacts]:
    """Read every slot's counters in one round trip."""
    return read_facts_and(store, slots, [])[1]


class FactsCache:
    """Each slot's fact keys, and its facts as last parsed with the raw values they came from (facts are a function
    of the slot and its values, whatever store instance they came from). A leader reads every slot every tick; a
    heartbeat comes once a heartbeat interval and progress once a step, so between them a slot reads as it was and
    its facts are the same (immutable) object again, with no names built and nothing parsed."""

    def __init__(self) -> None:
        self._names: dict[int, tuple[str, ...]] = {}
        self._parsed: dict[int, tuple[tuple[bytes, ...], SlotFacts]] = {}

    def names(self, slots: list[int]) -> list[str]:
        """Every slot's FACT_KEYS, slot after slot."""
        found: list[str] = []
        for slot in slots:
            names = self._names.get(slot)
            if names is None:
                names = self._names[slot] = tuple(key(slot) for key in FACT_KEYS)
            found.extend(names)
        return found

    def keep(self, slots: list[int]) -> None:
        """Forget every slot but `slots` (the registered ones: a slot gone is not read again)."""
        kept = set(slots)
        for known in (self._names, self._parsed):
            for slot in [s for s in known if s not in kept]:
                del known[slot]

    def facts(self, slot: int, raw: tuple[bytes, ...]) -> SlotFacts:
        """The facts `raw` (a slot's FACT_KEYS' values) say: parsed again only when they changed."""
        known = self._parsed.get(slot)
        if known is not None and known[0] == raw:
            return known[1]
        facts = _parse_facts(slot, raw)
        self._parsed[slot] = (raw, facts)
        return facts


def _parse_facts(slot: int, values: tuple[bytes, ...]) -> SlotFacts:
    raw = [v.decode() for v in values]
    progress, _, waiting = raw[2].partition(":")
    progress, _, still = progress.partition("@")
    still, _, still_generation = still.partition(",")
    pings, _, step = progress.partition("/")
    replacing, _, beat = raw[5].partition(":")
    inc, hb, dead, left = (int(v or 0) for v in (raw[0], raw[1], raw[3], raw[4]))
    return SlotFacts(slot, inc, hb, int(pings or 0), waiting == "w", dead, left, int(replacing or 0), int(beat or 0),
                     int(step or -1), float(still or 0), int(still_generation or -1))


def read_facts_and(store: dist.Store, slots: list[int], also: list[str], pinned: int | None = None,
                   cache: FactsCache | None = None) -> tuple[list[bytes], dict[int, SlotFacts]]:
    """The values of the keys `also` (each must exist) and every slot's facts, each slot's in one request (its
    snapshot), as few requests as MULTI_GET_BYTES allows (ftcoord.store.link.bounded_multi_get); `pinned`: the store
    instance the slots were read from (StoreRestarted rather than a wait for slots a restarted store lacks); `cache`:
    the reader's own, kept from read to read (a fresh one: every slot parsed)."""
    if not slots and not also:
        return [], {}
    cache = FactsCache() if cache is None else cache
    values = bounded_multi_get(store, also + cache.names(slots), pinned, len(FACT_KEYS), len(also))
    extra, values = values[: len(also)], values[len(also):]
    width = len(FACT_KEYS)
    return extra, {slot: cache.facts(slot, tuple(values[i * width: i * width + width])) for i, slot in enumerate(slots)}


def read_facts_unless(store: dist.Store, slots: list[int], also: list[str], pinned: int | None,
                      stop: Callable[[], bool] | None, per_request: int,
                      cache: FactsCache | None = None) -> tuple[list[bytes], dict[int, SlotFacts], bool]:
    """read_facts_and in requests of `per_request` slots (the first with `also`), asking `stop()` before each request
    after the first: the values of `also`, the facts read, and whether every slot's were (False: stop() said so, and
    the rest were not read). One request as before when `stop` is None or the slots fit in one."""
    if stop is None or len(slots) <= per_request:
        return (*read_facts_and(store, slots, also, pinned, cache), True)
    extra, facts = read_facts_and(store, slots[:per_request], also, pinned, cache)
    for start in range(per_request, len(slots), per_request):
        if stop():
            return extra, facts, False
        facts.update(read_facts_and(store, slots[start:start + per_request], [], pinned, cache)[1])
    return extra, facts, True
