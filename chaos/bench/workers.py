"""Processes the benchmark starts: a bare-DDP or @Wrapper step-time probe, and an advance probe.

    python -m chaos.bench.workers steps --mode bare|wrapped [--reduction fixed|allreduce] [--device cpu|cuda] \
        --rank R --world 2 ...
    python -m chaos.bench.workers advance --slot S --world N --store H:P --job J --rounds R --out F
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from training import reduction

CPU = torch.device("cpu")
STEP_MODEL = (512, 1024, 10)  # a 3-layer MLP like the anchors'
BATCH = 128


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    i, h, o = STEP_MODEL
    return torch.nn.Sequential(torch.nn.Linear(i, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                               torch.nn.Linear(h, o))


def _train(ddp: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, boundary=None,  # noqa: ANN001
           device: torch.device = CPU) -> list[float]:
    x, y = torch.randn(BATCH, STEP_MODEL[0]).to(device), torch.randint(0, STEP_MODEL[2], (BATCH,)).to(device)
    times = []
    for _ in range(steps):
        if boundary is not None:
            boundary()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if device.type == "cuda":  # the step's kernels done: a GPU step is timed to its end in both modes
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return times


def steps_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    device = torch.device("cuda", args.rank) if args.device == "cuda" else CPU  # one GPU per rank
    model = _model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    device_ids = [device.index] if device.type == "cuda" else None
    if args.mode == "bare":
        host, port = args.store.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                store=dist.PrefixStore(f"bare-{args.job}", store), rank=args.rank,
                                world_size=args.world, device_id=device if device.type == "cuda" else None)
        ddp = DDP(model, device_ids=device_ids)
        reduction.install(ddp, args.reduction)
        times = _train(ddp, opt, args.steps, device=device)
        dist.destroy_process_group()
    else:
        from ftcoord import CallWrapper, Wrapper

        @Wrapper(store=args.store, job_id=args.job, slot=args.rank, world_size=args.world)
        def run(call: CallWrapper) -> list[float]:
            call.init_process_group(device=device)

            def boundary() -> None:  # what a training loop does at every step
                call.check()
                call.ping()

            ddp = DDP(model, device_ids=device_ids)
            reduction.install(ddp, args.reduction)
            return _train(ddp, opt, args.steps, boundary, device)

        times = run()
    with open(args.out, "w") as f:
        json.dump({"times": times}, f)


def advance_main(args: argparse.Namespace) -> None:
    """Join generation after generation; record when each record arrived (monotonic)."""
    from ftcoord import JobFinished, Participant, QuorumPolicy

    participant = Participant(args.store, args.job, args.slot, QuorumPolicy(args.world)).start()
    arrived = []
    try:
        while True:
            try:
                record = participant.join(0)
            except JobFinished:
                break
            arrived.append({"generation": record.generation, "mono": time.monotonic()})
            if len(arrived) > args.rounds:
                break
            participant.monitor.wait(60)
    finally:
        participant.close()
        with open(args.out, "w") as f:
            json.dump(arrived, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("steps")
    s.add_argument("--mode", choices=("bare", "wrapped"), required=True)
    s.add_argument("--rank", type=int, required=True)
    s.add_argument("--world", type=int, default=2)
    s.add_argument("--steps", type=int, default=300)
    s.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: cuda:RANK over NCCL")
    s.add_argument("--reduction", choices=("allreduce", "fixed"), default="allreduce",
                   help="DDP's built-in all-reduce, or training.reduction's fixed-order hook")
    for p in (s, a := sub.add_parser("advance")):
        p.add_argument("--store", required=True)
        p.add_argument("--job", required=True)
        p.add_argument("--out", required=True)
    a.add_argument("--slot", type=int, required=True)
    a.add_argument("--world", type=int, required=True)
    a.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    steps_main(args) if args.what == "steps" else advance_main(args)


if __name__ == "__main__":
    sys.exit(main())
