"""When a launcher starts a slot's next process (ftcoord.launcher.restart_delay)."""

from __future__ import annotations

import pytest

from ftcoord.launcher.restart_delay import RestartDelay

pytestmark = pytest.mark.timeout(10)


def test_a_process_that_came_up_is_replaced_at_once_however_many_faults_came_before() -> None:
    delay = RestartDelay()
    assert [delay.after(came_up=True) for _ in range(10)] == [0.0] * 10


def test_processes_dying_before_they_come_up_back_off_and_one_that_came_up_resets_it() -> None:
    """A broken node must not spin: from the second death in a row before registering, 0.25 s doubling to 5 s."""
    delay = RestartDelay()
    young = [delay.after(came_up=False) for _ in range(8)]
    assert young == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert delay.after(came_up=True) == 0.0
    assert delay.after(came_up=False) == 0.0, "a process that came up ends the streak"
    assert delay.after(came_up=False) == 0.25
