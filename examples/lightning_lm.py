"""A small transformer language model as a Lightning job: a LightningDataModule that reads scikit-learn's digits as
token sequences (each 8×8 image row by row, 64 intensities from 0 to 16: offline, always there) and a
LightningModule with a causal transformer, its own ``training_step`` and ``configure_optimizers``.

Measure it under every arm, unchanged (from the project root; docs/your-framework.md):

    .venv/bin/dvc exp run -S train.framework=lightning -S train.task=language_model \\
        -S train.model=examples.lightning_lm:DigitsLM -S train.model_code=examples \\
        -S prepare.dataset=examples.lightning_lm:DigitsTokens -S prepare.dataset_code=examples

The verdict is the language model's: loss per token, paired sequence by sequence. ``forward`` returns the logits
(batch × tokens × vocabulary), which is how the evaluation scores each test sequence.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

VOCAB = 17  # pixel intensities 0..16


class DigitsTokens(L.LightningDataModule):
    """Each digit image as 64 tokens; a sequence's inputs are its first 63 tokens, its targets the next ones."""

    def __init__(self, batch_size: int = 64):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        tokens = torch.tensor(load_digits().images, dtype=torch.long).flatten(1)
        data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
        self.train, self.val, self.test = random_split(
            data, [0.7, 0.1, 0.2], generator=torch.Generator().manual_seed(0))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=256)


class DigitsLM(L.LightningModule):
    """Token and position embeddings, causal transformer encoder layers, a linear head."""

    def __init__(self, width: int = 64, depth: int = 2, heads: int = 4, lr: float = 3e-3, context: int = 63):
        super().__init__()
        self.save_hyperparameters()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tokens(x) + self.positions(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        return self.head(self.blocks(h, mask=mask, is_causal=True))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).flatten(0, 1), y.flatten()))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
