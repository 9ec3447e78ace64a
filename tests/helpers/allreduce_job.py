"""A tiny training job under @Wrapper for tests: one all-reduce per step.

Each step all-reduces (step + 1) * (rank + 1); the sum is known in closed form, so every
result after every restart can be checked. Faults are planted by slot and step, once
each (a marker file remembers they happened): raise, exit like a crash, hang the
training thread while the heartbeat goes on; stop a slot's replacement before it registers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ftcoord import CallWrapper, Wrapper, connect, job_store, log
from ftcoord import env as ftcoord_env
from ftcoord.protocol import keys
from ftcoord.store.client import read_int


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="directory for events")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--raise-at", action="append", default=[], help="SLOT:STEP")
    p.add_argument("--exit-at", action="append", default=[], help="SLOT:STEP (os._exit(137))")
    p.add_argument("--stall-at", action="append", default=[], help="SLOT:STEP (training thread stuck)")
    p.add_argument("--always-raise-slot", type=int, default=None)
    p.add_argument("--stop-replacement-of", type=int, default=None,
                   help="SLOT: the first replacement of that slot SIGSTOPs itself before it registers")
    p.add_argument("--min-world-size", type=int, default=1)
    p.add_argument("--heartbeat-interval", type=float, default=0.1)
    p.add_argument("--heartbeat-timeout", type=float, default=1.0)
    p.add_argument("--join-timeout", type=float, default=0.5)
    p.add_argument("--barrier-timeout", type=float, default=20.0)
    p.add_argument("--progress-timeout", type=float, default=None)
    p.add_argument("--pg-timeout", type=float, default=30.0)
    p.add_argument("--max-restarts", type=int, default=32)
    p.add_argument("--hold-ddp", action="store_true",
                   help="hold the group and a DDP module as users do: in the function's locals and in an object "
                        "that outlives the generation")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slot = int(os.environ.get("FTCOORD_SLOT", "0"))
    events = out / f"events-slot{slot}-{os.getpid()}.jsonl"

    def emit(kind: str, **facts: object) -> None:
        with events.open("a") as f:
            f.write(json.dumps({"kind": kind, "pid": os.getpid(), "slot": slot, "mono": time.monotonic(),
                                "standby": os.environ.get("FTCOORD_STANDBY") == "1", **facts}) + "\n")

    def once(kind: str, spec: list[str], step: int) -> bool:
        if f"{slot}:{step}" not in spec:
            return False
        marker = out / f"done-{kind}-{slot}-{step}"
        if marker.exists():
            return False
        marker.write_text("1")
        emit("fault", fault=kind, step=step)
        return True

    torchrun_names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    emit("started", env={name: os.environ.get(name) for name in torchrun_names})
    state = {"step": 0}
    kept: list[object] = []
    log.configure(out / f"log-slot{slot}-{os.getpid()}.jsonl")

    @Wrapper(min_world_size=args.min_world_size, heartbeat_interval=args.heartbeat_interval,
             heartbeat_timeout=args.heartbeat_timeout, join_timeout=args.join_timeout,
             barrier_timeout=args.barrier_timeout, progress_timeout=args.progress_timeout,
             pg_timeout=args.pg_timeout, max_restarts=args.max_restarts)
    def train(call: CallWrapper) -> str:
        group = call.init_process_group("gloo")
        ddp = DDP(torch.nn.Linear(2, 2)) if args.hold_ddp else None
        if ddp is not None:
            kept.append((group, ddp))  # a long-lived object of the user's: no frame clearing drops these
        held = torch.tensor([state["step"]], dtype=torch.int64)
        dist.all_reduce(held, op=dist.ReduceOp.MAX)  # heal: continue from the furthest member
        state["step"] = int(held.item())
        emit("generation", generation=call.iteration, rank=call.rank, world_size=call.world_size,
             members=list(call.members), start_step=state["step"], restarts=call.restarts,
             rendezvous_key_bytes=len(call.store.get(keys.gloo_rendezvous(call.iteration, call.rank))))
        while state["step"] < args.steps:
            call.check()
            step = state["step"]
            if args.always_raise_slot == slot:
                raise RuntimeError(f"planted failure in slot {slot}")
            if once("raise", args.raise_at, step):
                raise RuntimeError(f"planted exception at step {step}")
            if once("exit", args.exit_at, step):
                os._exit(137)
            if once("stall", args.stall_at, step):
                time.sleep(3600)  # the heartbeat thread lives on; progress stops
            value = torch.tensor([float((step + 1) * (call.rank + 1))])
            dist.all_reduce(value)
            w = call.world_size
            emit("step", step=step, generation=call.iteration, rank=call.rank, world_size=w,
                 value=value.item(), expected=float((step + 1) * w * (w + 1) // 2))
            state["step"] = step + 1
            call.step = step + 1
            call.ping()
            if call.should_stop:
                emit("stopped", step=step)
                return "stopped"
            time.sleep(args.step_time)
        return "done"

    if args.stop_replacement_of == slot:
        _stop_if_first_replacement(slot, out, emit)
    result = train()
    emit("exit", result=result)
    return 0


def _stop_if_first_replacement(slot: int, out: Path, emit: Callable[..., None]) -> None:
    """A replacement (an incarnation of the slot registered before) stops itself, once, before it registers: a real
    SIGSTOP, as a job controller or a debugger would stop it while it starts."""
    store = job_store(connect(os.environ[ftcoord_env.STORE_ENV]), os.environ[ftcoord_env.JOB_ID_ENV])
    registered = read_int(store, keys.incarnation(slot))
    marker = out / f"done-stop-replacement-{slot}"
    if registered >= 1 and not marker.exists():
        marker.write_text("1")
        emit("fault", fault="stop-before-register", registered=registered)
        os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    sys.exit(main())
