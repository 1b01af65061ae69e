"""The built-in language model ``gpt``: a decoder-only transformer over token ids, sized like nanoGPT's CPU recipe.

Token and position embeddings, ``depth`` pre-LayerNorm blocks (causal self-attention through
``torch.nn.functional.scaled_dot_product_attention``, then a 4× GELU MLP), a final LayerNorm and a head that shares
the token embedding's weights. It maps (N, T) token ids to (N, T, vocab_size) logits for T ≤ ``block_size``.
Module names follow the layout people patch in 16-bit training: ``blocks.<i>.attn``, ``blocks.<i>.mlp``, so
``train.fp32_modules: ["blocks.*.attn"]`` keeps every attention in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_WIDTH = 128  # train.width when null: the embedding width


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; the score matrix and its softmax run inside SDPA (where fp16 overflows)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (N, T, C) → (N, heads, T, C / heads)
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


class MLP(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(width), CausalSelfAttention(width, heads, dropout)
        self.ln2, self.mlp = nn.LayerNorm(width), MLP(width, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """(N, T) token ids → (N, T, vocab_size) logits."""

    def __init__(self, vocab_size: int, block_size: int, width: int = DEFAULT_WIDTH, depth: int = 4, heads: int = 4,
                 dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, width)
        self.pos = nn.Embedding(block_size, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied: one matrix embeds tokens and scores them
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence of {t} tokens is longer than the model's {self.block_size} positions")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def build(vocab_size: int, block_size: int, width: int | None = None, **args) -> GPT:
    """The ``gpt`` built-in: ``train.width`` is its embedding width (null: 128); ``train.model_args`` may set
    ``depth`` (4), ``heads`` (4) and ``dropout`` (0.0)."""
    unknown = set(args) - {"depth", "heads", "dropout"}
    if unknown:
        raise TypeError(f"gpt takes depth, heads and dropout in train.model_args (got {sorted(unknown)})")
    return GPT(vocab_size, block_size, DEFAULT_WIDTH if width is None else width, **args)
