"""The immutable record of one generation, and the join announcement that leads to it."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any


def shallow_fields(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, as they are (json writes tuples as lists). Not dataclasses.asdict, which
    deep-copies every value: this runs on the leader's path from the last announcement to the decision."""
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
        """json.dumps of its fields, compact, spelled out without json.dumps's dict walk: every member encodes one
        per advance."""
        return (f'{{"generation":{int(self.generation)},"slot":{int(self.slot)},'
                f'"incarnation":{int(self.incarnation)},"step":{int(self.step)}}}')

    @classmethod
    def from_json(cls, text: str) -> JoinRequest:
        return cls(**json.loads(text))


def compact_ints(values: tuple[int, ...]) -> list[int] | list[list[int]]:
    """A sequence of integers for JSON: its arithmetic runs, [[first, count, stride], ...], when they take fewer numbers
    than the plain list (0..1,023 is [[0, 1024, 1]]; a thousand 1s, [[1, 1000, 0]]), else the plain list."""
    runs: list[list[int]] = []
    i, n = 0, len(values)
    while i < n:
        stride, j = (values[i + 1] - values[i] if i + 1 < n else 0), i
        while j + 1 < n and values[j + 1] - values[j] == stride:
            j += 1
        runs.append([values[i], j - i + 1, stride])
        i = j + 1
    return runs if 3 * len(runs) < n else list(values)


def expand_ints(encoded: list[Any]) -> tuple[int, ...]:
    """compact_ints' sequence back: a plain list as it is, runs expanded."""
    if not encoded or not isinstance(encoded[0], list):
        return tuple(encoded)
    values: list[int] = []
    for first, count, stride in encoded:
        values.extend([first] * count if stride == 0 else range(first, first + count * stride, stride))
    return tuple(values)


_SEQUENCES = ("members", "incarnations", "spares", "steps")
"""A record's integer sequences, written compacted (compact_ints)."""

_PARSED: dict[bytes, GenerationRecord] = {}  # the newest records' texts, parsed
_PARSED_LOCK = threading.Lock()


@dataclass(frozen=True)
class GenerationRecord:
    """Membership epoch `generation`: who trains, in which rank order, from which state.

    Written once with `compare_set(gen/<g>/record, "", ...)`: the store is a single
    linearizable server, so two processes that both think they lead cannot both decide g.
    """

    generation: int
    """The generation's number (epoch e of the store numbers its generations above e * EPOCH_SPAN:
    ftcoord.protocol.generations)."""
    members: tuple[int, ...]
    """Slots in rank order: rank r is members[r]."""
    incarnations: tuple[int, ...]
    """The incarnation of each member, parallel to members."""
    leader: int
    """Slot of the process that decided this record."""
    leader_term: int
    """The term of the leader claim under which the record was decided (ftcoord.protocol.generations.LeaderClaim)."""
    target_world_size: int
    """The job's target world size when the record was decided (QuorumPolicy.target_world_size)."""
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
    together (ftcoord.liveness.interrupt_watch)."""
    left_out: tuple[tuple[int, int], ...] = ()
    """(slot, incarnation) of the live processes left out at a last call, or on the evidence of a closed connection,
    and not awaited again until they announce themselves (ftcoord.leader.readiness.still_left_out): in the record,
    so a new leader does not wait for them once more."""

    cause: str | None = None
    """Why the previous generation ended, root cause first ("slot 1 died (SIGKILL), seen by slot 0"); None for a
    first generation (ftcoord.leader.attribution)."""
    culprits: tuple[int, ...] = ()
    """The slots whose own process ended the previous generation: it died, hung, raised, was fenced, left or did not
    come back. Empty when nothing of a member's did (a joiner grew the job, a stop was asked)."""

    @property
    def world_size(self) -> int:
        """The number of members."""
        return len(self.members)

    def rank_of(self, slot: int, incarnation: int) -> int | None:
        """A process's rank, or None when it is not a member (or a stale incarnation of one).

        Args:
            slot: the process's slot.
            incarnation: the process's incarnation of that slot.
        """
        rank = self._ranks.get(slot)
        return rank if rank is not None and self.incarnations[rank] == incarnation else None

    def rank_of_member(self, slot: int) -> int | None:
        """The rank of a member slot, whichever its incarnation; None when it is not a member.

        Args:
            slot: the slot to look up.
        """
        return self._ranks.get(slot)

    @cached_property
    def _ranks(self) -> dict[int, int]:
        """Each member slot's rank (a slot is a member once at most). A record is parsed once per process and shared
        (from_json), so this is built once for all its participants, not a scan of thousands of members per
        question."""
        return {slot: rank for rank, slot in enumerate(self.members)}

    def was_considered(self, slot: int, incarnation: int) -> bool:
        """Whether the decision saw this process's join (as a member or a spare).

        Args:
            slot: the process's slot.
            incarnation: the process's incarnation of that slot.
        """
        return (slot, incarnation) in self._considered_set

    @cached_property
    def _considered_set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self.considered)  # thousands of members: a set, not a scan per question

    def to_json(self) -> str:
        """The record's text in the store: its integer sequences compacted (compact_ints), its other fields as they
        are. Every member reads the record at each advance, so its size is paid once per member (the store sends
        it to each); members in slot order, their incarnations, their steps and the processes
        considered are each a run or a few."""
        data = shallow_fields(self)
        for key in _SEQUENCES:
            data[key] = compact_ints(data[key])
        data["considered"] = {"slots": compact_ints(tuple(slot for slot, _ in self.considered)),
                              "incarnations": compact_ints(tuple(incarnation for _, incarnation in self.considered))}
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> GenerationRecord:
        """Parsed once per process for each record text (records are immutable and shared by every member,
        read by every thread that needs it; members that do not follow their slots' order keep it long)."""
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
        for key in _SEQUENCES:
            data[key] = expand_ints(data[key])
        considered = data["considered"]
        if isinstance(considered, dict):
            data["considered"] = tuple(zip(expand_ints(considered["slots"]), expand_ints(considered["incarnations"]),
                                           strict=True))
        else:  # a list of [slot, incarnation] pairs: the plain form
            data["considered"] = tuple(tuple(pair) for pair in considered)
        data["left_out"] = tuple(tuple(pair) for pair in data.get("left_out", ()))
        data["culprits"] = tuple(data.get("culprits", ()))
        return cls(**data)
