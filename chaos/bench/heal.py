"""`chaos bench --only heal`: healing ~100M parameters + Adam from one member to one and to two fresh ones.

Side by side in the same processes, alternating which goes first each repetition: `old`, the baseline (the whole
state pickled with `torch.save` on the source, sent point-to-point to each receiver in turn, unpickled there);
`new`, `ftcoord.wrapper.heal.heal` (tensor-wise, in place, one transfer for all receivers); `raw`, one `broadcast` of
a flat buffer as large as the state into fresh memory (the floor: a fresh process must first-touch its pages); and
`raw warm`, the same into memory touched before (no target: the wire alone, so the page-fault share shows). Each
time runs from a barrier to the last member done. Receivers are fresh before every repetition (a new model from
another seed, an Adam with no state), as a replacement is. One member runs as
`python -m chaos.bench.heal --rank R --world W --store H:P --prefix P --reps N --out F`.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from chaos.bench.recovery import summary
from chaos.machine_env import machine_env
from chaos.own_code import start_worker
from ftcoord.wrapper.heal import heal
from ftcoord.wrapper.state_tree import digest, flatten

METHODS = ("old", "new", "raw", "raw_warm")


def _state(rank: int) -> tuple[dict[str, Any], int]:
    """The source (rank 0) trained a step with Adam; the others are fresh processes."""
    from training.models import build_model

    model = build_model("big-mlp", (32,), 10, 0 if rank == 0 else 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if rank == 0:
        model(torch.randn(2, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": optimizer}, 1 if rank == 0 else 0


def _digest(objects: dict[str, Any]) -> str:
    return digest(flatten(objects))


def old_heal(objects: dict[str, Any], step: int) -> None:
    """The baseline heal: exchange (step, model digest), pickle everything, send to each receiver in turn."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = (step, _digest({"model": objects["model"]}))
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    source = max(range(world), key=lambda r: (everyone[r][0], -r))
    receivers = [r for r in range(world) if everyone[r] != everyone[source]]
    if rank == source:
        buffer = io.BytesIO()
        torch.save({name: obj.state_dict() for name, obj in objects.items()}, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        for r in receivers:
            dist.send(torch.tensor([payload.numel()], dtype=torch.int64), dst=r)
            dist.send(payload, dst=r)
    elif rank in receivers:
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, src=source)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(payload, src=source)
        state = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True, map_location="cpu")
        for name, obj in objects.items():
            obj.load_state_dict(state[name])


def _state_bytes(objects: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in flatten(objects).tensors)


def member_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.bench.heal")
    for name in ("--rank", "--world", "--reps"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--store", "--prefix", "--out"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    host, port = args.store.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore(args.prefix, store), rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=600))
    objects, step = _state(args.rank)
    source_state = _digest(objects) if args.rank == 0 else None
    nbytes = torch.tensor([_state_bytes(objects) if args.rank == 0 else 0])
    dist.broadcast(nbytes, src=0)
    warm = torch.zeros(int(nbytes.item()), dtype=torch.uint8)

    def raw() -> None:
        fresh = warm if args.rank == 0 else torch.empty(int(nbytes.item()), dtype=torch.uint8)
        dist.broadcast(fresh, src=0)

    runs: dict[str, Callable[[], None]] = {"old": lambda: old_heal(objects, step), "new": lambda: heal(objects, step),
                                           "raw": raw, "raw_warm": lambda: dist.broadcast(warm, src=0)}
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for rep in range(args.reps):
        order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
        for method in order:
            if args.rank != 0:  # a fresh replacement again
                objects["optimizer"] = torch.optim.Adam(objects["model"].parameters(), lr=1e-3)
                torch.nn.init.zeros_(next(objects["model"].parameters()))
            dist.barrier()
            started = time.perf_counter()
            runs[method]()
            elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[method].append(float(elapsed.item()))
            if not method.startswith("raw"):  # each heal must have given the receivers the source's exact state
                digests: list[Any] = [None] * args.world
                dist.all_gather_object(digests, _digest(objects))
                if len(set(digests)) != 1:
                    raise RuntimeError(f"the {method} heal left members with different state")
    dist.destroy_process_group()
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"times": times, "bytes": int(nbytes.item()), "digest": source_state}))
    return 0


def bench_heal(store: str, out: Path, reps: int) -> dict[str, Any]:
    """Old vs new vs raw for one and two receivers; ratios of the medians."""
    results: dict[str, Any] = {}
    for receivers in (1, 2):
        world = receivers + 1
        prefix, file = f"bench-heal-{uuid.uuid4().hex[:6]}", out / f"heal-{receivers}.json"
        env = machine_env(OMP_NUM_THREADS="1")
        procs = [start_worker("chaos.bench.heal", ["--rank", str(r), "--world", str(world), "--store", store,
                                                   "--prefix", prefix, "--reps", str(reps), "--out", str(file)],
                              env=env, stderr=subprocess.PIPE, text=True) for r in range(world)]
        for p in procs:
            _, err = p.communicate(timeout=1800)
            if p.returncode:
                raise RuntimeError(f"a heal benchmark member failed (exit {p.returncode}): {err[-2000:]}")
        data = json.loads(file.read_text())
        t = data["times"]
        medians = {m: statistics.median(t[m]) for m in METHODS}
        results[f"{receivers} receiver{'s' if receivers > 1 else ''}"] = {
            "state_gib": round(data["bytes"] / 2**30, 3),
            **{f"{m}_s": summary(t[m], 3) for m in METHODS},
            "new_over_old": round(medians["new"] / medians["old"], 3),
            "new_over_raw": round(medians["new"] / medians["raw"], 3),
            "new_over_raw_warm": round(medians["new"] / medians["raw_warm"], 3)}
    return results


TARGETS = {"new_over_old": ("<= 0.5", 0.5), "new_over_raw": ("<= 1.5", 1.5)}


def heal_rows(results: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """(measure, ratio, target, met) for each case and each target."""
    return [(f"{case}: {key.replace('_', ' ')}", r[key], target, r[key] <= limit)
            for case, r in results.items() for key, (target, limit) in TARGETS.items()]


def _cell(s: dict[str, Any]) -> str:
    return f"{s['median']} ({s['min']}-{s['max']})"


def markdown(results: dict[str, Any], reps: int) -> str:
    gib = next(iter(results.values()))["state_gib"]
    lines = [f"Healing big-mlp + Adam ({gib} GiB) from one member to fresh ones, gloo on loopback; seconds, "
             f"median (min-max) of {reps} repetitions, methods alternating:", "",
             "| receivers | old (pickled) | new (call.heal) | raw broadcast, fresh memory | raw broadcast, warm |",
             "|---|---|---|---|---|"]
    lines += [f"| {case} | {_cell(r['old_s'])} | {_cell(r['new_s'])} | {_cell(r['raw_s'])} | {_cell(r['raw_warm_s'])} |"
              for case, r in results.items()]
    lines += ["", "| measure | ratio | target | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {target} | {'yes' if met else 'no'} |"
              for name, value, target, met in heal_rows(results)]
    lines += [f"| {case}: new over raw warm | {r['new_over_raw_warm']} | - (page faults included) | - |"
              for case, r in results.items()]
    return "\n".join(lines) + "\n"


def run_heal_bench(out: Path, reps: int) -> int:
    """`chaos bench --only heal`: writes heal.json and heal.md; exit 0 when every target is met."""
    from ftcoord import StoreServer

    out.mkdir(parents=True, exist_ok=True)
    print("measuring: healing (old pickled path vs call.heal vs a raw broadcast) ...", file=sys.stderr, flush=True)
    server = StoreServer("127.0.0.1", 0)
    try:
        results = bench_heal(server.address, out, reps)
    finally:
        server.close()
    (out / "heal.json").write_text(json.dumps(results, indent=1))
    (out / "heal.md").write_text(markdown(results, reps))
    print(markdown(results, reps))
    print(f"wrote {out / 'heal.json'}")
    return 0 if all(met for *_, met in heal_rows(results)) else 1


if __name__ == "__main__":
    sys.exit(member_main(sys.argv[1:]))
