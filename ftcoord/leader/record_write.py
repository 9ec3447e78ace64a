"""A leader's write of a generation's record: the one decision for that generation, safe under pauses.

The record is written once, with compare_set from absent, and only while the writer still holds its term (its claim
is confirmed just before): a leader deposed meanwhile writes nothing, and one that paused before its write and wakes
after the generation was decided fails it. The write is pinned to the store instance the leader's observations came
from (ftcoord.store.link): a leader that paused through a store restart writes nothing into the new instance. A
write that lands after the generation was decided, forgotten and its tombstone deleted (a pause of more than
ftcoord.protocol.generations.TOMBSTONE_SPAN generations at this write) is made a tombstone again: nobody waits for
that generation.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch.distributed as dist

from ftcoord import pausepoints
from ftcoord.leader.election import Election
from ftcoord.protocol import keys
from ftcoord.protocol.generations import advance_current
from ftcoord.protocol.record import GenerationRecord
from ftcoord.store.client import get_or_none
from ftcoord.store.link import StoreRestarted, pinned_compare_set


class Written(Enum):
    """What became of a record's write."""

    DECIDED = "decided"  # this record is the generation's decision
    NOT_OURS = "not_ours"  # deposed before the write, or another leader's record stands, or too late: nothing to do
    DROPPED = "dropped"  # decided on what a lost store instance showed: judge again on the new one


def write_record(store: dist.Store, election: Election, instance: int, record: GenerationRecord, current: int,
                 log: Any, partial: bool = False) -> Written:
    """Write `record` as its generation's decision (see the module docstring); `current`: the generation it follows,
    whose members stop waiting for a question about it once the next one is decided
    (ftcoord.liveness.interrupt_watch)."""
    text = record.to_json()
    if not election.confirm():
        return Written.NOT_OURS  # deposed while deciding: the new leader decides
    pausepoints.reached(pausepoints.LEADER_BEFORE_RECORD)
    try:
        won = pinned_compare_set(store, instance, keys.record(record.generation), "", text).decode() == text
    except StoreRestarted as exc:
        log.warning("decision_dropped", generation=record.generation, reason=str(exc))
        return Written.DROPPED
    if not won:
        return Written.NOT_OURS  # another leader decided first (or the generation is long forgotten); its record stands
    if int(get_or_none(store, keys.CURRENT) or 0) > record.generation:
        store.set(keys.record(record.generation), keys.FORGOTTEN)
        log.warning("decision_too_late", generation=record.generation)
        return Written.NOT_OURS
    advance_current(store, record.generation)
    if record.failed:
        log.error("generation_failed", generation=record.generation, reason=record.failed)
    else:
        log.info("generation_decided", generation=record.generation, members=list(record.members),
                 world_size=record.world_size, spares=list(record.spares), partial=partial,
                 heal_source=record.heal_source, start_step=record.start_step, stop=record.stop,
                 cause=record.cause, culprits=list(record.culprits))
    if current:  # its members may stop waiting for a question about it
        store.compare_set(keys.probe(current), "", keys.PROBE_RELEASED)  # a question asked stays one
    return Written.DECIDED
