"""What the leaders decided, as the store holds it: the leader claim, generation records, `gen/current`.

The writes that matter for safety and their rules (see ftcoord.leader's module docstring): a record
is written once, with compare_set from absent, and becomes the keys.FORGOTTEN tombstone instead of
absent when its generation is forgotten; `gen/current` only moves forward; a claim's term only grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ftcoord import keys
from ftcoord.record import GenerationRecord, JoinRequest
from ftcoord.store import get_or_none, read_int


@dataclass(frozen=True)
class LeaderClaim:
    """The value of the `leader` key: "term:slot:incarnation" or "term:released"."""

    term: int
    slot: int | None
    incarnation: int | None

    @classmethod
    def parse(cls, raw: bytes | str) -> LeaderClaim:
        text = raw.decode() if isinstance(raw, bytes) else raw
        parts = text.split(":")
        if len(parts) == 3:
            return cls(int(parts[0]), int(parts[1]), int(parts[2]))
        return cls(int(parts[0]) if parts[0] else 0, None, None)

    def __str__(self) -> str:
        if self.slot is None:
            return f"{self.term}:released"
        return f"{self.term}:{self.slot}:{self.incarnation}"


EPOCH_SPAN = 1_000_000
"""Generation numbers of store epoch e are above e * EPOCH_SPAN (ftcoord.store_link): a restarted store never
decides a number that its lost predecessor may have decided. A job that starts on a store that never
restarted numbers its generations 1, 2, 3, ...; after one restart, 1000001, 1000002, ..."""


def next_generation(store: dist.Store, current: int) -> int:
    """The generation after `current`, in the epoch of the store instance `store` talks to."""
    return max(current, getattr(store, "epoch", 0) * EPOCH_SPAN) + 1


def current_generation(store: dist.Store) -> int:
    """The newest decided generation: the hint, walked forward to the last record."""
    generation = int(get_or_none(store, keys.CURRENT) or 0)
    while store.check([keys.record(generation + 1)]):
        generation += 1
    return generation


def read_record(store: dist.Store, generation: int) -> GenerationRecord | None:
    """The record of `generation`; None when it is not decided yet, or forgotten (keys.FORGOTTEN)."""
    raw = get_or_none(store, keys.record(generation))
    return GenerationRecord.from_json(raw) if raw and raw.decode() != keys.FORGOTTEN else None


def is_forgotten(store: dist.Store, generation: int) -> bool:
    """The generation was decided long ago and its keys are gone: nobody may wait for it."""
    return get_or_none(store, keys.record(generation)) == keys.FORGOTTEN.encode()


def advance_current(store: dist.Store, generation: int) -> None:
    """Move the `gen/current` hint forward to `generation`; never back (a paused writer may be late)."""
    while True:
        raw = get_or_none(store, keys.CURRENT)
        seen = raw.decode() if raw else ""
        if int(seen or 0) >= generation:
            return
        if store.compare_set(keys.CURRENT, seen, str(generation)).decode() == str(generation):
            return


def read_joins(store: dist.Store, generation: int) -> list[JoinRequest]:
    """The join announcements of a generation; a slot's newest incarnation wins."""
    raw = get_or_none(store, keys.joiners(generation))
    newest: dict[int, JoinRequest] = {}
    for line in (raw or b"").decode().splitlines():
        if line:
            join = JoinRequest.from_json(line)
            if join.slot not in newest or join.incarnation >= newest[join.slot].incarnation:
                newest[join.slot] = join
    return list(newest.values())


def forget(store: dist.Store, generation: int) -> None:
    """Delete an old generation's keys, so a long job does not grow the store forever; its record becomes a
    tombstone, so it can never be written again (see ftcoord.leader's module docstring)."""
    if generation < 1:
        return
    count = read_int(store, keys.join_count(generation))
    store.set(keys.record(generation), keys.FORGOTTEN)
    for key in (keys.joiners(generation), keys.join_count(generation),
                keys.interrupt(generation), keys.addresses(generation), keys.evidence(generation),
                keys.finished(generation), keys.arrived(generation), keys.all_arrived(generation),
                *(keys.join_signal(generation, n) for n in range(1, count + 1))):
        store.delete_key(key)
