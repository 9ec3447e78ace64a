"""Slot numbers of hot spares: above every worker slot, distinct per launcher.

Pure Python: the launcher parses its command line with these before it imports torch.
"""

from __future__ import annotations

SPARE_SLOT_BASE = 100_000
"""Launchers number hot spares from here: they sort after every worker slot, so workers keep their
ranks, and a starting job seats its workers before any spare."""
MAX_SPARES = 1000
"""Hot spares per launcher: a launcher's spares are SPARE_SLOT_BASE + first_slot * MAX_SPARES + i, so two
launchers (distinct first slots) never share a spare slot, whatever their numbers of spares."""


def spare_slot(first_slot: int, index: int) -> int:
    """The slot of a launcher's `index`-th hot spare (see MAX_SPARES)."""
    return SPARE_SLOT_BASE + first_slot * MAX_SPARES + index
