"""Bring your own model: a factory that ampbench calls to build the network it trains under every precision arm.

Train it (from the project root):

    .venv/bin/dvc exp run -S train.model=examples.my_model:build -S train.model_code=examples/my_model.py \
        -S '++train.model_args={channels: 24, dropout: 0.1}'

The contract: ``build(input_shape, num_classes, **train.model_args)`` gets the prepared data's (C, H, W) and class
count and returns a ``torch.nn.Module`` mapping (N, C, H, W) float images to (N, num_classes) logits.
``train.model_code`` names this file so DVC retrains when it changes.
"""

from __future__ import annotations

import torch
from torch import nn


class MeanPool(nn.Module):
    """(N, C, H, W) → (N, C). A plain mean: AdaptiveAvgPool2d's CUDA backward is not deterministic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def build(input_shape: tuple[int, int, int], num_classes: int, channels: int = 32, dropout: float = 0.0) -> nn.Module:
    """Two conv blocks with GroupNorm and GELU (no BatchNorm), mean pooling, dropout, a linear head."""
    c = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(c, channels, 3, padding=1), nn.GroupNorm(8, channels), nn.GELU(),
        nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.GroupNorm(8, 2 * channels), nn.GELU(),
        MeanPool(), nn.Dropout(dropout), nn.Linear(2 * channels, num_classes),
    )
