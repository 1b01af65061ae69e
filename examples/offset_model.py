"""A model with one layer that loses its signal in 16 bits without any inf or NaN, to show how ampbench ranks the
modules that need float32 when nothing overflows.

``coords`` is a Linear applied to features given around a large origin (as world coordinates are): it computes
``proj(x + origin) − proj(origin)``. In float32 that is ``proj``'s linear part of ``x`` and the model trains as if
the origin were not there; under bf16 autocast ``x + origin`` is rounded to bf16's spacing at the origin (32 at the
default 4096), the small differences between examples are gone, and the arm trains to chance with every value
finite: no overflow for the first-non-finite probe to name.

    .venv/bin/dvc exp run -S train.model=examples.offset_model:build -S train.model_code=examples/offset_model.py \
        -S 'train.precisions=[fp32,bf16]'
    .venv/bin/ampbench sensitivity bf16      # ranks coords.proj first; its -S line keeps it in float32
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class Coordinates(nn.Module):
    """A Linear on features placed around ``origin``: ``proj(x + origin) − proj(origin)``."""

    def __init__(self, width: int, origin: float):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.origin = origin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + self.origin) - self.proj(torch.full_like(x, self.origin))


def build(input_shape: tuple[int, int, int], num_classes: int, hidden: int = 64, origin: float = 4096.0) -> nn.Module:
    """Flatten, a linear layer with ReLU, the planted ``coords`` with ReLU, a linear head."""
    c, h, w = input_shape
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(), fc1=nn.Linear(c * h * w, hidden), act1=nn.ReLU(), coords=Coordinates(hidden, origin),
        act2=nn.ReLU(), head=nn.Linear(hidden, num_classes),
    ))
