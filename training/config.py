"""The training configuration, its defaults in one place, and the hash that guards resume."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ftcoord.wrapper.device import DEVICE_CHOICES
from training.errors import DatasetNotFound, TrainingConfigError

STRATEGIES = ("none", "blocking", "overlapped", "flash")
MODELS = ("mlp", "small-cnn", "resnet18", "big-mlp")
IMAGE_MODELS = ("small-cnn", "resnet18")
"""Models that need image inputs (C, H, W): every dataset but `synthetic` (vectors of 32) gives them."""
GRAD_REDUCTIONS = ("fixed", "allreduce")
"""fixed: gradients summed in rank order (training.reduction; the default); allreduce: DDP's built-in
(exact only up to 2 ranks)."""

DATASET_FORMS = "synthetic[:N], fakedata[:N], fakedata100[:N], cifar10:PATH, cifar100:PATH or imagefolder:PATH"
SIZED_DATASETS = {"synthetic": 8192, "fakedata": 2048, "fakedata100": 2048}
"""Generated datasets and their default sizes (`NAME:N` picks another)."""
FOLDER_DATASETS = {"cifar10": "CIFAR10", "cifar100": "CIFAR100", "imagefolder": "ImageFolder"}
"""Datasets read from a local folder (never downloaded)."""


@dataclass(frozen=True)
class DatasetSpec:
    """A `--dataset` value, parsed without importing torch: a generated dataset and its size, or a
    dataset read from a local folder."""

    name: str
    size: int = 0
    folder: Path | None = None

    @classmethod
    def parse(cls, spec: str) -> DatasetSpec:
        name, _, arg = spec.partition(":")
        if name in SIZED_DATASETS:
            if not arg:
                return cls(name, SIZED_DATASETS[name])
            if not arg.isdigit() or int(arg) < 1:
                raise TrainingConfigError(f"dataset {spec!r}: the size after ':' must be a whole number >= 1 "
                                          f"(e.g. {name}:{SIZED_DATASETS[name]})")
            return cls(name, int(arg))
        if name in FOLDER_DATASETS:
            return cls(name, folder=Path(arg).expanduser())
        raise TrainingConfigError(f"unknown dataset {spec!r}; use {DATASET_FORMS}")

    def require_folder(self) -> Path:
        """The dataset's local folder; DatasetNotFound when it does not exist."""
        assert self.folder is not None, f"{self.name} is generated, it has no folder"
        if not self.folder.is_dir():
            raise DatasetNotFound(
                f"{FOLDER_DATASETS[self.name]} folder {str(self.folder)!r} does not exist; point to a local copy "
                f"(this tool never downloads at run time) or use --dataset synthetic / fakedata"
            )
        return self.folder

    def check(self) -> None:
        """Everything that can be known before loading: a folder dataset's folder exists."""
        if self.folder is not None:
            self.require_folder()


def check_dataset_holds_a_batch(dataset_size: int, global_batch: int) -> None:
    """An epoch needs at least one global batch."""
    if dataset_size < global_batch:
        raise TrainingConfigError(
            f"the dataset has {dataset_size} samples, fewer than global_batch={global_batch}; "
            f"use a larger dataset or a smaller --global-batch"
        )


# Fields that change the training trajectory: a checkpoint written under other values of
# these must not be resumed silently.
TRAJECTORY_FIELDS = ("model", "dataset", "global_batch", "seed", "lr", "optimizer", "momentum",
                     "weight_decay", "lr_step", "lr_gamma")


@dataclass(frozen=True)
class TrainConfig:
    job_id: str = "train"
    steps: int = 200
    global_batch: int = 32
    model: str = "mlp"
    dataset: str = "synthetic"
    seed: int = 1337
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_step: int = 100
    lr_gamma: float = 0.5
    ckpt_dir: str | None = None
    ckpt_strategy: str = "blocking"
    ckpt_every: int = 50
    ckpt_keep: int = 3
    ckpt_max_failures: int = 3
    """Failed saves in a row (full disk, read-only, I/O error) before the job stops with an error."""
    ckpt_start_over: bool = False
    """Train from step 0 when checkpoints exist but none can be loaded (they are kept, set aside)."""
    warm_start: bool = False
    log_dir: str | None = None
    step_time: float = 0.0
    """Extra seconds per step (to shape a run like the ECRL report's ~100 ms steps)."""
    sample_time: float = 0.0
    """Extra seconds per sample of this rank's shard: emulated compute that grows when fewer ranks
    share the global batch, as real compute does (what slows the ECRL report's elastic 2 -> 1 run)."""
    min_world_size: int = 1
    grad_reduction: str = "fixed"
    """How DDP reduces gradients: "fixed" (rank order, bit-identical at every world size) or
    "allreduce" (DDP's built-in). Not a trajectory field: like the world size, it may change on a resume."""
    device: str = "auto"
    """Where the rank trains: "cpu", "cuda" (cuda:$LOCAL_RANK, over NCCL) or "auto" (cuda when torch sees a GPU).
    Not a trajectory field: a checkpoint moves between devices (its tensors are loaded onto the rank's)."""
    hooks: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise TrainingConfigError(f"--steps {self.steps} must be >= 1")
        if self.global_batch < 1:
            raise TrainingConfigError(f"--global-batch {self.global_batch} must be >= 1")
        if self.ckpt_strategy not in STRATEGIES:
            raise TrainingConfigError(f"--ckpt-strategy {self.ckpt_strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.ckpt_strategy != "none" and self.ckpt_dir is None:
            raise TrainingConfigError(f"--ckpt-strategy {self.ckpt_strategy} needs --ckpt-dir "
                                      f"(or use --ckpt-strategy none)")
        if self.ckpt_every < 1:
            raise TrainingConfigError(f"--ckpt-every {self.ckpt_every} must be >= 1")
        if self.ckpt_keep < 1:
            raise TrainingConfigError(f"--ckpt-keep {self.ckpt_keep} must be >= 1")
        if self.ckpt_max_failures < 1:
            raise TrainingConfigError(f"--ckpt-max-failures {self.ckpt_max_failures} must be >= 1")
        if self.step_time < 0 or self.sample_time < 0:
            raise TrainingConfigError(f"--step-time {self.step_time} / --sample-time {self.sample_time}: "
                                      f"must be >= 0 seconds")
        if self.grad_reduction not in GRAD_REDUCTIONS:
            raise TrainingConfigError(f"--grad-reduction {self.grad_reduction!r}: choose one of "
                                      f"{', '.join(GRAD_REDUCTIONS)}")
        if self.device not in DEVICE_CHOICES:
            raise TrainingConfigError(f"--device {self.device!r}: choose one of {', '.join(DEVICE_CHOICES)}")
        if self.optimizer not in ("sgd", "adam"):
            raise TrainingConfigError(f"--optimizer {self.optimizer!r}: choose sgd or adam")
        dataset = DatasetSpec.parse(self.dataset)
        if self.model in IMAGE_MODELS and dataset.name == "synthetic":
            # Before any rank imports torch (training.models says so too, once every rank built its dataset).
            raise TrainingConfigError(f"--model {self.model} needs image inputs (C, H, W), and --dataset "
                                      f"{self.dataset} gives vectors of 32; use --dataset fakedata[:N], "
                                      f"cifar10:PATH or imagefolder:PATH, or --model mlp")

    def trajectory(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in TRAJECTORY_FIELDS}

    def config_hash(self) -> str:
        """Digest of what determines the trajectory (not steps, paths or checkpoint cadence)."""
        text = json.dumps(self.trajectory(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
