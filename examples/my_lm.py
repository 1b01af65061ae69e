"""Bring your own language model: a factory ampbench calls to build the network it trains under every arm.

Train it on text (from the project root; any folder of UTF-8 files works as prepare.raw_dir):

    .venv/bin/dvc exp run --temp -S train.task=language_model -S prepare.dataset=text \
        -S prepare.raw_dir=/usr/share/games/fortunes -S train.model=examples.my_lm:build \
        -S train.model_code=examples/my_lm.py

The contract: ``build(vocab_size, block_size, **train.model_args)`` returns a ``torch.nn.Module`` mapping (N, T)
token ids (T ≤ block_size) to (N, T, vocab_size) logits, or to an object with ``.logits`` (a Hugging Face causal
LM: see ``hf_gpt2.py``). This one is the smallest model that is still a language model: each position predicts
the next byte from the current one (a bigram MLP), so it trains in seconds on a CPU.
"""

from __future__ import annotations

import torch
from torch import nn


class BigramMLP(nn.Module):
    """(N, T) token ids → (N, T, vocab) logits from each token alone: embedding, one hidden layer, a head."""

    def __init__(self, vocab_size: int, width: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.hidden = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(self.embed(idx)))


def build(vocab_size: int, block_size: int, width: int = 64) -> nn.Module:
    return BigramMLP(vocab_size, width)  # block_size: any length works, the model looks at one token
