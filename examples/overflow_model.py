"""A model with one planted float16 overflow, to show how ampbench finds the layer and how to keep it in float32.

``gain`` multiplies its input by ``gain`` (default 10⁵) before a LayerNorm: the kind of bug a missing 1/√d or an
unnormalised sum makes. In float32 the LayerNorm undoes the gain and the model trains as if it were not there; in
float16 the gain's output passes 65504, becomes inf, the LayerNorm makes NaN of it and every fp16 step fails.

    .venv/bin/dvc exp run --temp -S train.model=examples.overflow_model:build \
        -S train.model_code=examples/overflow_model.py -S 'train.precisions=[fp32,fp16,bf16]'

The fp16 arm diverges and the report names ``gain``; the fix it suggests, ``-S 'train.fp32_modules=["gain"]'``,
runs that module outside autocast on float32 inputs (README: Finding the layer).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class Gain(nn.Module):
    """Multiply by a constant: harmless in float32 before a normalisation, an overflow in float16."""

    def __init__(self, gain: float):
        super().__init__()
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def build(input_shape: tuple[int, int, int], num_classes: int, hidden: int = 64, gain: float = 1e5) -> nn.Module:
    """Flatten, two linear layers with GELU, the planted ``gain`` before a LayerNorm, a linear head."""
    c, h, w = input_shape
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(), fc1=nn.Linear(c * h * w, hidden), act1=nn.GELU(), fc2=nn.Linear(hidden, hidden),
        gain=Gain(gain), norm=nn.LayerNorm(hidden), act2=nn.GELU(), head=nn.Linear(hidden, num_classes),
    ))
