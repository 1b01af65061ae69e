"""Checkpoints: everything needed to restore a training run, saved atomically, loaded with ``weights_only=True``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ampbench.errors import AmpbenchError, ResumeRefused
from ampbench.fileio import atomic_torch_save
from ampbench.models import unwrap
from ampbench.training import TrainState


def state_dict(state: TrainState, meta: dict[str, Any]) -> dict[str, Any]:
    """Model, optimizer, scheduler, scaler and RNG states plus ``meta`` (precision, seed, model spec…)."""
    return {
        "model": unwrap(state.model).state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),  # empty when the scaler is disabled: fine
        "data_generator": state.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "epoch": state.epoch,
        "step": state.step,
        "meta": meta,
    }


def save(state: TrainState, meta: dict[str, Any], path: Path) -> None:
    """Write a checkpoint of ``state`` atomically (a crash mid-write leaves the previous one intact)."""
    atomic_torch_save(state_dict(state, meta), path)


def save_dict(ck: dict[str, Any], path: Path) -> None:
    atomic_torch_save(ck, path)


def restore(state: TrainState, ck: dict[str, Any]) -> None:
    """Put a checkpoint back into ``state``: weights, optimizer, schedule, scaler, RNG and data order."""
    unwrap(state.model).load_state_dict(ck["model"])
    state.optimizer.load_state_dict(ck["optimizer"])
    state.scheduler.load_state_dict(ck["scheduler"])
    if ck["scaler"]:  # empty when saved from a disabled scaler
        state.scaler.load_state_dict(ck["scaler"])
    state.generator.set_state(ck["data_generator"])
    torch.set_rng_state(ck["torch_rng"])
    if ck["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ck["cuda_rng"])
    state.epoch, state.step = ck["epoch"], ck["step"]


def load_resumable(path: Path, arm: str, key: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if training may resume from it, else None (absent, or params/code changed).

    A checkpoint of another precision is refused outright: resuming fp16 weights, optimizer and scaler state
    as a bf16 run would silently mix two experiments.
    """
    if not Path(path).exists():
        return None
    ck = load(path)
    meta = ck.get("meta", {})
    if meta.get("arm") != arm:
        raise ResumeRefused(f"{path} was trained as {meta.get('arm')!r}; refusing to resume it as {arm!r}. "
                            f"Delete it to start {arm} from scratch.")
    if meta.get("resume_key") != key:
        print(f"[{arm}] {path}: params, data or code changed since it was written; starting over",
              file=sys.stderr)
        return None
    return ck


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint dict (tensors and plain values only: no code runs while loading)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise AmpbenchError(f"{path}: checkpoint unreadable ({type(exc).__name__}: {exc})") from None
