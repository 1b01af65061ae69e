"""A LightningDataModule read as Lightning would run it (``prepare_data``, ``setup``, its loaders): its splits as
the batches the module sees, stacked. The prepare stage stores them (the evaluation pairs the arms on that test
split); the train stage reads the test loader again per seed to check that it did not move. No Lightning import:
anything shaped like a datamodule will do."""

from __future__ import annotations

from typing import Any

import torch

from ampbench.config.user_code import first_line
from ampbench.errors import DataError

SPLITS = ("train", "val", "test")


def is_datamodule(obj: Any) -> bool:
    """A LightningDataModule, or anything shaped like one (its loaders and setup), without importing Lightning."""
    return all(callable(getattr(obj, a, None)) for a in ("setup", "train_dataloader", "test_dataloader"))


def datamodule_splits(dm: Any, where: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A datamodule's train, val and test splits as the batches its loaders give, stacked: what the module sees.
    Called as a Trainer would (``prepare_data``, then ``setup`` for fitting and for testing)."""
    if callable(getattr(dm, "prepare_data", None)):
        dm.prepare_data()
    try:
        dm.setup("fit")
        dm.setup("test")
    except Exception as exc:
        raise DataError(f"{where}: setup failed ({type(exc).__name__}: {first_line(exc)})") from None
    if not callable(getattr(dm, "val_dataloader", None)):
        raise DataError(f"{where}: has no val_dataloader; the pipeline validates every epoch on it")
    return {split: loader_tensors(getattr(dm, f"{split}_dataloader"), f"{where} {split}_dataloader")
            for split in SPLITS}


def loader_tensors(make_loader: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ``(inputs, targets)`` batch of the loader ``make_loader()`` returns, concatenated."""
    try:
        loader = make_loader()
        xs, ys = [], []
        for batch in loader:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2
                    and all(isinstance(t, torch.Tensor) for t in batch)):
                raise DataError(f"{where}: a batch is a {type(batch).__name__}; the pipeline needs (inputs, "
                                "targets) tensor pairs to pair the arms' outcomes example by example")
            xs.append(batch[0].detach().cpu())
            ys.append(batch[1].detach().cpu())
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{where}: {type(exc).__name__}: {first_line(exc)}") from None
    if not xs:
        raise DataError(f"{where}: gave no batch")
    return torch.cat(xs), torch.cat(ys).long()
