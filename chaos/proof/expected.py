"""What a run must have trained, computed from the specification, not from the run's own code.

The ledger records the sample ids that came back with the batch and a digest of the batch's bytes. The verifier
compares them with this module's expectation, written apart from `training.sampler` on purpose: a sampler that picked
the wrong window, or a loop that fed the model other data than it logged, cannot vouch for itself. The specification
(DESIGN.md §2): steps_per_epoch = D // B; global step s is step s % steps_per_epoch of epoch s // steps_per_epoch;
the order of epoch e is torch.randperm(D) from a generator seeded with derive_seed(seed, "epoch", e); step s trains
the window order[c*B:(c+1)*B] (c the step within the epoch); rank r of W trains the contiguous shard
window[r*B/W:(r+1)*B/W].
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from training.data import batch_hash, collate, make_dataset
from training.sampler import derive_seed


class DataExpectation:
    """The ids (and batch digests) every (step, rank, world size) must have trained."""

    def __init__(self, dataset_spec: str, global_batch: int, seed: int, dataset: Dataset | None = None) -> None:
        self.dataset = dataset if dataset is not None else make_dataset(dataset_spec, seed)
        self.size = len(self.dataset)  # type: ignore[arg-type]
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = self.size // global_batch
        self._orders: dict[int, tuple[int, ...]] = {}

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def order(self, epoch: int) -> tuple[int, ...]:
        if epoch not in self._orders:
            if len(self._orders) > 4:  # steps are checked in order: old epochs are done with
                self._orders.clear()
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
            self._orders[epoch] = tuple(torch.randperm(self.size, generator=generator).tolist())
        return self._orders[epoch]

    def epoch_samples(self, epoch: int) -> list[int]:
        """Every sample an epoch trains (the tail beyond whole global batches is dropped)."""
        return list(self.order(epoch)[: self.steps_per_epoch * self.global_batch])

    def window(self, step: int) -> list[int]:
        within = step % self.steps_per_epoch
        return list(self.order(self.epoch_of(step))[within * self.global_batch : (within + 1) * self.global_batch])

    def shard(self, step: int, rank: int, world_size: int) -> list[int] | None:
        """Rank `rank`'s ids at `step`, or None when `world_size` cannot split the global batch."""
        if world_size < 1 or self.global_batch % world_size or not 0 <= rank < world_size:
            return None
        local = self.global_batch // world_size
        return self.window(step)[rank * local : (rank + 1) * local]

    def batch_hash(self, ids: list[int]) -> str:
        """The digest of the inputs and labels these ids give (read from the dataset here)."""
        x, y, _ = collate(self.dataset, torch.tensor(ids, dtype=torch.int64))
        return batch_hash(x, y)
