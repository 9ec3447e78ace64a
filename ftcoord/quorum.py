"""The leader's decision rule, as a pure function: who is in the next generation."""

from __future__ import annotations

from dataclasses import dataclass

from ftcoord.config import QuorumPolicy
from ftcoord.record import JoinRequest


@dataclass(frozen=True)
class Decision:
    """Members (rank order) and hot spares chosen from the live joiners."""

    members: tuple[JoinRequest, ...]
    spares: tuple[JoinRequest, ...]

    @property
    def heal_source(self) -> int | None:
        """Rank with the most advanced state: max step, lowest rank on ties."""
        if not self.members:
            return None
        best = max(range(len(self.members)), key=lambda r: (self.members[r].step, -r))
        return best


def choose_members(joiners: list[JoinRequest], policy: QuorumPolicy) -> Decision | None:
    """Pick the largest accepted world size from the live joiners.

    Ranks follow slot order, so a slot keeps its rank across generations whenever the
    membership allows it (the data shard of a rank depends only on the rank). Slots
    beyond the chosen size (usually the launcher's spare slots) become hot spares.

    Returns None when no accepted size can be formed (fewer than min_world_size).
    """
    ordered = sorted(joiners, key=lambda j: j.slot)
    for size in range(min(len(ordered), policy.limit), 0, -1):
        if policy.accepts(size):
            return Decision(tuple(ordered[:size]), tuple(ordered[size:]))
    return None
