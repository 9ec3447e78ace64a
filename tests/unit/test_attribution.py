"""The root cause of a generation change (ftcoord.leader.attribution), read from a real store: the member whose
process ended the generation, not the witness whose interrupt came first."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch.distributed as dist

from ftcoord import StoreServer, connect, job_store
from ftcoord.leader.attribution import find_cause
from ftcoord.protocol import evidence, keys, launcher_report
from ftcoord.protocol.record import GenerationRecord


@pytest.fixture
def store(store_server: StoreServer, job_id: str) -> Iterator[dist.Store]:
    yield job_store(connect(store_server.address), job_id)


def record(generation: int, considered: list[tuple[int, int]]) -> GenerationRecord:
    members = tuple(slot for slot, _ in considered)
    return GenerationRecord(generation=generation, members=members, incarnations=tuple(i for _, i in considered),
                            leader=0, leader_term=1, target_world_size=len(members), considered=tuple(considered))


def exited(store: dist.Store, slot: int, incarnation: int, code: int, kind: str) -> None:
    launcher_report.publish(store, slot, None, Counter(), "ready", launcher_report.Exit(incarnation, code, kind))


PREVIOUS = record(4, [(0, 1), (1, 1), (2, 1)])


def test_a_killed_member_is_the_cause_and_the_survivor_that_saw_it_its_witness(store: dist.Store) -> None:
    """In `make demo` the change after slot 1 was killed was put down to slot 0's failed collective: the witness."""
    store.set(keys.interrupt(4), "exception:slot=0:RuntimeError:closed=1")
    exited(store, 1, 1, -9, "signal")
    cause = find_cause(store, PREVIOUS, record(5, [(0, 1), (1, 2), (2, 1)]))  # slot 1's replacement joined
    assert cause is not None and cause.culprits == (1,)
    assert cause.text == "slot 1 died (SIGKILL), seen by slot 0"


def test_a_member_that_raised_is_named_whoever_interrupted_first(store: dist.Store) -> None:
    store.set(keys.interrupt(4), "exception:slot=0:RuntimeError:closed=2")
    evidence.report_raised(store, 4, 2, "ValueError")
    cause = find_cause(store, PREVIOUS, record(5, [(0, 1), (1, 1), (2, 1)]))  # everyone restarted in-process
    assert cause is not None and (cause.culprits, cause.text) == ((2,), "slot 2 raised ValueError, seen by slot 0")


def test_a_member_declared_hung_and_fenced_is_named_with_how_it_ended(store: dist.Store) -> None:
    store.set(keys.interrupt(4), f"{keys.HUNG}:slot=2")
    exited(store, 2, 1, -9, "fenced")
    cause = find_cause(store, PREVIOUS, record(5, [(0, 1), (1, 1)]))  # decided without it
    assert cause is not None and cause.culprits == (2,)
    assert cause.text == "slot 2 hung, was fenced and killed, seen by the leader"


def test_an_older_process_exit_is_not_taken_for_the_members(store: dist.Store) -> None:
    """The launcher report tells the last exit of the slot; an exit of an earlier incarnation says nothing of this one
    (a node lost with its launcher: no report at all)."""
    store.set(keys.interrupt(4), "closed:probe")
    exited(store, 1, 0, 1, "exit")
    cause = find_cause(store, PREVIOUS, record(5, [(0, 1), (2, 1)]))
    assert cause is not None and cause.text == "slot 1 did not come back, seen by the leader's probe"


def test_a_change_with_no_culprit_is_put_down_to_its_interrupt(store: dist.Store) -> None:
    store.set(keys.interrupt(4), "grow:slot=3")
    cause = find_cause(store, PREVIOUS, record(5, [(0, 1), (1, 1), (2, 1), (3, 1)]))
    assert cause is not None and (cause.culprits, cause.text) == ((), "slot 3 joined")
    assert find_cause(store, None, PREVIOUS) is None  # a first generation has no cause


def test_a_member_left_out_alive_is_named_but_a_spare_kept_out_is_not(store: dist.Store) -> None:
    """A member that did not rejoin in time is one the change happened without; a live joiner the quorum put among
    the spares (an elastic job rounding its world down) was seen and is no culprit."""
    store.set(keys.interrupt(4), "exception:slot=1:RuntimeError")
    evidence.report_raised(store, 4, 1, "RuntimeError")
    decided = replace(record(5, [(0, 1), (1, 1)]), members=(0,), incarnations=(1,), spares=(1,))
    cause = find_cause(store, PREVIOUS, decided)
    assert cause is not None and cause.culprits == (1, 2)
    assert cause.text == "slot 1 raised RuntimeError; slot 2 did not come back"


def test_a_generation_cut_while_it_formed_hands_its_cause_on(store: dist.Store) -> None:
    """Slot 1 killed; generation 5 decided without it, then cut before it committed a step by the replacement's
    join: the change to 6 is still the kill's (the verifier credits the kill with the first generation that names
    slot 1 and trains)."""
    store.set(keys.interrupt(4), "exception:slot=0:RuntimeError:closed=1")
    exited(store, 1, 1, -9, "signal")
    without = replace(record(5, [(0, 1), (2, 1)]), start_step=40)
    cause = find_cause(store, replace(PREVIOUS, start_step=30), without)
    assert cause is not None and cause.culprits == (1,)
    formed = replace(without, cause=cause.text, culprits=cause.culprits)
    store.set(keys.interrupt(5), "grow:slot=1")
    regrown = find_cause(store, formed, replace(record(6, [(0, 1), (1, 2), (2, 1)]), start_step=40))
    assert regrown is not None and regrown.culprits == (1,)
    assert regrown.text == "slot 1 joined; before that, slot 1 died (SIGKILL), seen by slot 0"
    trained = find_cause(store, formed, replace(record(6, [(0, 1), (1, 2), (2, 1)]), start_step=45))
    assert trained is not None and (trained.culprits, trained.text) == ((), "slot 1 joined")
