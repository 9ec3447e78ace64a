"""Counts of a generation's members that stay exact when a store request is retried.

TCPStore's `add` is not safe to retry: a call cut while the server hung still runs when the server resumes, beside
its retry, and the count is one too high (a rendezvous declared complete with a member missing, a job declared done
early). So each member marks its own key (compare_set from absent: once however often it is sent), and the counter
beside them is only a hint: a member whose `add` reaches the number of members looks at every member's key before it
acts. The member whose `add` the server runs last among those that returned always sees the full number, and by then
every member's mark is in; so whoever sees all marks, and nobody earlier, acts. A counter that only one process
writes at a time (a slot's incarnation) counts with compare_set instead (`increment`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none
from ftcoord.store.link import bounded_check, bounded_multi_get


def mark(store: dist.Store, counter: str, mine: str, value: str, members: Sequence[str]) -> bool:
    """Mark this member (`mine`, one of `members`, set to `value` once) and count it on the `counter` hint; True when
    every member's key is in (looked at only once the hint says so).

    Args:
        store: the job's store.
        counter: the hint's key (added to; may run ahead of the marks).
        mine: this member's key.
        value: what this member's key says (the first value marked stays).
        members: every member's key, this one's included.
    """
    store.compare_set(mine, "", value)
    if int(store.add(counter, 1)) < len(members):
        return False
    return bounded_check(store, list(members))  # thousands of members' keys: not in one request


def increment(store: dist.Store, key: str) -> int:
    """Add one to a counter that only this process adds to right now (others may only raise it to what they hold:
    ftcoord.protocol.restore), exactly once however often a request is retried (compare_set from the value read to
    the next: a retried one finds it done); the new value.

    Args:
        store: the job's store.
        key: the counter (absent reads 0).
    """
    while True:
        raw = get_or_none(store, key)
        seen = raw.decode() if raw else ""
        wanted = str(int(seen or 0) + 1)
        if store.compare_set(key, seen, wanted).decode() == wanted:
            return int(wanted)


def arrive(store: dist.Store, generation: int, rank: int, world_size: int) -> bool:
    """Mark the member of `rank` arrived at the generation's rendezvous; True when every member has (this member
    then sets keys.all_arrived, which every member waits for).

    Args:
        store: the job's store.
        generation: the generation whose rendezvous this is.
        rank: this member's rank in it.
        world_size: how many members it has.
    """
    members = [keys.arrived_rank(generation, r) for r in range(world_size)]
    if not mark(store, keys.arrived(generation), members[rank], "1", members):
        return False
    store.set(keys.all_arrived(generation), "1")
    return True


def finish(store: dist.Store, generation: int, slot: int, members: Sequence[int], stopping: bool) -> str | None:
    """Mark `slot`'s function returned in the generation; once every member's did, how the job ended: "stop" when
    any member returned to stop (a preemption: a relaunch resumes it), else "done"; None before.

    Args:
        store: the job's store.
        generation: the generation the function returned in.
        slot: this member's slot.
        members: every member's slot.
        stopping: this member returned because a stop was requested.
    """
    names = [keys.finished_by(generation, member) for member in members]
    if not mark(store, keys.finished(generation), keys.finished_by(generation, slot), "stop" if stopping else "done",
                names):
        return None
    return "stop" if b"stop" in bounded_multi_get(store, names) else "done"
