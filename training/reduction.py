"""Gradient reduction in a fixed order: the same bits at every world size, on every run.

gloo's (and NCCL's) all-reduce sums in an order that depends on the group's topology: with 3+ ranks a re-formed
group can add the same gradients in another order and end a few ulps away, and DDP's built-in reduction multiplies
by 1/W before the sum. Here every element is `((g_0 + g_1) + ... + g_{W-1}) / W`, in rank order, always: a faulted
run ends bit-identical to a fault-free run of the same world sizes, and the verifier's replay reduces with
`reduce_in_rank_order`, the same arithmetic. With 2 ranks the sum is one addition (`a + b` has the bits of `b + a`):
the hook is an asynchronous all-reduce and the division, overlapping backward as DDP's does. With 3+ ranks it is
bandwidth-optimal like a ring (`all_to_all`, each rank sums its chunk in rank order, `all_gather`), synchronously
inside backward: a collective issued from a future's callback could reach the ranks in different orders.
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations at runtime
# (`bucket: dist.GradBucket` must be the class, not a string).
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from training.config import GRAD_REDUCTIONS


def reduce_in_rank_order(parts: Sequence[torch.Tensor], world_size: int) -> torch.Tensor:
    """`((parts[0] + parts[1]) + ...) / world_size`, element-wise, in this exact order."""
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total.div_(world_size)


def reduce_like_ddp_allreduce(parts: Sequence[torch.Tensor], world_size: int) -> torch.Tensor:
    """What DDP's built-in reduction computes (scale by 1/W, then sum), with the sum in rank order:
    exact for up to 2 ranks, a few ulps from gloo's own order beyond."""
    scale = 1.0 / world_size
    total = parts[0] * scale
    for part in parts[1:]:
        total.add_(part * scale)
    return total


def _all_gather_into(output: torch.Tensor, chunk: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.14
    gather(output, chunk, group=group)


@dataclass
class HookState:
    """What the hook works with: the module's own group, and an optional callback between its two
    collectives (a fault-injection point: a rank that dies there leaves its peers mid-reduction)."""

    group: dist.ProcessGroup | None
    between_phases: Callable[[], None] | None = None


def fixed_order_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: reduce the bucket with `reduce_in_rank_order` (see module docstring)."""
    tensor = bucket.buffer()
    group = state.group
    world = dist.get_world_size(group)
    if world == 2:
        if state.between_phases is not None:
            state.between_phases()  # the peer may already wait in this bucket's all-reduce
        work = dist.all_reduce(tensor, group=group, async_op=True)
        return work.get_future().then(lambda done: done.value()[0].div_(world))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    if world > 2:
        n = tensor.numel()
        chunk = -(-n // world)
        padded = tensor.new_zeros(chunk * world)
        padded[:n].copy_(tensor)
        received = torch.empty_like(padded)
        dist.all_to_all_single(received, padded, group=group)  # row r: rank r's part of my chunk
        if state.between_phases is not None:
            state.between_phases()
        mine = reduce_in_rank_order(received.view(world, chunk).unbind(0), world)
        gathered = torch.empty_like(padded)
        _all_gather_into(gathered, mine, group)
        tensor.copy_(gathered[:n])
    future.set_result(tensor)
    return future


def install(ddp: DDP, reduction: str, between_phases: Callable[[], None] | None = None) -> None:
    """Use `reduction` ("fixed" or "allreduce") for this DDP module's gradients.

    Args:
        between_phases: called between the fixed-order reduction's two collectives (fault injection).
    """
    if reduction not in GRAD_REDUCTIONS:
        raise ValueError(f"gradient reduction {reduction!r}: choose one of {', '.join(GRAD_REDUCTIONS)}")
    if reduction == "fixed":
        # Bound to this module's own group: a stale module of a failed generation (a traceback may
        # still hold it) must fail on its dead group, never run collectives on the next generation's.
        ddp.register_comm_hook(HookState(ddp.process_group, between_phases), fixed_order_hook)
