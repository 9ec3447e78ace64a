"""The immutable record of one generation, and the join announcement that leads to it."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any


def shallow_fields(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, as they are (json writes tuples as lists). Not dataclasses.asdict, which
    deep-copies every value: 3.8 ms for a record of 1,024 members (0.27 ms this way), on the leader's path from the
    last announcement to the decision; and every member encodes its announcement once per advance."""
    return {f.name: getattr(instance, f.name) for f in fields(instance)}


@dataclass(frozen=True)
class JoinRequest:
    """What a process announces when it asks to be in generation `generation`."""

    generation: int
    slot: int
    incarnation: int
    step: int = -1
    """The training step whose state this process holds (-1: none)."""

    def to_json(self) -> str:
        return json.dumps(shallow_fields(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> JoinRequest:
        return cls(**json.loads(text))


_PARSED: dict[bytes, GenerationRecord] = {}  # the newest records' texts, parsed
_PARSED_LOCK = threading.Lock()


@dataclass(frozen=True)
class GenerationRecord:
    """Membership epoch `generation`: who trains, in which rank order, from which state.

    Written once with `compare_set(gen/<g>/record, "", ...)`: the store is a single
    linearizable server, so two processes that both think they lead cannot both decide g.
    """

    generation: int
    members: tuple[int, ...]
    """Slots in rank order: rank r is members[r]."""
    incarnations: tuple[int, ...]
    """The incarnation of each member, parallel to members."""
    leader: int
    """Slot of the process that decided this record."""
    leader_term: int
    target_world_size: int
    heal_source: int | None = None
    """Rank of the member holding the most advanced state (max step, lowest rank on ties)."""
    start_step: int = -1
    """The step the generation starts from: the heal source's step."""
    spares: tuple[int, ...] = ()
    """Live joiners left out (hot spares): they wait for the next generation."""
    considered: tuple[tuple[int, int], ...] = ()
    """Every (slot, incarnation) whose join the decision saw, members and spares alike."""
    liveness_read_at: float = 0.0
    """The leader's time.monotonic() when it last read liveness before deciding."""
    failed: str | None = None
    """Set instead of members when too few joined by barrier_timeout: why."""
    steps: tuple[int, ...] = field(default=())
    """The step each member announced, parallel to members."""
    stop: bool = False
    """A stop (keys.STOP) was asked when this generation was decided: its members stop at its first boundary,
    together (ftcoord.monitor)."""
    left_out: tuple[tuple[int, int], ...] = ()
    """(slot, incarnation) of the live processes left out at a last call, or on the evidence of a closed connection,
    and not awaited again until they announce themselves (ftcoord.readiness.still_left_out): in the record, so a new
    leader does not wait for them once more."""

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, slot: int, incarnation: int) -> int | None:
        """This process's rank, or None when it is not a member (or a stale incarnation)."""
        try:
            rank = self.members.index(slot)  # a slot is a member once at most; C speed for thousands of members
        except ValueError:
            return None
        return rank if self.incarnations[rank] == incarnation else None

    def was_considered(self, slot: int, incarnation: int) -> bool:
        return (slot, incarnation) in self._considered_set

    @cached_property
    def _considered_set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self.considered)  # thousands of members: a set, not a scan per question

    def to_json(self) -> str:
        return json.dumps(shallow_fields(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> GenerationRecord:
        """Parsed once per process for each record text (records are immutable and shared by every member:
        a record of thousands of members is ~100 KB of JSON, read by every thread that needs it)."""
        key = text.encode() if isinstance(text, str) else bytes(text)
        record = _PARSED.get(key)
        if record is None:
            record = cls._parse(key)
            with _PARSED_LOCK:
                if len(_PARSED) >= 4:
                    _PARSED.pop(next(iter(_PARSED)))
                _PARSED[key] = record
        return record

    @classmethod
    def _parse(cls, text: bytes) -> GenerationRecord:
        data = json.loads(text)
        for key in ("members", "incarnations", "spares", "steps"):
            data[key] = tuple(data[key])
        data["considered"] = tuple(tuple(pair) for pair in data["considered"])
        data["left_out"] = tuple(tuple(pair) for pair in data.get("left_out", ()))
        return cls(**data)
