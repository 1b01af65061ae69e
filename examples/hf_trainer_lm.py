"""A Hugging Face Trainer job as a training script writes one: a GPT-2-style causal LM initialised at random from a
config (no download) over scikit-learn's digits read as token sequences (each 8×8 image's 64 intensities, 0..16,
row by row: offline, always there), with ``TrainingArguments`` and a train and an eval dataset.

Measure it under every arm, unchanged (from the project root; docs/your-framework.md): ``build`` names both the
model and the data, since the Trainer holds both.

    .venv/bin/dvc exp run -S train.framework=hf_trainer -S train.task=language_model \\
        -S train.model=examples.hf_trainer_lm:build -S train.model_code=examples \\
        -S prepare.dataset=examples.hf_trainer_lm:build -S prepare.dataset_code=examples

The pipeline trains a Trainer of these parts with each arm's flags (``fp16``, ``bf16``, ``tf32``), its seeds as
``seed`` and ``data_seed``, and reads back what ran. ``build_pinned`` is the planted case: a model loaded in
bfloat16, so the fp32 arm would train in bfloat16; the train stage refuses it. ``build_offset`` is the planted case
of ``ampbench fix``: a module that bf16 rounds to nothing, found and kept in float32.
"""

from __future__ import annotations

import os
import tempfile

import torch
from examples.offset_model import Coordinates
from sklearn.datasets import load_digits
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class DigitSequences(torch.utils.data.Dataset):
    """Token sequences as a causal LM's examples: ``input_ids`` and ``labels`` alike (the model shifts them)."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def build(n_embd: int = 64, n_layer: int = 2, n_head: int = 4, epochs: int = 3, lr: float = 3e-3) -> Trainer:
    tokens = torch.tensor(load_digits().images, dtype=torch.long).flatten(1)
    order = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(0))
    train, test = DigitSequences(tokens[order[:1400]]), DigitSequences(tokens[order[1400:]])
    model = GPT2LMHeadModel(GPT2Config(vocab_size=17, n_positions=64, n_embd=n_embd, n_layer=n_layer,
                                       n_head=n_head))
    # The Trainer makes its output_dir when it is built; the pipeline gives each of its runs one of its own.
    out = os.path.join(tempfile.gettempdir(), "hf-trainer-lm")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=64, per_device_eval_batch_size=128,
                             num_train_epochs=epochs, learning_rate=lr, lr_scheduler_type="cosine",
                             report_to="none", logging_strategy="epoch", save_strategy="no")
    return Trainer(model=model, args=args, train_dataset=train, eval_dataset=test)


def build_pinned(**kwargs) -> Trainer:
    """The planted case: the model cast to bfloat16 after it was built (as ``torch_dtype=torch.bfloat16`` loads
    one), whatever the arm asks."""
    trainer = build(**kwargs)
    trainer.model.to(torch.bfloat16)
    return trainer


def build_offset(origin: float = 4096.0, **kwargs) -> Trainer:
    """The planted case of ``ampbench fix`` for a Trainer job: the final hidden states go through
    examples/offset_model.py's ``Coordinates`` (a Linear on them around an origin of 4096) before the last LayerNorm.
    Under bf16 autocast the origin drowns every difference between positions, every value finite, and the model
    predicts the digits' overall frequencies only; ``transformer.ln_f.0`` kept in float32 is the fix."""
    trainer = build(**kwargs)
    n_embd = trainer.model.config.n_embd
    trainer.model.transformer.ln_f = torch.nn.Sequential(Coordinates(n_embd, origin), trainer.model.transformer.ln_f)
    return trainer
