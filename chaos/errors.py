"""Error types of the chaos package that its command line must know without importing torch."""

from __future__ import annotations


class ReferenceUnusable(RuntimeError):
    """The fault-free reference could not be built or does not hold up: nothing can be compared with it."""


class NetworkError(RuntimeError):
    """A run's own network (chaos.run.network) could not be made or changed: the message names the command and why."""
