"""Checkpoints: everything needed to restore a training run, saved atomically, loaded with ``weights_only=True``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ampbench.errors import AmpbenchError
from ampbench.fileio import atomic_torch_save
from ampbench.training import TrainState


def state_dict(state: TrainState, meta: dict[str, Any]) -> dict[str, Any]:
    """Model, optimizer, scheduler, scaler and RNG states plus ``meta`` (precision, seed, model spec…)."""
    model = getattr(state.model, "_orig_mod", state.model)  # torch.compile wraps; save the plain keys
    return {
        "model": model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),  # empty when the scaler is disabled: fine
        "data_generator": state.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "epoch": state.epoch,
        "meta": meta,
    }


def save(state: TrainState, meta: dict[str, Any], path: Path) -> None:
    atomic_torch_save(state_dict(state, meta), path)


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint dict (tensors and plain values only: no code runs while loading)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise AmpbenchError(f"{path}: checkpoint unreadable ({type(exc).__name__}: {exc})") from None
