"""A silence is judged on the dot: the read that finds a heartbeat silent for heartbeat_timeout is asked when it
would be, not at the next step of the watcher's grid (the leader's tick of 0.25 s, a deputy's interval of a third
of the timeout). Participants in threads against a real store; a heartbeat thread stopped is the silence.

On the grid alone, the silence judged overshoots the timeout by what is left of a step: for the leader, a timeout of
4.4 ticks is judged at the 5th (1.26 s for 1.1 s); for a deputy, by however its grid of looks moved at a join's
look at once (1.11-1.32 s for 1 s here). Each case runs three times, so one run the grid happens to serve on the
dot hides nothing; sabotage (Judge.sooner returning its argument) failed 5 of the 6, and all 6 in two other runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ftcoord import Participant, QuorumPolicy, StoreServer, Timing
from tests.helpers.joining import join_together
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)

TIMING = Timing(heartbeat_interval=0.5, heartbeat_timeout=1.0, join_timeout=0.5, barrier_timeout=10.0)
LEADER_TIMING = Timing(heartbeat_interval=0.5, heartbeat_timeout=1.1, join_timeout=0.5, barrier_timeout=10.0)
"""A timeout of 4.4 ticks: on the grid alone, the silence is judged at the 5th (a timeout that is a whole number of
ticks, and rounds that take no time, would put the grid on the dot)."""
ON_THE_DOT_S = 0.1
"""Above the wake-up of a loaded machine (1-12 ms measured with 4 busy loops), below the grid a sabotaged judge
would keep (0.15 s and more)."""


class Heard:
    """A leader duty's log as the test hears it, whatever level this process logs at (a test before may have set
    "error", as `chaos run` does in-process): every event said, then passed on."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self.events: list[dict[str, Any]] = []

    def __getattr__(self, level: str) -> Callable[..., Any]:
        say = getattr(self._log, level)

        def heard(event: str, **facts: Any) -> Any:
            self.events.append({"event": event, **facts})
            return say(event, **facts)

        return heard

    def said(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


def hear(p: Participant) -> Heard:
    """What the participant's leader duty (its judge and its election) says from now on."""
    heard = Heard(p.leader._log)  # noqa: SLF001 - the duty's own logger, shared by its judge and election
    p.leader._judge._log = p.leader._election._log = heard  # noqa: SLF001
    return heard


@pytest.fixture
def started() -> Iterator[list[Participant]]:
    parts: list[Participant] = []
    yield parts
    for p in parts:
        p.close(leaving=False)


def formed(address: str, job_id: str, started: list[Participant], timing: Timing) -> list[Participant]:
    """Three participants in one generation, their leader first."""
    ended: list[str] = []
    parts = [Participant(address, job_id, slot, QuorumPolicy(3), timing, on_helper_failure=ended.append).start()
             for slot in range(3)]
    started += parts
    join_together(*parts)
    assert all(p.generation == 1 for p in parts), [p.generation for p in parts]
    wait_until(lambda: sum(p.leader.is_leader for p in parts) == 1, 5, "a leader")
    return sorted(parts, key=lambda p: not p.leader.is_leader)


@pytest.mark.parametrize("run", range(3))
def test_the_leader_judges_a_silent_member_dead_on_the_dot(
        store_server: StoreServer, job_id: str, started: list[Participant], run: int) -> None:
    leader, member, _ = formed(store_server.address, f"{job_id}-{run}", started, LEADER_TIMING)
    heard = hear(leader)
    member.heartbeat.stop()  # silent from its last beat on
    wait_until(lambda: heard.said("member_declared_dead"), 10, "the member declared dead")
    [declared] = heard.said("member_declared_dead")
    assert declared["slot"] == member.slot and declared["reason"] == "heartbeat_stale", declared
    overshoot = declared["silent_s"] - LEADER_TIMING.heartbeat_timeout
    assert 0 <= overshoot < ON_THE_DOT_S, f"judged silent for {declared['silent_s']}s (timeout 1.1 s, tick 0.25 s)"


@pytest.mark.parametrize("run", range(3))
def test_a_deputy_takes_over_from_a_silent_leader_on_the_dot(
        store_server: StoreServer, job_id: str, started: list[Participant], run: int) -> None:
    leader, *deputies = formed(store_server.address, f"{job_id}-{run}", started, TIMING)
    heard = [hear(deputy) for deputy in deputies]
    leader.heartbeat.stop()  # its duty thread goes on: only its silence tells
    threading.Event().wait(0.1 + 0.1 * run)
    for deputy in deputies:  # a join starts: a deputy looks at once, and its grid of looks moves
        with deputy.leader.hurried():
            pass
    wait_until(lambda: any(h.said("leader_elected") for h in heard), 10, "a deputy to take over")
    [elected] = [e for h in heard for e in h.said("leader_elected")]
    assert elected["previous"].split(":")[1] == str(leader.slot), elected
    overshoot = elected["previous_silent_s"] - TIMING.heartbeat_timeout
    assert 0 <= overshoot < ON_THE_DOT_S, f"taken over after {elected['previous_silent_s']}s silent (timeout 1 s, " \
                                          f"a deputy's interval {TIMING.watch_interval:.2f} s)"
