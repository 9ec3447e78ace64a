"""Liveness is judged by when an observer saw a counter change, on its own clock."""

from __future__ import annotations

from ftcoord.heartbeat import LivenessObserver
from ftcoord.leader import LeaderClaim


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fresh_observer_waits_a_full_timeout_before_calling_anyone_dead() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=5.0, clock=clock)
    observer.observe("hb/1", 42)  # a counter that never changes again
    clock.now += 4.9
    assert not observer.is_stale("hb/1")
    assert not observer.is_stale("hb/never-seen")
    clock.now += 0.2
    assert observer.is_stale("hb/1") and observer.is_stale("hb/never-seen")


def test_a_changing_counter_stays_alive_whatever_its_values() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=1.0, clock=clock)
    for value in (7, 8, 3, 9):  # values from another host mean nothing but "changed"
        clock.now += 0.9
        observer.observe("hb/0", value)
        assert not observer.is_stale("hb/0")


def test_reset_after_a_pause_forgets_old_observations() -> None:
    clock = FakeClock()
    observer = LivenessObserver(timeout=1.0, clock=clock)
    observer.observe("hb/0", 1)
    clock.now += 30.0  # this observer itself was stopped
    observer.reset()
    assert not observer.is_stale("hb/0")


def test_leader_claim_round_trips() -> None:
    assert LeaderClaim.parse(b"3:2:7") == LeaderClaim(3, 2, 7)
    assert str(LeaderClaim.parse("3:released")) == "3:released"
    assert LeaderClaim.parse("3:released").slot is None
