"""Model buffers (BatchNorm statistics) under faults: identical on all ranks, and only committed steps count.

A forward pass moves BatchNorm's running statistics before the step's collectives run. If a peer
dies in the all-reduce, the step does not commit, yet the survivor's statistics already moved:
healing from it would count that batch twice (ResNet-18 runs then end one `num_batches_tracked`
away from the reference). So the statistics are kept as of the last committed step and restored
when a step fails; and rank 0's are broadcast every step (what DDP's next forward would do anyway),
so every committed state is the same on every rank and any survivor can heal the others.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class BufferGuard:
    def __init__(self, model: nn.Module) -> None:
        self.buffers = [b for b in model.buffers() if b.numel()]
        self.committed = [b.detach().clone() for b in self.buffers]

    def sync_from_rank0(self) -> None:
        """One broadcast per dtype (ResNet-18 has 60 buffers in two dtypes); nothing without buffers."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for buffer in self.buffers:
            by_dtype.setdefault(buffer.dtype, []).append(buffer)
        for group in by_dtype.values():
            flat = _flatten_dense_tensors(group)
            dist.broadcast(flat, src=0)
            for buffer, synced in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
                buffer.copy_(synced)

    def commit(self) -> None:
        for kept, buffer in zip(self.committed, self.buffers, strict=True):
            kept.copy_(buffer)

    def roll_back(self) -> None:
        """Undo what an uncommitted step's forward did to the statistics."""
        with torch.no_grad():
            for kept, buffer in zip(self.committed, self.buffers, strict=True):
                buffer.copy_(kept)
