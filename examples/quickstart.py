"""The smallest useful ftcoord job: DDP on a toy model, restarted in-process on faults.

    ftcoord-launch --embedded-store --job-id quickstart --nproc 2 -- python examples/quickstart.py

Kill one of the two processes (kill -9 PID) while it runs: the other restarts in-process,
the launcher brings the slot back from a warm standby, and training continues.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ftcoord import CallWrapper, Wrapper

STEPS = 300
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
progress = {"step": 0}  # survives in-process restarts: this process keeps its state


@Wrapper(min_world_size=1, heartbeat_timeout=2.0)
def train(call: CallWrapper) -> float:
    call.init_process_group()  # gloo on CPU, nccl on GPU, over the ftcoord store
    # A new generation may hold a freshly restarted member: everyone takes rank 0's state.
    # (The `training` package does this properly: the most advanced member heals the rest.)
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    held = torch.tensor([progress["step"]])
    dist.broadcast(held, src=0)
    progress["step"] = int(held)
    ddp = DDP(model)
    loss = torch.tensor(0.0)
    while progress["step"] < STEPS:
        call.check()  # leave at a step boundary when the generation was interrupted
        generator = torch.Generator().manual_seed(progress["step"] * 1000 + call.rank)
        x = torch.randn(32, 16, generator=generator)
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        progress["step"] += 1
        call.step = progress["step"]
        call.ping()
        if call.should_stop:  # SIGTERM: stop at this boundary (checkpoint here)
            break
    if call.rank == 0:
        print(f"generation {call.iteration}: step {progress['step']}, loss {loss.item():.4f}", flush=True)
    return loss.item()


if __name__ == "__main__":
    train()
