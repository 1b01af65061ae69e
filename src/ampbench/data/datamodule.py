"""A LightningDataModule read as Lightning would run it (``prepare_data``, ``setup``, its loaders), or a Hugging Face
Trainer's dataloaders (``trainer_splits``): its splits as the batches the model sees, stacked. The prepare stage
stores them (the evaluation pairs the arms on that test split); the train stage reads the test split again per
seed to check that it did not move. No Lightning or transformers import: anything shaped like them will do."""

from __future__ import annotations

from typing import Any

import torch

from ampbench.config.user_code import first_line
from ampbench.errors import DataError

SPLITS = ("train", "val", "test")


def is_datamodule(obj: Any) -> bool:
    """A LightningDataModule, or anything shaped like one (its loaders and setup), without importing Lightning."""
    return all(callable(getattr(obj, a, None)) for a in ("setup", "train_dataloader", "test_dataloader"))


def is_hf_trainer(obj: Any) -> bool:
    """A ``transformers.Trainer`` or a subclass of it (a user's own Trainer class), without importing transformers."""
    return any(c.__name__ == "Trainer" and c.__module__.startswith("transformers.") for c in type(obj).__mro__)


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


def trainer_splits(t: Any, where: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A Hugging Face Trainer's train and eval data as its dataloaders give them, as (inputs, targets): a causal LM's
    (tokens, next tokens), a classifier's (inputs, labels). The eval data is both val and test (the Trainer has one
    eval set)."""
    train = trainer_tensors(t.get_train_dataloader(), where, "train")
    test = trainer_tensors(t.get_eval_dataloader(), where, "eval")
    return {"train": train, "val": test, "test": test}


def trainer_tensors(loader: Any, where: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every batch (a dict) of a Trainer's dataloader as (inputs, targets) tensors."""
    xs, ys = [], []
    for batch in loader:
        labels = batch.get("labels") if isinstance(batch, dict) else None
        inputs = next((batch[k] for k in ("input_ids", "pixel_values") if k in batch), None) if labels is not None \
            else None
        if inputs is None:
            raise DataError(f"{where}: a {split} batch has no labels and input_ids (or pixel_values); the pipeline "
                            "pairs the arms' outcomes example by example on them")
        if labels.ndim == 2:  # a causal LM: the model shifts labels by one inside; the pipeline's task does not
            if (labels < 0).any() or labels.shape != inputs.shape:
                raise DataError(f"{where}: {split} labels with padding (-100) or another shape than input_ids; give "
                                "fixed-length blocks (labels = input_ids) to compare the arms token by token")
            inputs, labels = inputs[:, :-1], labels[:, 1:]
        xs.append(inputs.cpu())
        ys.append(labels.cpu())
    if not xs:
        raise DataError(f"{where}: the {split} dataloader gave no batch")
    return torch.cat(xs), torch.cat(ys).long()
