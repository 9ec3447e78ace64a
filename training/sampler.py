"""The resumable global-batch sampler: exactly-once data progress through faults.

Epoch geometry is fixed: steps_per_epoch = D // global_batch. The permutation of epoch e
comes from (seed, e); global step s takes the window perm[s*B:(s+1)*B]; rank r of M takes
the contiguous shard window[r*B/M:(r+1)*B/M]. The state is (seed, epoch, cursor), so a
restart resumes at the exact window, and a new world size re-shards the same window.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from training.config import check_dataset_holds_a_batch
from training.errors import TrainingConfigError


@dataclass(frozen=True)
class SamplerState:
    seed: int
    epoch: int
    cursor: int
    """The next step within the epoch."""


class ResumableGlobalBatchSampler:
    """Maps a global step to its window of sample ids and a rank to its shard."""

    def __init__(self, dataset_size: int, global_batch: int, seed: int) -> None:
        if global_batch < 1:
            raise TrainingConfigError(f"global_batch={global_batch} must be >= 1")
        check_dataset_holds_a_batch(dataset_size, global_batch)
        self.dataset_size = dataset_size
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = dataset_size // global_batch
        self._perm_epoch: int | None = None
        self._perm: torch.Tensor | None = None

    def state(self, step: int) -> SamplerState:
        """The sampler state before global step `step`."""
        return SamplerState(self.seed, step // self.steps_per_epoch, step % self.steps_per_epoch)

    @staticmethod
    def step_of(state: SamplerState, steps_per_epoch: int) -> int:
        return state.epoch * steps_per_epoch + state.cursor

    def permutation(self, epoch: int) -> torch.Tensor:
        """The sample order of an epoch, derived from (seed, epoch) only."""
        if self._perm_epoch != epoch:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
            self._perm = torch.randperm(self.dataset_size, generator=generator)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    def window(self, step: int) -> torch.Tensor:
        """The global batch of sample ids trained at global step `step`."""
        state = self.state(step)
        start = state.cursor * self.global_batch
        return self.permutation(state.epoch)[start : start + self.global_batch]

    def shard(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        """Rank `rank`'s contiguous part of the window."""
        local = local_batch(self.global_batch, world_size)
        return self.window(step)[rank * local : (rank + 1) * local]


def local_batch(global_batch: int, world_size: int) -> int:
    """global_batch / world_size, or a clear error when it does not divide."""
    if global_batch % world_size != 0:
        fits = [d for d in range(1, global_batch + 1) if global_batch % d == 0]
        raise TrainingConfigError(
            f"global_batch {global_batch} is not divisible by world_size {world_size}; pick a world size "
            f"in {fits[:12]}{' ...' if len(fits) > 12 else ''} or change --global-batch"
        )
    return global_batch // world_size


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from a base seed and labels: the same inputs give the same seed anywhere."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def ids_hash(ids: torch.Tensor) -> str:
    """A short digest of a list of sample ids (the ledger logs it per step)."""
    return hashlib.sha1(ids.to(torch.int64).numpy().tobytes()).hexdigest()[:16]
