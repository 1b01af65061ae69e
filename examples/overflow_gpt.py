"""The planted-overflow example's transformer twin: a small GPT whose attention queries are scaled by ``gain``, so
in float16 they pass 65504 and the attention turns into inf/NaN — where fp16 overflows in real transformers
(large attention logits). In float32 and bfloat16 (float32's range) it trains.

    .venv/bin/dvc exp run --temp -S train.task=language_model -S prepare.dataset=text \
        -S prepare.raw_dir=/usr/share/games/fortunes -S train.model=examples.overflow_gpt:build \
        -S train.model_code=examples/overflow_gpt.py

The fp16 arm diverges and the report names ``blocks.0.attn``, with the rerun that keeps every attention in
float32 (``-S 'train.fp32_modules=["blocks.*.attn"]'``), after which it trains without a skipped step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ampbench import GPT, CausalSelfAttention


class HotAttention(CausalSelfAttention):
    """Causal self-attention with its queries × ``gain`` (scaled back inside the scores' softmax temperature)."""

    def __init__(self, width: int, heads: int, dropout: float, gain: float):
        super().__init__(width, heads, dropout)
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q * self.gain  # the planted overflow: beyond 65504 in float16
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=(c // self.heads) ** -0.5 / self.gain)
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


def build(vocab_size: int, block_size: int, width: int = 32, depth: int = 2, heads: int = 2,
          gain: float = 1e6) -> GPT:
    model = GPT(vocab_size, block_size, width, depth, heads)
    for block in model.blocks:
        hot = HotAttention(width, heads, 0.0, gain)
        hot.load_state_dict(block.attn.state_dict())
        block.attn = hot
    return model
