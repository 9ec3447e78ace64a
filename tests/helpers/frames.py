"""Watching the heartbeat thread look at the training thread's frames (ftcoord.liveness.still_stack), for unit tests."""

from __future__ import annotations

import time

import pytest


def count_frame_looks(monkeypatch: pytest.MonkeyPatch, waiting_modules: tuple[str, ...]) -> list[float]:
    """Make `waiting_modules` the modules a thread waits on its peers in, and return the list that gets the time of
    each snapshot the heartbeat takes of a thread's frames."""
    import ftcoord.liveness.heartbeat as heartbeat_module
    import ftcoord.liveness.still_stack as still_stack_module

    monkeypatch.setattr(still_stack_module, "WAITING_MODULES", waiting_modules)
    looked_at: list[float] = []
    real_frame_of = heartbeat_module.frame_of

    def frame_of(thread_id: int):  # type: ignore[no-untyped-def]
        looked_at.append(time.monotonic())
        return real_frame_of(thread_id)

    monkeypatch.setattr(heartbeat_module, "frame_of", frame_of)
    return looked_at
