"""The launcher's environment for its processes: one OpenMP pool per core, not per process."""

from __future__ import annotations

import os

import pytest

from ftcoord.launcher.children_env import children_env

pytestmark = pytest.mark.timeout(10)


def test_threads_are_split_between_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert children_env(8)["OMP_NUM_THREADS"] == "2"
    assert children_env(32)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert children_env(2)["OMP_NUM_THREADS"] == "1"


def test_a_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    env = children_env(2)
    assert env["OMP_NUM_THREADS"] == "6" and env["PATH"] == os.environ["PATH"] and env["TORCH_CPP_LOG_LEVEL"] == "INFO"


def test_timed_out_store_waits_print_no_c10d_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's quickstart printed ~45 c10d 'waitForInput ... timed out' warnings a second."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    assert children_env(2)["TORCH_CPP_LOG_LEVEL"] == "ERROR"


def test_hot_spare_slots_never_collide_across_launchers() -> None:
    """Each launcher numbers its spares from its own first slot: with more spares than processes per node,
    two nodes used to hand out the same spare slot."""
    from ftcoord.launcher.config import LaunchConfig

    nodes = [LaunchConfig(command=["x"], job_id="j", store="s", nproc=2, spares=5, first_slot=first)
             for first in (0, 2, 4)]
    slots = [slot for node in nodes for slot in node.slots]
    assert len(slots) == len(set(slots)), sorted(slots)
    assert all(min(s for s in n.slots if s >= 100_000) > max(m.first_slot + m.nproc for m in nodes) for n in nodes)
