"""In-memory healing: at every new generation the most advanced member shares its state.

Members exchange (step, digest). The source is the member with the highest step (lowest
rank on ties); every member that is behind or differs receives the source's state over
the generation's process group: survivors and freshly restarted processes alike. Only
when no member holds any state does rank 0 read a checkpoint (flash image or disk).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from training.checkpoint.base import Loaded
from training.state import TrainState, deserialize, serialize

NO_STATE = -1


@dataclass
class HealReport:
    source: int
    """Rank whose state everyone now holds."""
    step: int
    receivers: list[int] = field(default_factory=list)
    loaded_from: str | None = None
    """Set when no member held state and a checkpoint was read."""
    bytes: int = 0
    seconds: float = 0.0


def _exchange(state: TrainState, world_size: int) -> list[tuple[int, str]]:
    mine = (state.step, state.digest()) if state.has_state else (NO_STATE, "")
    everyone: list[tuple[int, str]] = [(NO_STATE, "")] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def heal(state: TrainState, rank: int, world_size: int,
         load_checkpoint: Callable[[], Loaded | None]) -> HealReport:
    """Make every member hold the most advanced state; returns what was done."""
    started = time.perf_counter()
    everyone = _exchange(state, world_size)
    loaded_from = None
    if all(step == NO_STATE for step, _ in everyone):
        if rank == 0:
            loaded = load_checkpoint()
            if loaded is not None:
                state.restore(loaded.payload)
                loaded_from = loaded.source
        state.has_state = True  # fresh weights are identical on every rank (same seed)
        everyone = _exchange(state, world_size)
    source = max(range(world_size), key=lambda r: (everyone[r][0], -r))
    receivers = [r for r in range(world_size) if everyone[r] != everyone[source]]
    sent = 0
    if receivers:
        if rank == source:
            data = serialize(state.capture())
            sent = len(data)
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            for r in receivers:
                dist.send(torch.tensor([len(data)], dtype=torch.int64), dst=r)
                dist.send(payload, dst=r)
        elif rank in receivers:
            size = torch.zeros(1, dtype=torch.int64)
            dist.recv(size, src=source)
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
            dist.recv(payload, src=source)
            state.restore(deserialize(payload.numpy().tobytes()))
            sent = int(size.item())
    return HealReport(source, everyone[source][0], receivers, loaded_from, sent, time.perf_counter() - started)
