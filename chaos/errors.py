"""Error types of the chaos package that its command line must know without importing torch."""

from __future__ import annotations


class ReferenceUnusable(RuntimeError):
    """The fault-free reference could not be built or does not hold up: nothing can be compared with it."""
