"""The leader's decision rule, as a pure function: who is in the next generation."""

from __future__ import annotations

from dataclasses import dataclass

from ftcoord.config import QuorumPolicy
from ftcoord.protocol.record import JoinRequest


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

    When the size is trimmed, joiners holding the most advanced state come first (leaving
    them out would lose it), then lower slots (usually the launcher's workers before its
    spares). Ranks follow slot order, so a slot keeps its rank whenever the membership
    allows it. The joiners left out are hot spares.

    Returns None when no accepted size can be formed (fewer than min_world_size).
    """
    best = max((j.step for j in joiners), default=-1)
    preferred = sorted(joiners, key=lambda j: (j.step != best, j.slot))
    for size in range(min(len(preferred), policy.limit), 0, -1):
        if policy.accepts(size):
            members = sorted(preferred[:size], key=lambda j: j.slot)
            spares = sorted(preferred[size:], key=lambda j: j.slot)
            return Decision(tuple(members), tuple(spares))
    return None
