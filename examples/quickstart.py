"""The smallest useful ftcoord job: DDP on a toy model that survives the death of any rank.

    ftcoord-launch --embedded-store --job-id quickstart --nproc 2 -- python examples/quickstart.py --steps 3000

Kill either process (kill -9 PID) while it runs, rank 0's included: the survivor restarts in-process,
the launcher brings the slot back from a warm standby, and `call.heal` hands the survivor's model,
optimizer and step to the replacement. Training goes on from where it was, never from step 0.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ftcoord import CallWrapper, Wrapper
from ftcoord.errors import ConfigError
from ftcoord.wrapper.device import DEVICE_CHOICES, local_device

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--steps", type=int, default=300, help="global steps to train (default: %(default)s)")
parser.add_argument("--save", metavar="PATH", help="rank 0 writes the final model's state_dict here")
parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                    help="cuda: cuda:$LOCAL_RANK over NCCL; auto: cuda when torch sees a GPU, else cpu over gloo "
                         "(default: auto)")
args = parser.parse_args()
if args.steps < 1:
    parser.error(f"--steps {args.steps}: train at least one step")
try:
    device = local_device(args.device)  # one GPU per process: LOCAL_RANK past the GPU count is refused
except ConfigError as exc:
    parser.error(str(exc))

torch.manual_seed(0)  # every process starts from the same weights
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
progress = {"step": 0}  # lives in this process: it survives in-process restarts, not a kill


@Wrapper(min_world_size=1, heartbeat_timeout=2.0)
def train(call: CallWrapper) -> float:
    call.init_process_group(device=device)  # gloo on the CPU, NCCL on a GPU, over the ftcoord store
    # The member that trained furthest hands its state to the others (a replacement holds fresh weights).
    progress["step"] = call.heal({"model": model, "optimizer": optimizer}, step=progress["step"])
    print(f"generation {call.iteration}: rank {call.rank} of {call.world_size} (pid {os.getpid()}) starts at step "
          f"{progress['step']}", flush=True)
    if call.iteration == 1 and call.rank == 0:
        print(f"watch it: ftcoord status --store {os.environ.get('FTCOORD_STORE')} --job "
              f"{os.environ.get('FTCOORD_JOB_ID')} --watch", flush=True)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss = torch.tensor(0.0)
    while progress["step"] < args.steps:
        call.check()  # leave at a step boundary when the generation was interrupted
        step = progress["step"]
        generator = torch.Generator().manual_seed(step * 1000 + call.rank)  # this step's data on this rank
        x = torch.randn(32, 16, generator=generator).to(device)
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        call.wait_for_device()  # on a GPU: the all-reduce done (not aborted) before the step changes the weights
        optimizer.step()
        progress["step"] = call.step = step + 1  # committed: the next join reports it
        call.ping()
        if call.rank == 0 and progress["step"] % 100 == 0:
            print(f"step {progress['step']}: loss {loss.item():.4f}", flush=True)
        if call.should_stop:  # SIGTERM: stop at this boundary (checkpoint here)
            break
    if call.rank == 0 and args.save:
        torch.save({name: tensor.cpu() for name, tensor in model.state_dict().items()}, args.save)
    return loss.item()


if __name__ == "__main__":
    train()
