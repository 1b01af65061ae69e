"""A Lightning job as Lightning's docs write one: a LightningDataModule over scikit-learn's digits (8×8 images,
offline) and a LightningModule classifier with its own ``training_step`` and ``configure_optimizers``.

Measure it under every arm, unchanged (from the project root; docs/your-framework.md):

    .venv/bin/dvc exp run -S train.framework=lightning \\
        -S train.model=examples.lightning_classifier:DigitsClassifier -S train.model_code=examples \\
        -S prepare.dataset=examples.lightning_classifier:DigitsData -S prepare.dataset_code=examples

The pipeline needs nothing added: ``forward`` returns the logits, which is how the evaluation scores each test
example. ``PinnedToFloat32`` is the planted case: a module whose forward turns autocast off, so every arm would
train in float32 under a 16-bit label; the train stage refuses it with one line naming this file's line.
``OffsetClassifier`` is the planted case of ``ampbench fix`` (docs/which-part-needs-float32.md): bf16 trains it to
chance with every value finite until ``net.coords`` is kept in float32.
"""

from __future__ import annotations

from collections import OrderedDict

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from examples.offset_model import Coordinates
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


class DigitsData(L.LightningDataModule):
    """scikit-learn's 1,797 digits as 1×8×8 float images in [0, 1]: a fixed 70/10/20 split."""

    def __init__(self, batch_size: int = 64, split_seed: int = 0):
        super().__init__()
        self.batch_size = batch_size
        self.split_seed = split_seed

    def setup(self, stage: str | None = None) -> None:
        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
        data = TensorDataset(x, torch.tensor(digits.target))
        self.train, self.val, self.test = random_split(
            data, [0.7, 0.1, 0.2], generator=torch.Generator().manual_seed(self.split_seed))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=256)


class DigitsClassifier(L.LightningModule):
    """A small convolutional classifier trained with AdamW and a cosine schedule."""

    def __init__(self, channels: int = 16, lr: float = 3e-3, epochs: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * channels * 16, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.hparams.epochs)]


class PinnedToFloat32(DigitsClassifier):
    """The planted case: autocast turned off inside forward, so no arm computes in 16 bits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self.net(x.float())


class OffsetClassifier(DigitsClassifier):
    """The planted case of ``ampbench fix`` for a Lightning job: the classifier's hidden features go through
    examples/offset_model.py's ``Coordinates`` (a Linear on features around an origin of 4096), which bf16 autocast
    rounds to nothing, every value finite. ``ampbench fix bf16`` finds ``net.coords`` to keep in float32."""

    def __init__(self, channels: int = 16, lr: float = 3e-3, epochs: int = 8, origin: float = 4096.0):
        super().__init__(channels, lr, epochs)
        self.net = nn.Sequential(OrderedDict(
            conv=nn.Conv2d(1, channels, 3, padding=1), act=nn.ReLU(), pool=nn.MaxPool2d(2), flatten=nn.Flatten(),
            fc=nn.Linear(channels * 16, 64), act1=nn.ReLU(), coords=Coordinates(64, origin), act2=nn.ReLU(),
            head=nn.Linear(64, 10)))
