"""ElasticBatchSampler: every sample of every epoch exactly once, across steps, heals and world-size changes."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftcoord.sampler import ElasticBatchSampler

pytestmark = pytest.mark.timeout(120)


def run_epoch(sampler: ElasticBatchSampler, schedule: list[tuple[int, int]]) -> tuple[list[list[int]], int]:
    """Train an epoch in segments of (world size, steps) (the last segment runs to the epoch's end); each
    segment starts from a copy of the state as call.heal hands it to new members. Returns every batch of
    every rank, in order, and what was left of the epoch when the last segment began."""
    trained: list[list[int]] = []
    rest = sampler.size
    for i, (world, steps) in enumerate(schedule):
        rest = sampler.size - sampler.consumed
        ranks = [copy.deepcopy(sampler) for _ in range(world)]  # each member's sampler, healed to one state
        iterators = [s.batches(r, world) for r, s in enumerate(ranks)]
        done = 0
        while (i == len(schedule) - 1 or done < steps) and not ranks[0].epoch_done_at(world):
            batches = [next(it) for it in iterators]
            assert all(batches), f"a rank got an empty batch: {batches}"
            trained += batches
            for s in ranks:
                s.step(world)
            done += 1
        assert len({(s.epoch, s.consumed) for s in ranks}) == 1
        sampler = ranks[0]
    return trained, rest


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 300), batch=st.integers(1, 9), seed=st.integers(0, 5),
       schedule=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 12)), min_size=1, max_size=5))
def test_every_sample_once_per_epoch_across_world_size_changes(size: int, batch: int, seed: int,
                                                               schedule: list[tuple[int, int]]) -> None:
    sampler = ElasticBatchSampler(size, batch, seed=seed)
    batches, rest = run_epoch(sampler, schedule)
    trained = [i for b in batches for i in b]
    assert len(trained) == len(set(trained)), "a sample was trained twice"
    missing = set(range(size)) - set(trained)
    # Only a whole rest smaller than the world size at the epoch's very end may be skipped.
    assert not missing or len(missing) == rest < schedule[-1][0], (len(missing), rest, schedule)


def test_a_short_last_batch_is_shared_out_and_a_tiny_one_joins_the_batch_before() -> None:
    sampler = ElasticBatchSampler(21, 4, shuffle=False)  # world 2: global batches of 8, rest 5
    assert [b for r in (0, 1) for b in sampler.batches(r, 2)] == [
        [0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18], [4, 5, 6, 7], [12, 13, 14, 15], [19, 20]]
    tiny = ElasticBatchSampler(17, 4, shuffle=False)  # rest 1 < world 2: the last batch is 9
    assert list(tiny.batches(0, 2))[-1] == [8, 9, 10, 11, 12] and list(tiny.batches(1, 2))[-1] == [13, 14, 15, 16]


def test_state_round_trips_and_a_different_sampler_is_refused() -> None:
    a = ElasticBatchSampler(100, 5, seed=3)
    a.set_epoch(4)
    a.step(2)
    b = ElasticBatchSampler(100, 5, seed=3)
    b.load_state_dict(a.state_dict())
    assert (b.epoch, b.consumed) == (4, 10) and list(b.batches(1, 2)) == list(a.batches(1, 2))
    b.set_epoch(4)  # resuming the same epoch keeps the position
    assert b.consumed == 10
    b.set_epoch(5)
    assert b.consumed == 0
    with pytest.raises(ValueError, match="seed=4"):
        ElasticBatchSampler(100, 5, seed=4).load_state_dict(a.state_dict())


def test_each_epoch_has_its_own_order_the_same_on_every_rank() -> None:
    a, b = ElasticBatchSampler(50, 5, seed=1), ElasticBatchSampler(50, 5, seed=1)
    assert a.permutation(0) == b.permutation(0) != a.permutation(1)
    assert sorted(a.permutation(3)) == list(range(50))
