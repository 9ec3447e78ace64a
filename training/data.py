"""Datasets that return (x, y, sample_id): what makes data progress observable.

Never downloads: CIFAR and ImageFolder read a local folder and fail clearly without one.
"""

from __future__ import annotations

import hashlib

import torch
import torchvision
from torch.utils.data import Dataset
from torchvision import transforms

from training.config import DatasetSpec
from training.errors import DatasetNotFound
from training.sampler import derive_seed


class SyntheticDataset(Dataset):
    """A deterministic classification task made from a seed: no files, any size.

    Inputs are Gaussian feature vectors; labels come from a fixed random linear teacher, so
    a model can actually learn (loss curves mean something).
    """

    def __init__(self, size: int = 8192, features: int = 32, classes: int = 10, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(derive_seed(seed, "synthetic"))
        self.x = torch.randn(size, features, generator=generator)
        teacher = torch.randn(features, classes, generator=generator)
        self.y = (self.x @ teacher).argmax(dim=1)
        self.classes = classes

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        return self.x[index], int(self.y[index]), index


class WithIds(Dataset):
    """Wraps a torchvision dataset so each item also carries its index."""

    def __init__(self, inner: Dataset, classes: int) -> None:
        self.inner = inner
        self.classes = classes

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        x, y = self.inner[index]
        return x, int(y), index


def make_dataset(spec: str, seed: int = 0) -> Dataset:
    """Build a dataset from a CLI spec (see training.config.DatasetSpec).

    synthetic[:N] | fakedata[:N] | fakedata100[:N] | cifar10:PATH | cifar100:PATH | imagefolder:PATH
    """
    parsed = DatasetSpec.parse(spec)
    to_tensor = transforms.ToTensor()
    if parsed.name == "synthetic":
        return SyntheticDataset(size=parsed.size, seed=seed)
    if parsed.name in ("fakedata", "fakedata100"):
        classes = 100 if parsed.name == "fakedata100" else 10
        fake = torchvision.datasets.FakeData(size=parsed.size, image_size=(3, 32, 32), num_classes=classes,
                                             transform=to_tensor, random_offset=seed)
        return WithIds(fake, classes)
    folder = parsed.require_folder()
    if parsed.name in ("cifar10", "cifar100"):
        cls = torchvision.datasets.CIFAR10 if parsed.name == "cifar10" else torchvision.datasets.CIFAR100
        try:
            inner = cls(str(folder), train=True, download=False, transform=to_tensor)
        except RuntimeError as exc:
            name = parsed.name.upper()
            raise DatasetNotFound(
                f"no {name} data in {str(folder)!r} ({exc}); it must hold the extracted "
                f"python-version archive (e.g. cifar-10-batches-py/)"
            ) from exc
        return WithIds(inner, 10 if parsed.name == "cifar10" else 100)
    tf = transforms.Compose([transforms.Resize((32, 32)), to_tensor])
    inner = torchvision.datasets.ImageFolder(str(folder), transform=tf)
    return WithIds(inner, len(inner.classes))


def collate(dataset: Dataset, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fetch the samples of a shard, in order (no DataLoader: the sampler is the order).

    Returns (x, y, consumed): `consumed` are the ids that came back *with the samples* (each item
    carries its own id), not the ids that were asked for: it is what the ledger records as the
    evidence of what the model trained on.
    """
    items = [dataset[int(i)] for i in ids]
    xs = torch.stack([item[0] for item in items])
    ys = torch.tensor([item[1] for item in items], dtype=torch.int64)
    consumed = torch.tensor([int(item[2]) for item in items], dtype=torch.int64)
    return xs, ys, consumed


def batch_hash(x: torch.Tensor, y: torch.Tensor) -> str:
    """A short digest of the bytes a step fed the model (inputs and labels), for the ledger."""
    h = hashlib.blake2b(digest_size=8)
    for tensor in (x, y):
        h.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
