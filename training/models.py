"""Models the loop can train, built identically on every rank from the seed."""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from training.config import IMAGE_MODELS, MODELS  # noqa: F401 - MODELS re-exported: the names build_model knows
from training.errors import TrainingConfigError


def build_model(name: str, input_shape: tuple[int, ...], classes: int, seed: int) -> nn.Module:
    """mlp (small, for tests), small-cnn (a tiny convnet with BatchNorm: buffers, for tests),
    resnet18 (torchvision, CIFAR stem for 32x32 images), big-mlp (~101M params)."""
    torch.manual_seed(seed)
    features = 1
    for dim in input_shape:
        features *= dim
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                             nn.Linear(64, classes))
    if name == "big-mlp":
        width = 4096
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(features, width), nn.ReLU()]
        for _ in range(6):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, classes))
    if name in IMAGE_MODELS and len(input_shape) != 3:
        raise TrainingConfigError(f"{name} needs image inputs (C, H, W), not shape {input_shape}; "
                                  f"use --dataset fakedata or cifar10:PATH")
    if name == "small-cnn":
        return nn.Sequential(nn.Conv2d(input_shape[0], 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(8 * 16, classes))
    if name == "resnet18":
        model = torchvision.models.resnet18(num_classes=classes)
        model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()  # type: ignore[assignment]
        return model
    raise TrainingConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
