"""Which device a rank trains on: `--device auto|cpu|cuda`, checked against the GPUs this process can see.

A rank's GPU is `cuda:$LOCAL_RANK` (as under torchrun), and one GPU serves one rank: NCCL does not let two ranks of
one communicator share a device. So a node runs at most as many processes (workers and hot spares, which hold a GPU
of their own while they wait) as it has GPUs; a rank past that is refused with a ConfigError before it trains,
never placed on a GPU another rank uses. `auto` is cuda when torch sees a GPU, else cpu; it never mixes the two.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ftcoord.env import LOCAL_RANK_ENV
from ftcoord.errors import ConfigError

if TYPE_CHECKING:
    import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")
"""What --device accepts (this module imports torch only in local_device: a command line is checked before)."""


def pick_device(requested: str, local_rank: int, gpus: int) -> str:
    """The device a rank uses, as torch spells it ("cpu" or "cuda:N"): a pure function of what it is told.

    Args:
        requested: "auto", "cpu" or "cuda".
        local_rank: the process's index on its node (LOCAL_RANK; hot spares come after the workers).
        gpus: how many CUDA devices the process sees (torch.cuda.device_count(); 0 without CUDA).

    Raises:
        ConfigError: an unknown choice; cuda without a GPU; a local rank with no GPU of its own.
    """
    if requested not in DEVICE_CHOICES:
        raise ConfigError(f"--device {requested!r}: choose one of {', '.join(DEVICE_CHOICES)}")
    if requested == "cpu" or (requested == "auto" and gpus == 0):
        return "cpu"
    if gpus == 0:
        raise ConfigError("--device cuda: this machine has no CUDA device torch can use (torch.cuda.device_count() "
                          "is 0); use --device cpu, or auto, which trains on the CPU here")
    if local_rank >= gpus:
        raise ConfigError(f"--device {requested}: this process is local rank {local_rank} on its node, which has "
                          f"{gpus} GPU(s) visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r})"
                          f"; one GPU serves one rank, so run at most {gpus} process(es) per node, workers and "
                          f"--spares together, or use --device cpu")
    return f"cuda:{local_rank}"


def local_device(requested: str) -> torch.device:
    """This process's device for `requested`: pick_device with $LOCAL_RANK and the GPUs torch sees.

    Args:
        requested: "auto", "cpu" or "cuda".

    Raises:
        ConfigError: as pick_device.
    """
    import torch

    local_rank = int(os.environ.get(LOCAL_RANK_ENV, "0"))
    gpus = torch.cuda.device_count() if requested != "cpu" else 0
    return torch.device(pick_device(requested, local_rank, gpus))
