"""What the training loop and the evaluation read: a split of stored values and the normalisation that turns them
into model inputs, and the three splits with their facts (``Prepared``). Torch only: no file access here.

Images stay 8-bit where the source is (uint8 N×C×H×W) and are normalised on the fly (``Norm``), a batch at a time,
on the device that trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch


@dataclass(frozen=True)
class Norm:
    """How stored values become model inputs: ``(x · scale − mean) / std`` per channel."""

    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        a, b = _affine(self, x.device)
        return torch.addcmul(b, x.float(), a)  # x·a + b in one pass, float32


@lru_cache(maxsize=32)
def _affine(norm: Norm, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached per device: building the two small tensors each batch would copy host→device every step.
    std = torch.tensor(norm.std, dtype=torch.float64)
    a = (norm.scale / std).float().view(1, -1, 1, 1).to(device)
    b = (-torch.tensor(norm.mean, dtype=torch.float64) / std).float().view(1, -1, 1, 1).to(device)
    return a, b


@dataclass(frozen=True)
class Split:
    """One split: ``x`` as stored (uint8 or float32, N×C×H×W), ``y`` int64 (N,), and the ``norm`` that turns x
    into model inputs (None: x already is the model's input, e.g. tensors a test or the bench built)."""

    x: torch.Tensor
    y: torch.Tensor
    norm: Norm | None = None

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device, **kwargs: Any) -> Split:
        return Split(self.x.to(device, **kwargs), self.y.to(device), self.norm)

    def inputs(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """Model inputs (float32) of ``x`` (default: the whole split), stored values normalised."""
        x = self.x if x is None else x
        return x if self.norm is None else self.norm(x)


@dataclass(frozen=True)
class Prepared:
    """The three splits and the facts about them (``meta``: dataset, shape, classes, normalisation, checksum)."""

    train: Split
    val: Split
    test: Split
    meta: dict[str, Any]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.meta["input_shape"])

    @property
    def num_classes(self) -> int:
        return len(self.meta["classes"])

