"""What a rank must hold to resume exactly: model, optimizer, scheduler, sampler, step.

Captured as a plain dict of tensors and numbers, so it serializes with torch.save and
loads with `torch.load(weights_only=True)`: a checkpoint can never run code.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from training.config import TrainConfig
from training.sampler import ResumableGlobalBatchSampler

FORMAT_VERSION = 1


@dataclass
class TrainState:
    """The live objects of one rank; `step` is the number of committed steps."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: ResumableGlobalBatchSampler
    step: int = 0
    has_state: bool = False
    """False until this process trained a step or restored state: fresh weights only."""

    def capture(self) -> dict[str, Any]:
        """A snapshot that shares storage with the live tensors (copy it before mutating)."""
        return {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "sampler": asdict(self.sampler.state(self.step)),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def restore(self, payload: dict[str, Any]) -> None:
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.step = int(payload["step"])
        self.has_state = True

    def digest(self) -> str:
        """Digest of the parameters and buffers (equal digests: identical models)."""
        return state_digest(self.model.state_dict())


def state_digest(model_state: dict[str, torch.Tensor]) -> str:
    """Digest of a model's state dict, names and bytes (what the ledger's `final` line records)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in model_state.items():
        h.update(name.encode())
        # reshape: a 0-dim buffer (BatchNorm's num_batches_tracked) cannot be viewed as bytes
        h.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


def build_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=config.lr_step, gamma=config.lr_gamma)


def serialize(payload: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def deserialize(data: bytes | memoryview) -> dict[str, Any]:
    """Never unpickles code: weights_only=True."""
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
