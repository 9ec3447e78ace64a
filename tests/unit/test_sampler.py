"""The resumable sampler: exactly-once data progress under any resume/world-size schedule."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.errors import DatasetNotFound, TrainingConfigError
from training.sampler import ResumableGlobalBatchSampler, local_batch

GLOBAL_BATCH = 24  # divisible by 1, 2, 3, 4, 6, 8, 12, 24


@settings(max_examples=150, deadline=None)
@given(
    dataset_size=st.integers(min_value=GLOBAL_BATCH, max_value=400),
    seed=st.integers(min_value=0, max_value=2**31),
    segments=st.lists(st.tuples(st.integers(1, 40), st.sampled_from([1, 2, 3, 4, 6, 8])), min_size=1, max_size=8),
)
def test_every_sample_exactly_once_per_epoch_through_resumes_and_resizes(
    dataset_size: int, seed: int, segments: list[tuple[int, int]]
) -> None:
    """Each segment is a run of steps at one world size, resumed from (seed, epoch, cursor)."""
    sampler = ResumableGlobalBatchSampler(dataset_size, GLOBAL_BATCH, seed)
    seen: dict[int, Counter[int]] = {}
    step = 0
    for length, world in segments:
        state = sampler.state(step)  # what a checkpoint or a healed peer hands over
        resumed = ResumableGlobalBatchSampler(dataset_size, GLOBAL_BATCH, state.seed)
        step = ResumableGlobalBatchSampler.step_of(state, resumed.steps_per_epoch)
        for _ in range(length):
            epoch = resumed.state(step).epoch
            for rank in range(world):
                seen.setdefault(epoch, Counter()).update(resumed.shard(step, rank, world).tolist())
            step += 1
    for epoch, counts in seen.items():
        assert max(counts.values()) == 1, f"epoch {epoch} trained a sample twice"
        full = sampler.permutation(epoch)[: sampler.steps_per_epoch * GLOBAL_BATCH].tolist()
        trained_steps = sum(counts.values()) // GLOBAL_BATCH
        assert set(counts) == set(full[: trained_steps * GLOBAL_BATCH])


def test_shards_of_a_step_tile_its_window() -> None:
    sampler = ResumableGlobalBatchSampler(100, 24, seed=3)
    for world in (1, 2, 3, 4, 6):
        tiles = [sampler.shard(5, r, world) for r in range(world)]
        assert sum((t.tolist() for t in tiles), []) == sampler.window(5).tolist()


def test_epoch_geometry_is_fixed_and_drops_the_tail() -> None:
    sampler = ResumableGlobalBatchSampler(100, 24, seed=3)
    assert sampler.steps_per_epoch == 4
    assert sampler.state(4).epoch == 1 and sampler.state(4).cursor == 0
    assert sampler.permutation(0).tolist() != sampler.permutation(1).tolist()


def test_indivisible_world_size_is_a_clear_error() -> None:
    with pytest.raises(TrainingConfigError, match=r"global_batch 96 is not divisible by world_size 5; "
                                                  r"pick a world size in \[1, 2, 3, 4, 6, 8"):
        local_batch(96, 5)


def test_dataset_smaller_than_the_global_batch_is_refused() -> None:
    with pytest.raises(TrainingConfigError, match="fewer than global_batch=32"):
        ResumableGlobalBatchSampler(10, 32, 0)


def test_missing_dataset_folder_is_named_and_never_downloaded(tmp_path) -> None:
    from training.data import make_dataset

    with pytest.raises(DatasetNotFound, match="never downloads"):
        make_dataset(f"cifar10:{tmp_path / 'nope'}")
    with pytest.raises(DatasetNotFound, match="no CIFAR10 data"):
        make_dataset(f"cifar10:{tmp_path}")
    with pytest.raises(TrainingConfigError, match="unknown dataset 'mnist'"):
        make_dataset("mnist")


def test_datasets_return_sample_ids() -> None:
    from training.data import make_dataset

    for spec in ("synthetic:64", "fakedata:16"):
        dataset = make_dataset(spec, seed=1)
        x, y, sample_id = dataset[7]
        assert sample_id == 7 and isinstance(y, int)
        again = make_dataset(spec, seed=1)[7]
        assert (again[0] == x).all()
