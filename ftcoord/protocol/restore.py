"""Rebuilding a restarted, empty store from what the job's processes hold.

A process's `StoreLink.on_new_instance` callbacks (ftcoord.store.link) call these when it moves to the store's
next instance, before any other operation of it. The store is a cache of coordination; the members hold the truth.
Every process restores what it knows: its slot's registration (the incarnation never lowered), the record of the
generation it is in or waits after (records are immutable: every holder writes the same value; another value there
means this process's lineage forked, and it is superseded), that generation's interrupt, `gen/current` (only
forward), the leader's term, how the job ended. Every member of a restored record is registered too, so one that
never comes back is judged like any silent process. The other keys are safe to lose; numbers of the lost instance
beyond what some process holds are never restored (ftcoord.protocol.generations.next_generation decides above them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from ftcoord.errors import Superseded
from ftcoord.protocol import keys
from ftcoord.protocol.generations import LeaderClaim, advance_current
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import ZERO_KEYS, parse_fence, registered_slots
from ftcoord.store.client import raise_to


def slot(store: dist.Store, slot_id: int, incarnation: int) -> None:
    """Register `incarnation` of a slot again, without a new incarnation (its keys exist before it is listed:
    a multi_get of a listed slot's keys never blocks)."""
    raise_to(store, keys.incarnation(slot_id), incarnation)
    for key in ZERO_KEYS:
        store.compare_set(key(slot_id), "", "0")
    store.compare_set(keys.heartbeat(slot_id), "", "0")
    if slot_id not in registered_slots(store):
        store.append(keys.SLOTS, f"{slot_id},")


def record(store: dist.Store, held: GenerationRecord, interrupted: str | None) -> None:
    """Write back a generation's record (and its interrupt, when this process saw one); every member of it
    registered, so the leader judges those that never come back.

    Raises:
        Superseded: the store holds another record under the same number (a forked lineage).
    """
    text = held.to_json()
    found = store.compare_set(keys.record(held.generation), "", text).decode()
    if found != text and found != keys.FORGOTTEN:
        raise Superseded(f"the restarted store holds another record of generation {held.generation} than this "
                         f"process (it was cut off from the job); it exits without taking part again")
    advance_current(store, held.generation)
    if interrupted is not None:
        store.compare_set(keys.interrupt(held.generation), "", interrupted)
    if held.failed is None:
        for member, incarnation in zip(held.members, held.incarnations, strict=True):
            slot(store, member, incarnation)


def fence(store: dist.Store, slot_id: int, term: int, incarnation: int) -> None:
    """A leader's fence again ("term:incarnation", ftcoord.leader.judge), unless the slot's key already names that
    incarnation or a later one (a registration writes "0" first: that names none)."""
    _write_unless(store, keys.fence(slot_id), f"{term}:{incarnation}",
                  lambda found: parse_fence(found.encode())[1] >= incarnation)


def leader_term(store: dist.Store, claim: str | None, term: int) -> str:
    """The leader key again: the holder's claim, or the highest term this process saw, released ("term:released"),
    so a term never goes back: a lower term written back first (a process that fell behind) is replaced, and the
    holder's claim replaces its own term released. The key's value after it."""

    def keeps(found: str) -> bool:
        held = LeaderClaim.parse(found)
        return held.term > term or (held.term == term and (claim is None or held.slot is not None))

    return _write_unless(store, keys.LEADER, claim if claim is not None else f"{term}:released", keeps)


def _write_unless(store: dist.Store, key: str, wanted: str, keeps: Callable[[str], bool]) -> str:
    """Write `wanted` into `key` unless the value there `keeps` (compare_set from the value read, so a concurrent
    write is never overwritten unseen); the key's value after it. compare_set answers `expected` itself when the key
    is absent: the key went away meanwhile, and the next try is from absent."""
    expected = ""
    while True:
        found = store.compare_set(key, expected, wanted).decode()
        if found == wanted:
            return found
        if found == expected:
            expected = ""
        elif keeps(found):
            return found
        else:
            expected = found


def ended(store: dist.Store, done: bytes | None, stopped: bytes | None, fatal: bytes | None) -> None:
    """How the job ended, as far as this process saw."""
    for key, value in ((keys.DONE, done), (keys.STOPPED, stopped), (keys.FATAL, fatal)):
        if value is not None:
            store.compare_set(key, "", value)
