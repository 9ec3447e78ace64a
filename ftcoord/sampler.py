"""ElasticBatchSampler: a data position that heals and re-shards, for a user's own DataLoader loop.

Unlike a stateless `DistributedSampler`, it keeps the position as the number of samples of the epoch's
permutation that committed steps consumed, over all ranks. Each step takes the next `batch_size * world_size`
samples (a global batch); rank r gets the r-th contiguous share. The world size is read from the current process
group each time an iteration starts, so after a generation change the rest of the epoch is re-sharded over the
new members: every remaining sample is trained once, by exactly one rank. Its state_dict carries the position,
so `call.heal({..., "data": sampler}, step=...)` brings every member to the same position, survivors and
replacements alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist


class ElasticBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This rank's share of each global batch of the rest of the epoch: a DataLoader's `batch_sampler`.

    `DataLoader(dataset, batch_sampler=ElasticBatchSampler(len(dataset), batch_size=32))`: it decides the batch
    sizes, which differ on a short last batch. The epoch's order is a permutation of the dataset drawn from
    (seed, epoch), the same on every rank (as DistributedSampler's `randperm` with `seed + epoch`). An epoch's last
    global batch may be short: it is shared out as evenly as possible (shares differ by one at most). A remainder
    smaller than the world size would leave a rank with nothing to train (and its peers waiting for it in the
    all-reduce), so it joins the global batch before it. Only when the whole rest of an epoch is smaller than the
    world size (the world grew at its very end) is it skipped; `skipped` names those samples. The position moves
    only on `step()`, so DataLoader workers may prefetch ahead.

    Args:
        size: the number of samples in the dataset (>= 1).
        batch_size: the samples each rank trains per step in a full global batch (>= 1).
        shuffle: True (default): a new permutation each epoch; False: the dataset's order every epoch.
        seed: the base of every epoch's permutation (default 0); must be the same on every rank.
    """

    def __init__(self, size: int, batch_size: int, *, shuffle: bool = True, seed: int = 0) -> None:
        if size < 1 or batch_size < 1:
            raise ValueError(f"ElasticBatchSampler(size={size}, batch_size={batch_size}): both must be >= 1")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch = 0
        self.consumed = 0
        """Samples of this epoch's permutation that committed steps took, over all ranks."""
        self.skipped: list[int] = []
        """Samples an epoch skipped because fewer than the world size remained (see the module docstring)."""

    # -- position ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` at its first sample, or keep the position when it is the epoch already in progress
        (a loop that resumes calls `set_epoch(sampler.epoch)` again).

        Args:
            epoch: the epoch to train, counted from 0.
        """
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def step(self, world_size: int | None = None) -> None:
        """One step committed on every rank: the position moves past its global batch.

        Args:
            world_size: the number of ranks that took part in the step; None: the current process group's.

        Raises:
            RuntimeError: the epoch has no sample left to consume.
        """
        size = self._next_global_batch(world_size or self._world()[1])
        if not size:
            raise RuntimeError(f"ElasticBatchSampler.step(): epoch {self.epoch} has no sample left to consume")
        self.consumed += size

    @property
    def epoch_done(self) -> bool:
        """No step is left in this epoch at the current world size."""
        return self.epoch_done_at(self._world()[1])

    def epoch_done_at(self, world_size: int) -> bool:
        """Whether no step is left in this epoch at a given world size.

        Args:
            world_size: the number of ranks that would share the next global batch.
        """
        return not self._next_global_batch(world_size)

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, consumed) and what must match to load it (seed, size, shuffle)."""
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed, "size": self.size,
                "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move to the position of `state`.

        Args:
            state: a `state_dict()` of a sampler built with the same size, seed and shuffle.

        Raises:
            ValueError: `state` comes from a sampler built another way.
        """
        if (state["size"], state["seed"], state["shuffle"]) != (self.size, self.seed, self.shuffle):
            raise ValueError(f"ElasticBatchSampler: a state for size={state['size']} seed={state['seed']} "
                             f"shuffle={state['shuffle']} cannot be loaded into size={self.size} seed={self.seed} "
                             f"shuffle={self.shuffle}; every rank must build the sampler the same way")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    # -- order -----------------------------------------------------------------------------------

    def permutation(self, epoch: int | None = None) -> list[int]:
        """The order of an epoch's samples (the same on every rank).

        Args:
            epoch: the epoch whose order to give; None: the current one.
        """
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    @staticmethod
    def _world() -> tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _next_global_batch(self, world: int) -> int:
        """The size of the next global batch at this world size (0: the epoch is done): the first of
        `_global_batches`, without listing the rest (this runs at every step)."""
        full, tail = divmod(self.size - self.consumed, self.batch_size * world)
        if full > 1 or (full == 1 and (tail == 0 or tail >= world)):
            return self.batch_size * world
        if full == 1:
            return self.batch_size * world + tail  # the tiny rest joins it
        return tail if tail >= world else 0

    def _global_batches(self, world: int) -> list[int]:
        """Sizes of the global batches that cover the rest of the epoch at this world size."""
        left = self.size - self.consumed
        full, tail = divmod(left, self.batch_size * world)
        sizes = [self.batch_size * world] * full
        if tail >= world:
            sizes.append(tail)
        elif tail and sizes:
            sizes[-1] += tail  # too short to give every rank a sample: it joins the batch before it
        return sizes

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches(*self._world())

    def batches(self, rank: int, world: int) -> Iterator[list[int]]:
        """The rank's share of each global batch from the current position (what iterating yields).

        When the rest of the epoch is smaller than `world`, nothing is yielded and `skipped` names that rest.

        Args:
            rank: this process's rank, 0 to world - 1.
            world: the number of ranks that share each global batch.
        """
        order = self.permutation()
        start = self.consumed
        sizes = self._global_batches(world)
        left = order[start:]
        if not sizes and left:
            self.skipped = left
        for size in sizes:
            share, extra = divmod(size, world)
            begin = start + rank * share + min(rank, extra)
            yield order[begin:begin + share + (1 if rank < extra else 0)]
            start += size

    def __len__(self) -> int:
        world = self._world()[1]
        full, tail = divmod(self.size - self.consumed, self.batch_size * world)
        return full + (tail >= world)
