"""A model with one layer that loses its signal in 16 bits without any inf or NaN, to show how ampbench ranks the
modules that need float32 when nothing overflows.

``coords`` is a Linear applied to features given around a large origin (as world coordinates are): it computes
``proj(x + origin) − proj(origin)``. In float32 that is ``proj``'s linear part of ``x`` and the model trains as if
the origin were not there; under bf16 autocast ``x + origin`` is rounded to bf16's spacing at the origin (32 at the
default 4096), the small differences between examples are gone, and the arm trains to chance with every value
finite: no overflow for the first-non-finite probe to name.

    .venv/bin/dvc exp run -S train.model=examples.offset_model:build -S train.model_code=examples/offset_model.py \
        -S 'train.precisions=[fp32,bf16]'
    .venv/bin/ampbench sensitivity bf16      # ranks coords first; its -S line keeps it in float32
    .venv/bin/ampbench fix bf16              # finds ["coords"] with trainings and confirms it on a fresh seed

Two more planted cases for ``ampbench fix``: ``build_two`` places two such layers in a row, so neither alone kept in
float32 is enough; in ``build_unfixable`` the model's own forward does the matmul on the offset features, outside
any submodule, so no set of modules helps. ``build_lm`` is the language-model form (a bigram model over text whose
embedding goes through ``coords``):

    .venv/bin/dvc exp run -S train.task=language_model -S prepare.dataset=text \
        -S prepare.raw_dir=/usr/share/games/fortunes -S train.model=examples.offset_model:build_lm \
        -S train.model_code=examples/offset_model.py -S 'train.precisions=[fp32,bf16]'
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


def build_two(input_shape: tuple[int, int, int], num_classes: int, hidden: int = 64,
              origin: float = 4096.0) -> nn.Module:
    """``build`` with a second ``coords`` layer after the first: both must be kept in float32."""
    c, h, w = input_shape
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(), fc1=nn.Linear(c * h * w, hidden), act1=nn.ReLU(), coords=Coordinates(hidden, origin),
        act2=nn.ReLU(), coords2=Coordinates(hidden, origin), act3=nn.ReLU(), head=nn.Linear(hidden, num_classes),
    ))


class Unfixable(nn.Module):
    """``build``'s model with the offset matmul in its own forward: no submodule holds it, so keeping modules in
    float32 cannot help."""

    def __init__(self, in_features: int, num_classes: int, hidden: int, origin: float):
        super().__init__()
        self.fc1, self.head = nn.Linear(in_features, hidden), nn.Linear(hidden, num_classes)
        self.weight = nn.Parameter(torch.randn(hidden, hidden) / hidden ** 0.5)
        self.origin = origin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        z = (h + self.origin) @ self.weight - torch.full_like(h, self.origin) @ self.weight
        return self.head(torch.relu(z))


def build_unfixable(input_shape: tuple[int, int, int], num_classes: int, hidden: int = 64,
                    origin: float = 4096.0) -> nn.Module:
    c, h, w = input_shape
    return Unfixable(c * h * w, num_classes, hidden, origin)


class OffsetBigram(nn.Module):
    """A language model with the planted layer: (N, T) token ids → embedding → ``coords`` → ReLU → (N, T, vocab)
    logits. Each position predicts the next byte from the current one, so fp32 learns the text's bigrams; in bf16
    the embedding's differences drown in the origin and the arm predicts the bytes' overall frequencies only."""

    def __init__(self, vocab_size: int, width: int, origin: float):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.coords = Coordinates(width, origin)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.coords(self.embed(idx))))


def build_lm(vocab_size: int, block_size: int, width: int = 32, origin: float = 4096.0) -> nn.Module:
    """The language-model form (``train.task: language_model``, ``prepare.dataset: text``): ``build(vocab_size,
    block_size, **train.model_args)`` as examples/my_lm.py's contract says."""
    return OffsetBigram(vocab_size, width, origin)
