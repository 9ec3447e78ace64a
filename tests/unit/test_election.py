"""Leader election (ftcoord.election) against a real store: one holder per term, whatever the interleaving."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from ftcoord import StoreServer, connect, job_store, keys
from ftcoord.config import Timing
from ftcoord.decisions import LeaderClaim
from ftcoord.election import Election
from ftcoord.judgement import Judge
from ftcoord.log import get_logger
from ftcoord.slots import register
from ftcoord.store import get_or_none

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def store(store_server: StoreServer, job_id: str) -> Iterator[dist.Store]:
    yield job_store(connect(store_server.address), job_id)


def election(store: dist.Store, slot: int, elected: list[int]) -> Election:
    """A registered process's side of the election (incarnation 1 of `slot`), on its own client."""
    assert register(store, slot) == 1
    log = get_logger(component="test-election", slot=slot)
    judge = Judge(store, Timing(), None, log)
    return Election(store, slot, 1, judge, log, saw_incarnation=lambda incarnation: None,
                    on_elected=lambda: elected.append(slot))


def held(store: dist.Store) -> LeaderClaim:
    return LeaderClaim.parse(get_or_none(store, keys.LEADER) or b"0")


def test_the_first_follower_claims_the_first_term(store: dist.Store) -> None:
    elected: list[int] = []
    first, second = election(store, 0, elected), election(store, 1, elected)
    assert first.follow(pinned=0)[2] is None and first.claim == LeaderClaim(1, 0, 1)
    second.follow(pinned=0)
    assert second.follow(pinned=0)[2] == LeaderClaim(1, 0, 1) and second.claim is None
    assert elected == [0] and held(store) == LeaderClaim(1, 0, 1)


def test_two_followers_that_both_saw_the_leadership_released_cannot_both_take_it(store: dist.Store) -> None:
    """Both read "1:released" and both try to take term 2 (the compare_set from the claim they read is the only
    thing between them): one wins, the other learns who did."""
    store.set(keys.LEADER, "1:released")
    elected: list[int] = []
    a, b = election(store, 0, elected), election(store, 1, elected)
    seen_a, seen_b = a.follow(pinned=0), b.follow(pinned=0)
    assert seen_a[2] == seen_b[2] == LeaderClaim(1, None, None)
    a.try_acquire(seen_a[2], seen_a[1], None)
    b.try_acquire(seen_b[2], seen_b[1], None)
    assert a.claim == LeaderClaim(2, 0, 1) and b.claim is None
    assert elected == [0] and held(store) == LeaderClaim(2, 0, 1)
    assert b.follow(pinned=0)[2] == LeaderClaim(2, 0, 1)  # it learns who did, and follows


def test_a_deposed_leader_finds_out_before_it_writes_and_follows_the_new_holder(store: dist.Store) -> None:
    elected: list[int] = []
    stale = election(store, 0, elected)
    assert register(store, 1) == 1  # the process that takes over
    stale.follow(pinned=0)
    assert stale.claim == LeaderClaim(1, 0, 1) and stale.confirm()
    # it pauses; slot 1 judges it gone and takes the next term
    store.compare_set(keys.LEADER, "1:0:1", "2:1:1")
    assert not stale.confirm()
    assert stale.claim is None and stale.term == 0
    assert stale.follow(pinned=0)[2] == LeaderClaim(2, 1, 1)
    assert elected == [0]


def test_a_released_leadership_is_taken_at_once_without_waiting_for_silence(store: dist.Store) -> None:
    elected: list[int] = []
    leader, follower = election(store, 0, elected), election(store, 1, elected)
    leader.follow(pinned=0)
    follower.follow(pinned=0)
    leader.release()
    assert leader.claim is None and held(store) == LeaderClaim(1, None, None)
    released = follower.follow(pinned=0)  # learns the release (a new claim value)
    assert released[2] is None
    holder = follower.follow(pinned=0)
    assert holder[2] == LeaderClaim(1, None, None)
    follower.try_acquire(holder[2], holder[1], None)
    assert follower.claim == LeaderClaim(2, 1, 1) and elected == [0, 1]
