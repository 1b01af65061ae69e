"""The models a run can train: ``small_cnn`` (default), ``resnet18`` (torchvision, adapted to small inputs), ``mlp``.

Every model takes (N, C, H, W) float images and returns (N, classes) logits. Global pooling is a plain mean
rather than AdaptiveAvgPool2d, whose CUDA backward has no deterministic kernel.
"""

from __future__ import annotations

import torch
from torch import nn


class GlobalMeanPool(nn.Module):
    """(N, C, H, W) → (N, C): mean over the spatial dims; deterministic on every device."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def small_cnn(in_channels: int, num_classes: int, width: int = 32) -> nn.Module:
    """Two conv blocks and a linear head: quick on CPU for 8×8 digits, still conv-heavy enough to use tensor cores."""
    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
        nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True),
        GlobalMeanPool(),
        nn.Linear(2 * w, num_classes),
    )


def resnet18(in_channels: int, num_classes: int, width: int = 64) -> nn.Module:
    """torchvision ResNet-18 for small images: 3×3 stem with stride 1, no max-pool (CIFAR-style)."""
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    model.avgpool = GlobalMeanPool()
    model.fc = nn.Linear(512, num_classes)  # GlobalMeanPool already flattens; torchvision's flatten is a no-op
    return model


def mlp(in_features: int, num_classes: int, width: int = 256) -> nn.Module:
    """Flatten → two hidden layers of ``width`` units → logits."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, width), nn.ReLU(inplace=True),
        nn.Linear(width, width), nn.ReLU(inplace=True),
        nn.Linear(width, num_classes),
    )


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``), so saved
    keys never carry their prefixes."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, width: int) -> nn.Module:
    """Build a model by name for inputs of ``input_shape`` = (C, H, W)."""
    c, h, w = input_shape
    if name == "small_cnn":
        return small_cnn(c, num_classes, width)
    if name == "resnet18":
        return resnet18(c, num_classes)
    if name == "mlp":
        return mlp(c * h * w, num_classes, max(width, 16) * 8)
    raise ValueError(f"unknown model {name!r}")
