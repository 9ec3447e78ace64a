"""The model check's reference: the run's own schedule, replayed in one process without faults.

Real processes cannot give a fault-free run of the same world sizes without re-forming at every size change,
through the very resume paths a check must not trust. So the replay computes what W data-parallel ranks compute, with
each step's world size, gradient reduction and intra-op thread count as the run committed it: per rank, forward and
backward on its shard (chaos.proof.expected) from the committed buffers, seeded with derive_seed(seed, "step", s, r);
rank 0's buffers kept (training.buffers); the gradients reduced with the run's arithmetic (training.reduction); then
the optimizer and scheduler step. With the fixed-order reduction this is bit-identical to real DDP at any world size,
and `chaos.report.reference` checks that for every reference it builds. It shares with the run only the model,
optimizer and dataset constructors and the reduction arithmetic, never the loop, the heal or the checkpoint code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from chaos.proof.expected import DataExpectation
from training.config import TrainConfig
from training.data import collate
from training.models import build_model
from training.reduction import reduce_in_rank_order, reduce_like_ddp_allreduce
from training.sampler import ResumableGlobalBatchSampler, derive_seed
from training.state import TrainState, build_optimizer, build_scheduler

REDUCERS = {"fixed": reduce_in_rank_order, "allreduce": reduce_like_ddp_allreduce}


@dataclass(frozen=True)
class StepPlan:
    """How the run committed one step."""

    world_size: int
    reduction: str = "fixed"
    threads: tuple[int, ...] = ()
    """Intra-op threads of each rank (empty: this process's setting)."""
    device: str = "cpu"
    """The device type the ranks trained on ("cpu" or "cuda"): the replay computes on the same one."""


@dataclass
class ReplayResult:
    digest: str
    """Same digest as `TrainState.digest()` of the run's ranks."""
    state: dict[str, torch.Tensor]
    losses: list[list[float]] = field(default_factory=list)
    """Per step, each rank's loss."""
    seconds: float = 0.0


def replay_device(plan: list[StepPlan]) -> torch.device:
    """Where a run's replay computes: on the device type the run trained on (the arithmetic differs between them).

    Raises:
        ValueError: the run trained on a GPU and this process sees none; or on both (a checkpoint moved between a
            CPU and a GPU run): no replay is faithful to that.
    """
    devices = {p.device for p in plan}
    if len(devices) > 1:
        raise ValueError(f"the run trained on {' and '.join(sorted(devices))} by turns; its replay cannot follow it "
                         f"(verify runs that keep one device type)")
    if devices != {"cuda"}:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("the run trained on cuda, and its replay must compute on a GPU too; this process sees none "
                         "(verify it on a machine with a GPU)")
    return torch.device("cuda", 0)


def replay(config: TrainConfig, plan: list[StepPlan], expect: DataExpectation | None = None) -> ReplayResult:
    """Train `len(plan)` steps as the plan says (see the module docstring)."""
    started = time.perf_counter()
    threads_before = torch.get_num_threads()
    expect = expect or DataExpectation(config.dataset, config.global_batch, config.seed)
    dataset = expect.dataset
    device = replay_device(plan)
    model = build_model(config.model, tuple(dataset[0][0].shape), dataset.classes, config.seed)  # type: ignore[attr-defined]
    model.to(device)
    optimizer = build_optimizer(config, model)
    state = TrainState(model, optimizer, build_scheduler(config, optimizer),
                       ResumableGlobalBatchSampler(expect.size, config.global_batch, config.seed))
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b for b in model.buffers() if b.numel()]
    model.train()
    losses: list[list[float]] = []
    try:
        for step, how in enumerate(plan):
            committed = [b.detach().clone() for b in buffers]
            grads: list[list[torch.Tensor]] = []
            step_losses: list[float] = []
            after_rank0: list[torch.Tensor] = []
            for rank in range(how.world_size):
                if how.threads:
                    torch.set_num_threads(how.threads[rank])
                with torch.no_grad():
                    for buffer, kept in zip(buffers, committed, strict=True):
                        buffer.copy_(kept)
                torch.manual_seed(derive_seed(config.seed, "step", step, rank))
                ids = expect.shard(step, rank, how.world_size)
                if ids is None:
                    raise ValueError(f"step {step}: world size {how.world_size} cannot split global batch "
                                     f"{config.global_batch}")
                x, y, _ = collate(dataset, torch.tensor(ids, dtype=torch.int64))
                for p in params:
                    p.grad = None
                loss = F.cross_entropy(model(x.to(device)), y.to(device))
                loss.backward()
                grads.append([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
                step_losses.append(loss.item())
                if rank == 0:
                    after_rank0 = [b.detach().clone() for b in buffers]
            with torch.no_grad():
                for buffer, value in zip(buffers, after_rank0, strict=True):
                    buffer.copy_(value)
            reduce = REDUCERS[how.reduction]
            for i, p in enumerate(params):
                p.grad = reduce([g[i] for g in grads], how.world_size)
            optimizer.step()
            state.scheduler.step()
            losses.append(step_losses)
    finally:
        torch.set_num_threads(threads_before)
    state.step = len(plan)
    return ReplayResult(state.digest(), {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, losses,
                        time.perf_counter() - started)
