"""Leader election (ftcoord.leader.election) against a real store: one holder per term, whatever the interleaving."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from ftcoord import StoreServer, connect, job_store
from ftcoord.config import Timing
from ftcoord.leader.election import Election
from ftcoord.leader.judge import Judge
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.generations import LeaderClaim
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import register
from ftcoord.store.client import get_or_none

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


@pytest.mark.parametrize("same_node", [True, False])
def test_a_hot_spare_leader_lost_with_a_node_is_succeeded_on_the_evidence(store: dist.Store, same_node: bool) -> None:
    """A hot spare leads (it claimed the first term) and its node is lost, with members of the running generation:
    the survivors' collectives fail on closed connections, naming a lost member. A follower watches the leader alone,
    and the evidence judged members only, so the spare leader was succeeded after its heartbeat timeout (2.1 s at the
    scenario timing). Silent for evidence_silence on the node of a member named so, it is gone with that node; on
    another node it is awaited as before (its silence alone proves nothing yet)."""
    elected: list[int] = []
    spare = election(store, 100000, elected)
    spare.follow(pinned=0)  # claims the first term
    follower = election(store, 2, elected)
    follower.follow(pinned=0)  # learns the holder
    read_at, facts, holder = follower.follow(pinned=0)
    assert holder == LeaderClaim(1, 100000, 1)
    record = GenerationRecord(generation=5, members=(0, 1, 2, 3), incarnations=(1, 1, 1, 1), leader=100000,
                              leader_term=1, target_world_size=4)
    store.append(keys.evidence(5), "closed 0 2\n")  # slot 2's collective closed on slot 0
    for slot, launcher_pid in ((0, 11), (1, 11), (2, 22), (3, 22), (100000, 11 if same_node else 22)):
        store.set(keys.launcher(slot), json.dumps({"host": "node", "launcher_pid": launcher_pid}))
    follower.try_acquire(holder, facts, record)
    assert follower.claim is None, "succeeded a leader that had not been silent at all"
    judge = follower._judge
    judge.observe(facts, read_at + Timing().evidence_silence + 0.01, replacing=False)  # nobody beat since
    follower.try_acquire(holder, facts, record)
    if same_node:
        assert follower.claim == LeaderClaim(2, 2, 1) and elected == [100000, 2]
    else:
        assert follower.claim is None and held(store) == LeaderClaim(1, 100000, 1)
