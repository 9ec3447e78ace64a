"""The leader's decision rule and the record's encoding."""

from __future__ import annotations

import dataclasses
import json

from ftcoord.config import QuorumPolicy
from ftcoord.quorum import choose_members
from ftcoord.record import GenerationRecord, JoinRequest


def joins(*slots_steps: tuple[int, int]) -> list[JoinRequest]:
    return [JoinRequest(generation=3, slot=s, incarnation=1, step=step) for s, step in slots_steps]


def test_members_follow_slot_order_and_extra_joiners_become_spares() -> None:
    decision = choose_members(joins((4, 0), (1, 0), (0, 0), (2, 0)), QuorumPolicy(3))
    assert decision is not None
    assert [j.slot for j in decision.members] == [0, 1, 2]
    assert [j.slot for j in decision.spares] == [4]


def test_trims_to_an_accepted_size() -> None:
    decision = choose_members(joins((0, 0), (1, 0), (2, 0)), QuorumPolicy(4, global_batch=8))
    assert decision is not None and [j.slot for j in decision.members] == [0, 1]


def test_trimming_never_leaves_out_the_only_holders_of_the_newest_state() -> None:
    # A hot spare (slot 100000) trained while slot 0 waited; slot 1 is a fresh replacement.
    decision = choose_members(joins((0, -1), (1, -1), (100000, 57)), QuorumPolicy(2))
    assert decision is not None
    assert [j.slot for j in decision.members] == [0, 100000]
    assert [j.slot for j in decision.spares] == [1]


def test_too_few_joiners_give_no_decision() -> None:
    assert choose_members(joins((0, 0)), QuorumPolicy(4, min_world_size=2)) is None


def test_heal_source_is_the_most_advanced_member_lowest_rank_on_ties() -> None:
    decision = choose_members(joins((0, 5), (1, 7), (2, 7)), QuorumPolicy(3))
    assert decision is not None and decision.heal_source == 1


def test_record_round_trips_through_json() -> None:
    record = GenerationRecord(
        generation=2, members=(0, 2), incarnations=(1, 3), leader=0, leader_term=4,
        target_world_size=3, heal_source=1, start_step=9, spares=(5,),
        considered=((0, 1), (2, 3), (5, 1)), liveness_read_at=1.5, steps=(8, 9),
    )
    again = GenerationRecord.from_json(record.to_json())
    assert again == record
    assert again.rank_of(2, 3) == 1 and again.rank_of(2, 2) is None
    assert again.was_considered(5, 1) and not again.was_considered(5, 2)


def test_a_join_request_survives_its_json_with_every_field() -> None:
    request = JoinRequest(generation=7, slot=3, incarnation=2, step=41)
    assert JoinRequest.from_json(request.to_json()) == request
    assert set(json.loads(request.to_json())) == {f.name for f in dataclasses.fields(JoinRequest)}
