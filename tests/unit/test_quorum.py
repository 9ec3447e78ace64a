"""The leader's decision rule and the record's encoding."""

from __future__ import annotations

import dataclasses
import json
import random

from ftcoord.config import QuorumPolicy
from ftcoord.leader.quorum import choose_members
from ftcoord.protocol.record import GenerationRecord, JoinRequest, compact_ints, expand_ints, shallow_fields


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


def test_a_join_request_is_encoded_as_json_dumps_would() -> None:
    """to_json spells the announcement out (the leader counts and parses its lines): the same text json.dumps gives."""
    for request in (JoinRequest(generation=7, slot=3, incarnation=2, step=41),
                    JoinRequest(generation=1, slot=0, incarnation=1_764_000_000_123, step=-1)):
        expected = json.dumps(dataclasses.asdict(request), separators=(",", ":"))
        assert request.to_json() == expected


def test_ranks_are_looked_up_as_a_scan_of_the_members_would_find_them() -> None:
    members = (7, 3, 12, 0, 5)
    record = GenerationRecord(generation=2, members=members, incarnations=(1, 2, 1, 4, 1), leader=12,
                              leader_term=1, target_world_size=5)
    for slot in range(14):
        scan = members.index(slot) if slot in members else None
        assert record.rank_of_member(slot) == scan
        for incarnation in (1, 2, 4):
            expected = scan if scan is not None and record.incarnations[scan] == incarnation else None
            assert record.rank_of(slot, incarnation) == expected


def test_integer_sequences_come_back_from_their_compact_form_and_are_never_longer() -> None:
    rng = random.Random(17)
    for _ in range(2000):
        n = rng.randint(0, 60)
        shape = rng.choice(("noise", "sorted", "runs"))
        if shape == "noise":
            values = tuple(rng.randint(-3, 4) for _ in range(n))
        elif shape == "sorted":
            values = tuple(sorted(rng.sample(range(300), n)))
        else:  # slot order with gaps, incarnations mostly alike: what records hold
            values = tuple(v for v in range(n) if rng.random() > 0.05)
        encoded = json.loads(json.dumps(compact_ints(values)))
        assert expand_ints(encoded) == values, (values, encoded)
        assert len(json.dumps(encoded)) <= len(json.dumps(list(values))) + 2 * len(encoded), (values, encoded)


def test_a_record_of_a_thousand_members_in_slot_order_is_a_few_hundred_bytes() -> None:
    """Every member reads the record at each advance: plain lists were 16 KB at 1,024 members (issue 17)."""
    slots = tuple(s for s in range(1026) if s not in (17, 600))
    record = GenerationRecord(generation=9, members=slots, incarnations=(1,) * 600 + (2,) + (1,) * 423, leader=0,
                              leader_term=2, target_world_size=1026, heal_source=0, start_step=41,
                              spares=(1030,), considered=tuple((s, 1) for s in (*slots, 1030)),
                              steps=(41,) * 1023 + (-1,))
    text = record.to_json()
    assert len(text) < 600, text
    assert GenerationRecord.from_json(text) == record


def test_a_record_written_with_plain_lists_is_still_read() -> None:
    record = GenerationRecord(generation=3, members=(0, 4, 9), incarnations=(1, 2, 1), leader=4, leader_term=1,
                              target_world_size=3, considered=((0, 1), (4, 2), (9, 1), (11, 3)), steps=(5, 5, -1))
    plain = json.dumps(shallow_fields(record), sort_keys=True)  # how records were written before compact_ints
    assert GenerationRecord.from_json(plain) == record
