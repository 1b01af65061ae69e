"""A Hugging Face causal LM through the same factory path: GPT-2's architecture built from a config (no download,
no pretrained weights), sized for a CPU. Needs ``transformers`` (not a dependency of ampbench: ``pip install
transformers``).

    .venv/bin/dvc exp run --temp -S train.task=language_model -S prepare.dataset=text \
        -S prepare.raw_dir=/usr/share/games/fortunes -S train.model=examples.hf_gpt2:build \
        -S train.model_code=examples/hf_gpt2.py

Its forward returns an object whose ``.logits`` are (N, T, vocab_size): the language-model task reads them there.
"""

from __future__ import annotations


def build(vocab_size: int, block_size: int, n_embd: int = 64, n_layer: int = 2, n_head: int = 2):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=0, eos_token_id=0)  # byte 0 (NUL) never occurs in text
    return GPT2LMHeadModel(config)
