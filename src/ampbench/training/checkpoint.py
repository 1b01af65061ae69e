"""Checkpoints: everything needed to restore a training run, saved atomically, loaded with ``weights_only=True``.

When a checkpoint may be resumed is ``stages/resume.py``'s business; this module only writes and reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ampbench.errors import AmpbenchError
from ampbench.models.builtins import unwrap
from ampbench.runtime.files import atomic_torch_save
from ampbench.training.state import TrainState


def state_dict(state: TrainState) -> dict[str, Any]:
    """Model, optimizer, scheduler, scaler and RNG states, epoch and step."""
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
    }


def save(state: TrainState, meta: dict[str, Any], path: Path) -> None:
    """Write a checkpoint of ``state`` with ``meta`` (what it is: arm, seed, model…) atomically."""
    write(state_dict(state), meta, path)


def write(ck: dict[str, Any], meta: dict[str, Any], path: Path) -> None:
    """Write the checkpoint dict ``ck`` with ``meta`` in place of its own, atomically (a crash mid-write leaves
    the previous file intact).

    ``meta`` goes through JSON first: pickle writes an object seen twice as a back-reference, so two equal metas
    built from different objects (an arm name from argv, or the registry's own string) would give different bytes,
    and DVC different hashes, for the same checkpoint."""
    atomic_torch_save({**ck, "meta": json.loads(json.dumps(meta))}, path)


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


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint dict (tensors and plain values only: no code runs while loading)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise AmpbenchError(f"{path}: checkpoint unreadable ({type(exc).__name__}: {exc})") from None


def load_final_model(path: Path, arm: str, seed: int, device: torch.device, rerun: str) -> torch.nn.Module:
    """``arm``'s final model of ``seed`` (a checkpoint the train stage wrote, which says it is that arm's and seed's),
    in eval mode on ``device``; DataError naming the file and ``rerun`` (what rewrites it) otherwise."""
    from ampbench.config.records import check_checkpoint
    from ampbench.errors import DataError
    from ampbench.models.factory import ModelSpec, build_for

    if not path.exists():
        raise DataError(f"{path}: missing; {rerun}")
    ck = load(path)
    m = check_checkpoint(ck.get("meta") if isinstance(ck, dict) else None, path, arm, seed, rerun)
    try:
        model = build_for(ModelSpec.from_meta(m.model), m.contract)
        model.load_state_dict(ck["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # altered: not what train wrote
        raise DataError(f"{path}: not a checkpoint the train stage wrote ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); {rerun}") from None
    return model.to(device).eval()
