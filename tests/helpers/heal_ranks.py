"""One rank of a `ftcoord.wrapper.heal` scenario (a real process, forked by tests/helpers/forker.py).

    main([scenario, rank, world, store, prefix, out]) -> 0; writes out (JSON): what the rank saw.

Every rank builds its own objects (the scenario says who is ahead, who is fresh, who differs), heals
over a real gloo group, and reports the heal, its own digests and whether its tensors stayed in place.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ftcoord import StoreAddress, connect
from ftcoord.wrapper.heal import HealReport, StateMismatch, heal
from ftcoord.wrapper.state_tree import digest, flatten

DATA = torch.Generator().manual_seed(99)
BATCH = torch.randn(8, 6, generator=DATA)


class Position:
    """A user's stateful object with no tensors at all (a data loader's position, say)."""

    def __init__(self, epoch: int = 0, cursor: int = 0) -> None:
        self.epoch, self.cursor, self.seen = epoch, cursor, [0]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seen": list(self.seen), "shape": (2, "x", 0.5)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor, self.seen = state["epoch"], state["cursor"], list(state["seen"])


class Unsendable(Position):
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "owner": Position()}  # an instance of a class: weights_only refuses it


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 512), torch.nn.ReLU(), torch.nn.Linear(512, 600),
                               torch.nn.BatchNorm1d(600))  # 600x512 floats: sent on its own, in place


def train(net: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        net(BATCH).pow(2).mean().backward()
        optimizer.step()


def adam(net: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(net.parameters(), lr=1e-3)


def objects_for(scenario: str, rank: int) -> tuple[dict[str, Any], int]:
    """The objects and step of one rank in one scenario."""
    if scenario in ("in_place", "adam"):
        net = model(1 if rank == 0 else 2)
        optimizer = adam(net) if scenario == "adam" else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        if rank == 0:
            train(net, optimizer, 3)
            for _ in range(3):
                scheduler.step()
        counter = torch.tensor([7.0 if rank == 0 else 0.0, 1.0])
        return {"model": net, "optimizer": optimizer, "scheduler": scheduler, "counter": counter}, 3 if rank == 0 else 0
    if scenario == "matching":  # ranks 0 and 1 agree at step 5; rank 2 is fresh
        return {"model": model(1 if rank < 2 else 2)}, 5 if rank < 2 else 0
    if scenario == "tied_differs":  # all at step 5; ranks 1 and 3 hold other weights
        return {"model": model(1 if rank % 2 == 0 else 3)}, 5
    if scenario == "stateful":
        return {"position": Position(3, 41) if rank == 1 else Position()}, 41 if rank == 1 else 0
    if scenario == "names":
        objects: dict[str, Any] = {"model": model(1)}
        if rank == 1:
            objects["ema"] = torch.zeros(3)
        return objects, rank
    if scenario == "nobody":
        return {"model": model(rank)}, -1
    if scenario == "unsendable":
        return {"position": Unsendable(1, 2) if rank == 0 else Position()}, 2 if rank == 0 else 0
    raise ValueError(f"unknown scenario {scenario!r}")


def _pointers(objects: dict[str, Any]) -> list[int]:
    found = []
    for obj in objects.values():
        if isinstance(obj, torch.Tensor):
            found.append(obj.data_ptr())
        elif isinstance(obj, torch.nn.Module):
            found += [t.data_ptr() for t in obj.state_dict().values()]
    return found


def _digests(objects: dict[str, Any]) -> dict[str, str]:
    return {name: digest(flatten({name: obj})) for name, obj in objects.items()}


def _report(report: HealReport) -> dict[str, Any]:
    return {"source": report.source, "step": report.step, "receivers": list(report.receivers), "bytes": report.bytes}


def main(argv: list[str]) -> int:
    scenario, rank, world, store, prefix, out = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5]
    torch.set_num_threads(1)
    client = dist.PrefixStore(prefix, connect(StoreAddress.parse(store)))
    dist.init_process_group("gloo", store=client, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    objects, step = objects_for(scenario, rank)
    before = _pointers(objects)
    result: dict[str, Any] = {"rank": rank}
    try:
        result["first"] = _report(heal(objects, step))
    except StateMismatch as exc:
        result["error"] = str(exc)
    else:
        result["again"] = _report(heal(objects, result["first"]["step"]))  # nothing left to do
        result["in_place"] = _pointers(objects) == before
        result["devices"] = sorted({t.device.type for t in objects.get("model", torch.nn.Linear(1, 1)).parameters()})
        if scenario == "adam":  # one more identical step: equal only if the optimizer state was healed
            net, optimizer = objects["model"], objects["optimizer"]
            train(net, optimizer, 1)
            result["lr"] = objects["scheduler"].get_last_lr()
        if scenario in ("stateful", "unsendable"):
            result["position"] = objects["position"].state_dict()
        result["digests"] = _digests(objects)
        if "counter" in objects:
            result["counter"] = objects["counter"].tolist()
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
