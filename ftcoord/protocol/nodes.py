"""Which node a slot's process runs on, as its launcher reports it (keys.launcher: its host and pid).

The leader asks only when a node may be lost (ftcoord.leader.judge.Judge.outsiders_in_doubt): rarely, and about a few
slots. A process that no launcher started has no report: its node is unknown, and it is nobody's neighbour.
"""

from __future__ import annotations

import json

import torch.distributed as dist

from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none

Node = tuple[str, int]
"""(host, launcher pid): one launcher per node."""


class NodeMap:
    """The nodes of the slots' processes, read once per incarnation (a launcher reports a slot when it starts its
    process, before that process registers its incarnation)."""

    def __init__(self, store: dist.Store) -> None:
        self._store = store
        self._known: dict[int, tuple[int, Node]] = {}  # slot -> (incarnation, node): one entry per slot

    def of(self, incarnations: dict[int, int]) -> dict[int, Node]:
        """slot -> node for the given slot -> incarnation; a slot with no report is left out."""
        found = {}
        for slot, incarnation in incarnations.items():
            known = self._known.get(slot)
            if known is None or known[0] != incarnation:
                raw = get_or_none(self._store, keys.launcher(slot))
                if raw is None:
                    continue
                report = json.loads(raw)
                known = self._known[slot] = (incarnation, (str(report["host"]), int(report["launcher_pid"])))
            found[slot] = known[1]
        return found

    def beside(self, candidates: dict[int, int], others: dict[int, int]) -> set[int]:
        """The slots of `candidates` that run on the node of one of `others` (both slot -> incarnation)."""
        nodes = self.of({**others, **candidates})
        theirs = {nodes[s] for s in others if s in nodes}
        return {s for s in candidates if s in nodes and nodes[s] in theirs}
