"""The built-in models: ``small_cnn`` (default), ``resnet18`` (CIFAR-style, torchvision blocks), ``mlp`` and
``vit_tiny`` (a small vision transformer). Other models come through ``factory.py``.

Every model takes (N, C, H, W) float images and returns (N, classes) logits. ``train.width`` sets each model's
width (``None``: the model's default, ``DEFAULT_WIDTH``). Global pooling is a plain mean rather than
AdaptiveAvgPool2d, whose CUDA backward has no deterministic kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# What train.width means per model, and its value when train.width is null.
DEFAULT_WIDTH = {"small_cnn": 16, "resnet18": 64, "mlp": 128, "vit_tiny": 64}


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


class Attention(nn.Module):
    """Multi-head self-attention written out: q·kᵀ/√d → softmax → ·v. Under autocast the two matmuls run in 16 bits
    and the softmax in float32 (autocast's own lists), as in most transformer code; the attention logits are
    where fp16 overflows first."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"vit_tiny: width {dim} is not divisible by heads={heads}")
        self.heads, self.scale = heads, 1 / math.sqrt(dim // heads)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, T, D) → (N, T, D)
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # 3 × (N, H, T, d)
        weights = F.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)  # (N, H, T, T)
        return self.proj((weights @ v).transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViTTiny(nn.Module):
    """A small vision transformer: non-overlapping patches → linear embedding + learned positions → ``depth``
    pre-norm blocks → LayerNorm → mean over tokens → linear head."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, width: int, patch_size: int = 2,
                 depth: int = 4, heads: int = 4, mlp_ratio: float = 2.0):
        super().__init__()
        c, h, w = input_shape
        if h % patch_size or w % patch_size:
            raise ValueError(f"vit_tiny: the {h}×{w} input does not split into {patch_size}×{patch_size} patches "
                             "(set train.model_args: {patch_size: …})")
        self.embed = nn.Conv2d(c, width, patch_size, stride=patch_size)  # one linear map per patch
        self.pos = nn.Parameter(torch.zeros(1, (h // patch_size) * (w // patch_size), width))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*(Block(width, heads, mlp_ratio) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) → (N, classes)
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos  # (N, T, D)
        return self.head(self.norm(self.blocks(tokens)).mean(dim=1))


def vit_tiny(input_shape: tuple[int, int, int], num_classes: int, width: int, **args) -> nn.Module:
    """``ViTTiny`` with embedding width ``width``; ``args``: patch_size (2), depth (4), heads (4), mlp_ratio (2)."""
    return ViTTiny(input_shape, num_classes, width, **args)


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


def build_builtin(name: str, input_shape: tuple[int, int, int], num_classes: int, width: int | None,
                  **args) -> nn.Module:
    """Build a built-in model for inputs of ``input_shape`` = (C, H, W); ``width`` None: the model's default.
    ``args`` go to the model (only vit_tiny takes any)."""
    if name not in DEFAULT_WIDTH:
        raise ValueError(f"unknown model {name!r}")
    c, h, w = input_shape
    width = DEFAULT_WIDTH[name] if width is None else width
    if name == "vit_tiny":
        return vit_tiny(input_shape, num_classes, width, **args)
    if args:
        raise TypeError(f"{name} takes no train.model_args (got {sorted(args)}); its size is train.width")
    if name == "small_cnn":
        return small_cnn(c, num_classes, width)
    if name == "resnet18":
        return resnet18(c, num_classes, width)
    return mlp(c * h * w, num_classes, width)
