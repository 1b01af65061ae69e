"""The models a run can train: ``small_cnn`` (default), ``resnet18`` (CIFAR-style, torchvision blocks), ``mlp``.

Every model takes (N, C, H, W) float images and returns (N, classes) logits. ``train.width`` sets each model's
width (``None``: the model's default, ``DEFAULT_WIDTH``). Global pooling is a plain mean rather than
AdaptiveAvgPool2d, whose CUDA backward has no deterministic kernel.
"""

from __future__ import annotations

import torch
from torch import nn

# What train.width means per model, and its value when train.width is null.
DEFAULT_WIDTH = {"small_cnn": 16, "resnet18": 64, "mlp": 128}


class GlobalMeanPool(nn.Module):
    """(N, C, H, W) → (N, C): mean over the spatial dims; deterministic on every device."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def small_cnn(in_channels: int, num_classes: int, width: int) -> nn.Module:
    """Three conv blocks (``width``, 2×, 2× channels) and a linear head: quick on CPU for 8×8 digits, still
    conv-heavy enough to use tensor cores."""
    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
        nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True),
        GlobalMeanPool(),
        nn.Linear(2 * w, num_classes),
    )


def resnet18(in_channels: int, num_classes: int, width: int) -> nn.Module:
    """ResNet-18 for small images from torchvision's ``BasicBlock``: 3×3 stem with stride 1, no max-pool
    (CIFAR-style), four stages of two blocks with ``width``, 2×, 4×, 8× channels (64: the standard widths).
    Initialised as torchvision initialises its ResNets."""
    from torchvision.models.resnet import BasicBlock

    layers: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU(inplace=True)]
    inplanes = width
    for stage in range(4):
        planes, stride = width * 2**stage, 1 if stage == 0 else 2
        for block in range(2):
            down = None
            if block == 0 and (stride != 1 or inplanes != planes):
                down = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))
            layers.append(BasicBlock(inplanes, planes, stride if block == 0 else 1, down))
            inplanes = planes
    model = nn.Sequential(*layers, GlobalMeanPool(), nn.Linear(inplanes, num_classes))
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def mlp(in_features: int, num_classes: int, width: int) -> nn.Module:
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


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, width: int | None) -> nn.Module:
    """Build a model by name for inputs of ``input_shape`` = (C, H, W); ``width`` None: the model's default."""
    if name not in DEFAULT_WIDTH:
        raise ValueError(f"unknown model {name!r}")
    c, h, w = input_shape
    width = DEFAULT_WIDTH[name] if width is None else width
    if name == "small_cnn":
        return small_cnn(c, num_classes, width)
    if name == "resnet18":
        return resnet18(c, num_classes, width)
    return mlp(c * h * w, num_classes, width)
