"""Why a generation ended: its root cause, named from evidence when the leader decides the next one.

The interrupt that ended a generation is often a witness's: a survivor whose collective failed when a peer died
(`exception:slot=0:RuntimeError:closed=1`). So the cause is looked for among the ended generation's members:

- a member whose process the new decision did not see join (its `considered`): it died, hung, was fenced, left, or
  did not come back in time; its launcher's report says how its process ended (ftcoord.protocol.launcher_report);
- a member whose own code raised (the evidence `raised`, ftcoord.protocol.evidence);
- a member the leader declared dead or hung (the interrupt `<reason>:slot=<s>`, ftcoord.leader.judge).

Those slots are the record's culprits; the interrupt names who saw it first. With no culprit the interrupt is the
cause (a joiner grew the job, a stop was asked). Read once per decision, with the launcher report of each absentee.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ftcoord.protocol import evidence, keys, launcher_report
from ftcoord.protocol.record import GenerationRecord
from ftcoord.store.client import get_or_none

DECLARED = {keys.HUNG: "hung", keys.HEARTBEAT_STALE: "stopped beating", keys.GONE: "was gone"}
"""The judge's reasons for declaring a member dead, in a few words."""

_NAMED_AT_MOST = 4  # culprits described one by one; the rest are counted
_TEXT_AT_MOST = 300  # a cause carried through generations that never trained grows: every member reads the record


@dataclass(frozen=True)
class Cause:
    """A generation change's root cause: who, in words, and their slots."""

    text: str
    culprits: tuple[int, ...]


def _interrupt_parts(interrupt: str) -> tuple[str, int | None]:
    """(the reason's kind, the slot it names) of an interrupt such as `exception:slot=0:RuntimeError`."""
    kind, _, rest = interrupt.partition(":")
    slot = rest.partition(":")[0].removeprefix("slot=")
    return kind, int(slot) if slot.isdigit() else None


def _seen_by(interrupt: str, culprits: dict[int, str]) -> str:
    """Who saw the change first, when that is not a culprit itself."""
    kind, slot = _interrupt_parts(interrupt)
    if kind == "exception" and slot is not None and slot not in culprits:
        return f", seen by slot {slot}"
    if kind in DECLARED:
        return ", seen by the leader"
    if kind == "closed":
        return ", seen by the leader's probe"
    if kind == "rejoin" and slot in culprits:
        return ", seen when its replacement rejoined"
    return ""


def _without_culprit(interrupt: str) -> str:
    kind, slot = _interrupt_parts(interrupt)
    if kind in ("grow", "rejoin") and slot is not None:
        return f"slot {slot} joined"
    if kind == "stop":
        return "a stop was asked"
    if kind == "fatal":
        return "the job failed"
    return interrupt or "unknown"


def find_cause(store: dist.Store, previous: GenerationRecord | None, decided: GenerationRecord) -> Cause | None:
    """The root cause of the change from `previous` to `decided` (None when there was no previous generation). When
    `previous` committed no step (cut while it formed), its own cause and culprits are carried into this one.

    Args:
        store: the job's store.
        previous: the generation that ended (its members are the suspects).
        decided: the record about to be written (whose joins it saw).
    """
    if previous is None or previous.failed is not None or not previous.members:
        return None
    interrupt = (get_or_none(store, keys.interrupt(previous.generation)) or b"").decode()
    declared_kind, declared_slot = _interrupt_parts(interrupt)
    said = evidence.entries(store, previous.generation)
    raised = {int(member): error for kind, rest in said if kind == "raised"
              for member, _, error in [rest.partition(" ")] if member.isdigit()}
    leaving = {int(rest) for kind, rest in said if kind == "leaving" and rest.isdigit()}
    culprits: dict[int, str] = {}
    for member, incarnation in zip(previous.members, previous.incarnations, strict=True):
        declared = DECLARED.get(declared_kind) if declared_slot == member else None
        if member in raised:
            culprits[member] = f"raised {raised[member]}"
        elif not decided.was_considered(member, incarnation):
            if member in leaving:
                culprits[member] = "left"
                continue
            ended = launcher_report.last_exit(get_or_none(store, keys.launcher(member)), incarnation)
            if ended is not None and ended.kind == "fenced" and declared:
                culprits[member] = f"{declared}, was fenced and killed"
            elif ended is not None:
                culprits[member] = ended.describe()
            else:
                culprits[member] = declared or "did not come back"
        elif declared:
            culprits[member] = declared
    if not culprits:
        cause = Cause(_without_culprit(interrupt), ())
    else:
        named = [f"slot {slot} {what}" for slot, what in list(culprits.items())[:_NAMED_AT_MOST]]
        more = len(culprits) - len(named)
        text = "; ".join(named) + (f"; and {more} more" if more else "") + _seen_by(interrupt, culprits)
        cause = Cause(text, tuple(culprits))
    if decided.start_step <= previous.start_step and previous.cause is not None:
        # The ended generation committed no step (it was cut while it formed: a joiner, a second fault): the change
        # from the last generation that trained is still its cause's as well.
        carried = tuple(slot for slot in previous.culprits if slot not in cause.culprits)
        text = f"{cause.text}; before that, {previous.cause}"
        cause = Cause(text if len(text) <= _TEXT_AT_MOST else text[:_TEXT_AT_MOST - 1] + "…", cause.culprits + carried)
    return cause
