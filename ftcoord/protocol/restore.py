"""Rebuilding a restarted, empty store from what the job's processes hold (ftcoord.store.link calls these
on every process that moves to the store's next instance, before any other operation of that process).

The store is a cache of coordination; the members hold the truth. What each key becomes:
- **restored** by every process that knows it: each slot's registration (its incarnation, never lowered;
  the counters ftcoord's reads expect), the record of the generation a process is in or waits after
  (records are immutable, so every holder writes the same value with compare_set from absent; a
  different value already there means this process's lineage forked: it is superseded), the
  generation's interrupt when the process saw one, `gen/current` (only forward), the leader's term (the
  holder writes its claim; every other process "term:released": a term never goes back), `done`,
  `stopped` and `fatal` when a process saw them, a member's `finished` count, the job's index entry and
  info. Every member of a restored record is registered too, by whoever restores it: a member that never
  comes back (killed while the store was away) then has a heartbeat that never moves, and is judged
  like any silent process.
- **made safe to lose**: fences (the leader forgets what it fenced and fences again; a fence's term
  still fences a deposed leader, since terms only grow), probes (counted from 0 again), the join
  announcements of an open generation (a joiner that sees a new instance announces itself again for
  the next number of the new epoch), evidence, rendezvous keys (a group that formed needs the store no
  more), a slot's status and launcher report (published again), incidents already reported.
- **never restored**: generation numbers of the lost instance beyond what some process holds; the new
  epoch decides above them (ftcoord.protocol.generations.next_generation).
"""

from __future__ import annotations

import torch.distributed as dist

from ftcoord.errors import Superseded
from ftcoord.protocol import keys
from ftcoord.protocol.generations import advance_current
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import ZERO_KEYS, registered_slots
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


def leader_term(store: dist.Store, claim: str | None, term: int) -> None:
    """The leader key again: the holder's claim, or the highest term this process saw, released."""
    store.compare_set(keys.LEADER, "", claim if claim is not None else f"{term}:released")


def ended(store: dist.Store, done: bytes | None, stopped: bytes | None, fatal: bytes | None) -> None:
    """How the job ended, as far as this process saw."""
    for key, value in ((keys.DONE, done), (keys.STOPPED, stopped), (keys.FATAL, fatal)):
        if value is not None:
            store.compare_set(key, "", value)
