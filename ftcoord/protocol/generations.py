"""What the leaders decided, as the store holds it: the leader claim, generation records, `gen/current`.

The writes that matter for safety and their rules (see ftcoord.leader.duty's module docstring): a record
is written once, with compare_set from absent, and becomes the keys.FORGOTTEN tombstone instead of
absent when its generation is forgotten; `gen/current` only moves forward; a claim's term only grows.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

from ftcoord.protocol import keys
from ftcoord.protocol.record import GenerationRecord, JoinRequest
from ftcoord.store.client import get_if_present, get_or_none


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


def newest_term(store: dist.Store) -> int:
    """The term of the newest leader claim (0 before the first): a fence of an older term is not carried out."""
    return LeaderClaim.parse(get_or_none(store, keys.LEADER) or b"0").term


EPOCH_SPAN = 1_000_000
"""Generation numbers of store epoch e are above e * EPOCH_SPAN (ftcoord.store.link): a restarted store never
decides a number that its lost predecessor may have decided. A job that starts on a server's first boot numbers
its generations 1, 2, 3, ...; after one restart, 1000001, 1000002, ...; a job that starts on boot b, from
b * EPOCH_SPAN + 1."""


def next_generation(store: dist.Store, current: int) -> int:
    """The generation after `current`, in the epoch of the store instance `store` talks to."""
    return max(current, getattr(store, "epoch", 0) * EPOCH_SPAN) + 1


def started(store: dist.Store) -> bool:
    """A generation of this job was decided, as far as the store knows: `gen/current` (restored after a restart) or
    the first number of the store's epoch (a job that starts on boot b numbers from b * EPOCH_SPAN + 1)."""
    return int(get_or_none(store, keys.CURRENT) or 0) > 0 or bool(store.check([keys.record(next_generation(store, 0))]))


def current_generation(store: dist.Store) -> int:
    """The newest decided generation: the hint, walked forward to the last record."""
    generation = int(get_or_none(store, keys.CURRENT) or 0)
    while store.check([keys.record(generation + 1)]):
        generation += 1
    return generation


_FORGOTTEN = keys.FORGOTTEN.encode()
_ENDED = keys.ENDED.encode()


def read_record(store: dist.Store, generation: int) -> GenerationRecord | None:
    """The record of `generation`; None when it is not decided yet, or forgotten (keys.FORGOTTEN)."""
    return parse_record(get_or_none(store, keys.record(generation)))


def parse_record(raw: bytes | None) -> GenerationRecord | None:
    """A record key's value: the record; None for no value, a tombstone (keys.FORGOTTEN) or the job's end
    (keys.ENDED)."""
    return GenerationRecord.from_json(raw) if raw and raw != _FORGOTTEN and raw != _ENDED else None


def is_end(raw: bytes | None) -> bool:
    """A record key's value says the job ended before this number (keys.ENDED)."""
    return raw == _ENDED


def last_generation(store: dist.Store) -> int:
    """The newest generation that ran (for an operator): current_generation, less the numbers the job's end took."""
    generation = current_generation(store)
    while generation > 0 and is_end(get_or_none(store, keys.record(generation))):  # present: a read wakes nobody
        generation -= 1
    return generation


def mark_ended(store: dist.Store, generation: int) -> None:
    """The job ended: wake everyone waiting for the record of `generation` (keys.ENDED), unless it was decided."""
    store.compare_set(keys.record(generation), "", keys.ENDED)


def is_forgotten(store: dist.Store, generation: int) -> bool:
    """The generation was decided long ago and its keys are gone: nobody may wait for it. Its tombstone, or no
    record at all while `gen/current` is past it (the tombstone too was deleted, TOMBSTONE_SPAN later)."""
    raw = get_if_present(store, keys.record(generation))  # members may be waiting for it: wake none of them
    if raw is not None:
        return raw == _FORGOTTEN
    return int(get_or_none(store, keys.CURRENT) or 0) > generation


def advance_current(store: dist.Store, generation: int) -> None:
    """Move the `gen/current` hint forward to `generation`; never back (a paused writer may be late)."""
    while True:
        raw = get_or_none(store, keys.CURRENT)
        seen = raw.decode() if raw else ""
        if int(seen or 0) >= generation:
            return
        if store.compare_set(keys.CURRENT, seen, str(generation)).decode() == str(generation):
            return


def _joiners(store: dist.Store, generation: int) -> bytes:
    """A generation's joiners key, one announcement per line (b"" before the first), in one request."""
    return get_or_none(store, keys.joiners(generation)) or b""


def count_announcements(store: dist.Store, generation: int) -> int:
    """How many announcements a generation's joiners key holds (one line each), in one request."""
    return _joiners(store, generation).count(b"\n")


def read_announcements(store: dist.Store, generation: int) -> tuple[list[JoinRequest], int]:
    """The join announcements of a generation (a slot's newest incarnation wins), and how many were made."""
    return parse_announcements(_joiners(store, generation))


def parse_announcements(raw: bytes | None) -> tuple[list[JoinRequest], int]:
    """read_announcements of a joiners key's value already read (await_announcements' answer)."""
    newest: dict[int, JoinRequest] = {}
    lines = [line for line in (raw or b"").decode().splitlines() if line]
    for line in lines:
        join = JoinRequest.from_json(line)
        if join.slot not in newest or join.incarnation >= newest[join.slot].incarnation:
            newest[join.slot] = join
    return list(newest.values()), len(lines)


def await_announcements(store: dist.Store, generation: int, expecting: int, until: float, stop: threading.Event,
                        poll_s: float, stall_s: float | None = None) -> bytes | None:
    """Poll a generation's announcements (one request every `poll_s`, by the leader only) until `expecting` were made,
    the monotonic time `until`, `stop` is set, or, with `stall_s`, their count stood still that long. Once `expecting`
    were made, the joiners key's value that showed it (b"" for none: parse_announcements reads it), so the decision
    that follows does not read the list again (a round trip on the advance's critical path); otherwise None.

    The count is the joiners key's lines, read whole: a member announces itself in one request (an append); a
    counter beside the list would cost every member a second request on the advance's critical path, to spare the
    leader's few reads of the whole list. No key per joiner, so the store holds a fixed number of keys per
    generation whatever the job's size."""
    seen, changed = -1, time.monotonic()
    while not stop.wait(poll_s) and time.monotonic() < until:
        raw = _joiners(store, generation)
        count = raw.count(b"\n")
        if count >= expecting:
            return raw
        if count != seen:
            seen, changed = count, time.monotonic()
        elif stall_s is not None and time.monotonic() - changed >= stall_s:
            return None
    return None


TOMBSTONE_SPAN = 64
"""A forgotten generation's tombstone is deleted this many generations later. A leader paused at its record write
for longer than that (64 generation changes) could write the record of a long-gone generation: it sees `gen/current`
past it right after and makes it a tombstone again (ftcoord.leader.duty), and a joiner waiting for it finds
`gen/current` past it and catches up (ftcoord.wrapper.generation_client)."""


def forget(store: dist.Store, generation: int) -> None:
    """Delete an old generation's keys, so a long job does not grow the store forever; its record becomes a
    tombstone, so it can never be written again (see ftcoord.leader.duty's module docstring).

    A fixed number of keys per generation, plus two per member (gloo's rendezvous key, keys.gloo_rendezvous, and the
    member's mark of arrival, ftcoord.protocol.tally), and its mark of finish where a member finished there (the
    finish hint says so: rare, the job's end); no key per joiner. Deleting a key that is not there costs one round
    trip."""
    if generation < 1:
        return
    record = read_record(store, generation)
    finished = record is not None and store.check([keys.finished(generation)])
    store.set(keys.record(generation), keys.FORGOTTEN)
    if generation > TOMBSTONE_SPAN:  # tombstones too have an end, or the store would grow by one per generation
        store.delete_key(keys.record(generation - TOMBSTONE_SPAN))
    for key in (keys.joiners(generation), keys.probe(generation), keys.interrupt(generation), keys.released(generation),
                keys.addresses(generation), keys.evidence(generation), keys.finished(generation),
                keys.arrived(generation), keys.all_arrived(generation),
                *(keys.gloo_rendezvous(generation, rank) for rank in range(record.world_size if record else 0)),
                *(keys.arrived_rank(generation, rank) for rank in range(record.world_size if record else 0)),
                *(keys.finished_by(generation, slot) for slot in (record.members if record and finished else ()))):
        store.delete_key(key)
