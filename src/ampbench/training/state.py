"""What the training loop takes, holds and gives: ``LoopConfig`` (its settings besides model, data and precision),
``TrainState`` (the objects a run is made of; what a checkpoint holds) and ``EpochRecord`` (one epoch's output).

Plain dataclasses in a module of their own, so the watchers, the FLOP count, checkpoints, resume and the stages can
name these types without importing the loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from ampbench.config.params import TrainParams
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task


@dataclass(frozen=True)
class LoopConfig:
    """What ``fit`` needs besides model, data and precision: the train params whole, and how to measure."""

    train: TrainParams
    seed: int = 0  # seeds the data order
    eval_batch_size: int = 1024  # validation samples per forward pass
    warmup_steps: int = 5  # steps excluded from throughput timing (allocator, autotuning, caches)
    timing_window: int = 10  # steps per throughput window; each window boundary syncs with the device once
    sync_debug: bool = False  # CUDA: raise if a steady-state step (not a sampled one) syncs with the host
    on_device: bool | None = None  # the input path, decided by the caller; None: train.data_on_device decides
    task: Task = CLASSIFICATION  # what the model computes: its logits, loss and right answers (tasks/)
    eval_every: int = 0  # optimizer steps between validation losses within an epoch (0: at epoch ends only)
    # The run's length and its bar, when not the train params' (the speed harness trains a round at a time):
    epochs: int | None = None  # the epoch fit stops after; None: train.epochs
    progress: bool | None = None  # draw the progress bar; None: train.progress

    @property
    def end_epoch(self) -> int:
        """The epoch fit stops after (and the LR schedule's length)."""
        return self.train.epochs if self.epochs is None else self.epochs

    @property
    def show_progress(self) -> bool:
        return self.train.progress if self.progress is None else self.progress


@dataclass
class TrainState:
    """The objects that make up a training run; everything a checkpoint must hold."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    generator: torch.Generator  # data order; on CPU so its state is portable
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps attempted (skipped ones included)


@dataclass(frozen=True)
class EpochRecord:
    """Everything one epoch produced: the loop's single output, passed to ``on_epoch`` and returned by ``fit``."""

    epoch: int  # 1-based
    train_loss: float  # mean cross-entropy over the epoch's training samples (without train.loss_multiplier)
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    samples_per_s: float  # whole epoch, validation excluded
    epoch_seconds: float
    loss_scale: float  # at the end of the epoch; 1.0 without a scaler
    skipped_steps: int  # optimizer steps the scaler skipped this epoch
    optimizer_steps: int  # optimizer steps attempted this epoch (skipped ones included)
    input_wait_seconds: float  # time the loop waited for its next batch (host side): large = input-bound
    lr: float  # after this epoch's scheduler step
    grads: dict[str, float]  # gradient range shares and mean norm over sampled steps (telemetry.GradProbe)
    steps: list[dict[str, float]] = field(default_factory=list)  # sampled steps: step, loss, skips, scale
    layers: dict[str, dict[str, float]] = field(default_factory=dict)  # per-parameter gradient shares
    windows: list[float] = field(default_factory=list)  # samples/s of each timing window after warm-up
    activations: list[dict] = field(default_factory=list)  # per-module output ranges (activations.ActivationProbe)
    nonfinite: dict | None = None  # the first non-finite module found this epoch (nonfinite.Culprit.to_dict)
    # Validation losses within the epoch and at its end: step (the run's), seconds (of this epoch's training so
    # far, evaluations left out), val_loss. What time to fp32's quality is measured on.
    evaluations: list[dict[str, float]] = field(default_factory=list)

    def row(self) -> dict[str, float]:
        """The epoch's metrics as one flat history row (history.json, MLflow, DVC plots)."""
        # not copied: asdict would deep-copy the per-layer tables
        skip = ("grads", "steps", "layers", "windows", "activations", "nonfinite", "evaluations")
        metrics = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        return {**metrics, **self.grads}
