"""The training loop: the tutorial's mixed-precision step, driven by a ``PrecisionPolicy``, reporting by callback.

The step is exactly the seed's: forward and loss inside ``policy.autocast()``; ``scaler.scale(loss).backward()``;
``scaler.step(optimizer)``; ``scaler.update()``. For arms without a scaler the scaler is disabled and passes
through, so the loop has one code path for every precision. Its settings are the validated ``train`` params,
passed whole (``LoopConfig.train``). Batches come from ``loader.InputPipeline`` (device-resident tensors or a
streaming DataLoader, the same batches either way); running sums stay on the device and are read once per epoch
(no per-step host sync). Side concerns live in ``monitor.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ampbench import distributed
from ampbench.data import Split
from ampbench.distributed import SINGLE, World
from ampbench.loader import InputPipeline, keep_on_device
from ampbench.models import unwrap
from ampbench.monitor import Diverged, Progress, ScalerHealth, WindowTimer, sync_guard
from ampbench.numerics import ActivationProbe, NonFiniteFinder, replay_first_nonfinite
from ampbench.params import TrainParams
from ampbench.precision import PrecisionPolicy
from ampbench.telemetry import GradProbe


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
    activations: list[dict] = field(default_factory=list)  # per-module output ranges (numerics.ActivationProbe)
    nonfinite: dict | None = None  # the first non-finite module found this epoch (numerics.Culprit.to_dict)

    def row(self) -> dict[str, float]:
        """The epoch's metrics as one flat history row (history.json, MLflow, DVC plots)."""
        # not copied: asdict would deep-copy the per-layer tables
        skip = ("grads", "steps", "layers", "windows", "activations", "nonfinite")
        metrics = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        return {**metrics, **self.grads}


def throughput(records: list[EpochRecord]) -> float:
    """Median samples/s over the timing windows after warm-up; per-epoch rates (first epoch excluded) when the
    run was too short for a single window."""
    windows = [w for r in records for w in r.windows]
    if windows:
        return statistics.median(windows)
    rates = [r.samples_per_s for r in records]
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def make_optimizer(tp: TrainParams, params, device: torch.device) -> torch.optim.Optimizer:
    """SGD / Adam / AdamW, fused where the device allows: a fused optimizer lets GradScaler skip inf steps
    inside the kernel instead of reading ``found_inf`` on the host every step."""
    fused = device.type in ("cuda", "cpu")
    common = {"lr": tp.lr, "weight_decay": tp.weight_decay, "fused": fused}
    if tp.optimizer == "sgd":
        return torch.optim.SGD(params, momentum=tp.momentum, **common)
    if tp.optimizer == "adam":
        return torch.optim.Adam(params, **common)
    if tp.optimizer == "adamw":
        return torch.optim.AdamW(params, **common)
    raise ValueError(f"unknown optimizer {tp.optimizer!r}")


def make_scheduler(name: str, optimizer: torch.optim.Optimizer, epochs: int):
    """Per-epoch LR schedule: ``constant`` or ``cosine`` (to zero over ``epochs``)."""
    if name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    if name == "constant":
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    raise ValueError(f"unknown scheduler {name!r}")


def init_state(model: nn.Module, policy: PrecisionPolicy, cfg: LoopConfig, device: torch.device) -> TrainState:
    """Fresh optimizer, scheduler, scaler and data-order generator for ``model`` (already on ``device``)."""
    tp = cfg.train
    optimizer = make_optimizer(tp, model.parameters(), device)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=make_scheduler(tp.scheduler, optimizer, tp.epochs),
        scaler=policy.grad_scaler(tp.grad_scaler),
        generator=torch.Generator().manual_seed(cfg.seed),
    )


def train_step(model, optimizer, scaler, policy: PrecisionPolicy, x: torch.Tensor, y: torch.Tensor,
               tp: TrainParams, probe: GradProbe | None = None):
    """One optimizer step, the tutorial's order. Returns (loss, logits), both still on the device.

    With clipping or a probe: scale → backward → ``unscale_`` → clip → step → update, so the clip threshold
    and the probe's "true" numbers apply to real gradients; ``step`` then skips its own unscaling.
    """
    optimizer.zero_grad(set_to_none=True)
    with policy.autocast():
        logits = model(x)
        # float32 loss for every arm (autocast would keep cross_entropy in float32 anyway; the *_pure arms don't)
        loss = F.cross_entropy(logits.float(), y)
    scaler.scale(loss * tp.loss_multiplier).backward()  # scale up so small fp16 gradients survive
    if probe is not None:
        probe.sample(model, "scaled")  # what the scaler protects: gradients as backward left them
    if tp.clip_grad_norm is not None or probe is not None:
        scaler.unscale_(optimizer)  # true gradients from here on
        if probe is not None:
            probe.sample(model, "true")
        if tp.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tp.clip_grad_norm)
    scaler.step(optimizer)  # unscale (unless done above), then step unless inf/NaN
    scaler.update()  # adjust the scale factor
    return loss, logits


@torch.no_grad()
def predict(model: nn.Module, data: torch.Tensor | Split, policy: PrecisionPolicy, batch_size: int) -> torch.Tensor:
    """Logits in the policy's precision, float32 (N, classes), for model inputs ``data`` (on the model's device)
    or a ``Split`` (stored values, normalised a batch at a time on the model's device, which holds the logits)."""
    was_training = model.training
    model.eval()
    split = data if isinstance(data, Split) else None
    x = data.x if split else data
    device = next(unwrap(model).parameters()).device
    outs = []
    for start in range(0, len(x), batch_size):
        chunk = x[start:start + batch_size]
        if split is not None:
            chunk = split.inputs(chunk.to(device, non_blocking=True))
        with policy.autocast():
            outs.append(model(policy.cast_input(chunk)).float())
    model.train(was_training)
    return torch.cat(outs)


class _EpochSums:
    """One epoch's running loss and accuracy sums, kept on the device (summed over ranks at the end)."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device, dtype=torch.int64)
        self.seen = self.steps = 0  # global samples and steps
        self.sampled: list[dict[str, float]] = []  # rows of the steps sampled for telemetry

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, global_batch: int) -> None:
        self.loss += loss.detach().float() * len(y)
        self.correct += (logits.argmax(dim=1) == y).sum()
        self.seen += global_batch
        self.steps += 1

    def reduce(self, world: World) -> tuple[float, float]:
        """(mean loss, accuracy) over every rank's share of the epoch."""
        distributed.sum_(self.loss, world)
        distributed.sum_(self.correct, world)
        n = max(self.seen, 1)
        return (self.loss / n).item(), self.correct.item() / n


def fit(state: TrainState, train: Split, val: Split, policy: PrecisionPolicy, cfg: LoopConfig,
        on_epoch: Callable[[EpochRecord, TrainState], None] | None = None,
        world: World = SINGLE) -> list[EpochRecord]:
    """Train ``state.model`` from ``state.epoch`` to ``train.epochs``; call ``on_epoch(record, state)`` after each
    epoch and return the records. A resumed run passes a state restored from a checkpoint (``state.epoch`` > 0)
    and continues exactly where it stopped.

    ``train`` and ``val`` hold stored values (on any device); ``train.data_on_device`` decides whether the training
    split moves to the model's device or streams. With several ranks (``world``), every rank walks the same global
    batches and trains on its slice; ``state.model`` is DDP-wrapped; sums are all-reduced and samples/s counts the
    global batch.
    """
    tp, model = cfg.train, state.model
    device = next(unwrap(model).parameters()).device
    on_device = cfg.on_device if cfg.on_device is not None else keep_on_device(tp.data_on_device, train, device)
    inputs = InputPipeline(train, device, on_device=on_device,
                           batch_size=tp.batch_size, augment=tp.augment, seed=cfg.seed, cast=policy.cast_input,
                           memory_format=torch.channels_last if tp.channels_last else torch.contiguous_format,
                           workers=tp.loader_workers, world=world)
    probe = GradProbe(unwrap(model), device)
    # Hooks on a compiled model would recompile it whenever they come and go: no activation sampling there.
    acts = None if tp.compile else ActivationProbe(unwrap(model), device)
    finder = NonFiniteFinder(tp.telemetry_every)
    health = ScalerHealth(policy.name, state.scaler, tp.divergence, device)
    timer = WindowTimer(device, cfg.timing_window, cfg.warmup_steps, steps_done=state.step)

    def check(where: str, batch) -> None:
        """The divergence check; a Diverged names the first non-finite module (caught, else a replay of ``batch``,
        if the epoch had one) and carries the epoch's activation table so far."""
        try:
            health.check(sums.loss, where)
        except Diverged as exc:
            x, y = (batch.x, batch.y) if batch is not None else (None, None)
            raise finder.explain(exc, unwrap(model), policy, x, y, tp.loss_multiplier, state.step,
                                 health.loss_scale, acts.take() if acts else None) from None

    records = []
    for epoch in range(state.epoch, tp.epochs):
        model.train()
        health.new_epoch()
        sums = _EpochSums(device)
        progress = Progress(tp.progress, len(train), f"{policy.name} seed{cfg.seed} epoch {epoch + 1}/{tp.epochs}")
        timer.start()
        batch = None  # an epoch that yields no batch still reaches the epoch-end check
        for batch in inputs.epoch(state.generator, state.step):
            sample = sums.steps % tp.telemetry_every == 0  # this step feeds telemetry and the divergence check
            # Hooks on for sampled steps, and for every step while hunting an unsampled skip's module.
            hooked = acts is not None and (sample or finder.hunting)
            scale = health.loss_scale if hooked else 1.0  # the scale this step runs with (a host read)
            with sync_guard(cfg.sync_debug and not hooked and device.type == "cuda"):
                with health.watch(), (acts.attached(backward=False) if hooked else contextlib.nullcontext()):
                    loss, logits = train_step(model, state.optimizer, state.scaler, policy, batch.x, batch.y, tp,
                                              probe if sample else None)
                sums.add(loss, logits, batch.y, batch.size)
            state.step += 1
            timer.tick(batch.size)
            progress.step(batch.size, loss)
            if hooked:
                # A skipped step left the weights as they were, so it can be replayed as it ran.
                replay = (functools.partial(replay_first_nonfinite, unwrap(model), policy, batch.x, batch.y, scale,
                                            tp.loss_multiplier, state.step) if health.enabled else None)
                finder.after_step(acts, health.went_bad(loss), state.step, scale, replay)
            if sample:
                finder.skips_seen(health.skipped_steps())
                check(f"epoch {epoch + 1}, step {sums.steps}", batch)
                sums.sampled.append({"step": state.step, "loss": loss.item(), "loss_scale": health.loss_scale,
                                     "skipped_in_epoch": health.skipped_steps()})
        seconds = timer.elapsed()
        progress.close()
        skipped = health.skipped_steps()
        if skipped < sums.steps:  # the LR schedule advances only when the optimizer really stepped
            state.scheduler.step()
        state.epoch = epoch + 1
        check(f"epoch {epoch + 1}, step {sums.steps}", batch)
        train_loss, train_accuracy = sums.reduce(world)
        val_logits = predict(model, val, policy, cfg.eval_batch_size)
        val_y = val.y.to(device)
        grads, layers = probe.epoch_summary()
        records.append(EpochRecord(
            epoch=state.epoch, train_loss=train_loss, train_accuracy=train_accuracy,
            val_loss=F.cross_entropy(val_logits, val_y).item(),
            val_accuracy=(val_logits.argmax(dim=1) == val_y).float().mean().item(),
            samples_per_s=sums.seen / seconds, epoch_seconds=seconds, loss_scale=health.loss_scale,
            skipped_steps=skipped, optimizer_steps=sums.steps, input_wait_seconds=inputs.wait_seconds,
            lr=state.optimizer.param_groups[0]["lr"], grads=grads,
            steps=sums.sampled, layers=layers, windows=timer.take(),
            activations=acts.take() if acts is not None else [], nonfinite=finder.take()))
        if on_epoch is not None:
            on_epoch(records[-1], state)
    return records
