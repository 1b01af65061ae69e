"""The training loop: the tutorial's mixed-precision step, driven by a ``PrecisionPolicy``, reporting by callback.

The step is exactly the seed's: forward and loss inside ``policy.autocast()``; ``scaler.scale(loss).backward()``;
``scaler.step(optimizer)``; ``scaler.update()``. For arms without a scaler the scaler is disabled and passes
through, so the loop has one code path for every precision. Data stays on the device as tensors and is batched
by indexing; running sums stay on the device and are read once per epoch (no per-step host sync).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ampbench import distributed
from ampbench.data import Split
from ampbench.distributed import World
from ampbench.errors import AmpbenchError
from ampbench.models import unwrap
from ampbench.precision import PrecisionPolicy
from ampbench.telemetry import GradProbe


class Diverged(AmpbenchError):
    """Training of one arm went numerically wrong; the message says how."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything the loop needs besides model, data and precision."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: str = "cosine"
    seed: int = 0
    eval_batch_size: int = 1024
    progress: bool = False
    log_every: int = 50  # steps between progress-bar loss updates (each one reads the loss: a host sync)
    clip_grad_norm: float | None = None  # applied to the true (unscaled) gradients
    telemetry_every: int = 10  # steps between gradient samples and divergence checks (each reads from device)
    loss_multiplier: float = 1.0  # < 1 pushes gradients toward fp16's underflow range (stress tests)
    scaler_settings: dict = field(default_factory=dict)  # GradScaler init_scale, growth_factor, ...
    min_loss_scale: float = 1.0  # divergence: loss scale below this
    max_consecutive_skips: int = 50  # divergence: this many skipped steps in a row
    warmup_steps: int = 5  # steps excluded from throughput timing (allocator, autotuning, caches)
    timing_window: int = 10  # steps per throughput window; each window boundary syncs with the device once
    sync_debug: bool = False  # CUDA: raise if a steady-state step (not a sampled one) syncs with the host


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


@dataclass
class TrainResult:
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch
    layers: list[dict[str, dict[str, float]]] = field(default_factory=list)  # per epoch: per-parameter telemetry

    windows: list[float] = field(default_factory=list)  # samples/s of each timing window after warm-up

    @property
    def samples_per_s(self) -> float:
        """Median throughput over timing windows after warm-up; falls back to per-epoch rates (first epoch
        excluded) when the run was too short for a single window."""
        if self.windows:
            return statistics.median(self.windows)
        rates = [row["samples_per_s"] for row in self.history]
        return statistics.median(rates[1:] if len(rates) > 1 else rates)

    @property
    def skipped_steps(self) -> int:
        return int(sum(row["skipped_steps"] for row in self.history))


def make_optimizer(name: str, params, lr: float, weight_decay: float, momentum: float,
                   device: torch.device) -> torch.optim.Optimizer:
    """SGD / Adam / AdamW, fused where the device allows: a fused optimizer lets GradScaler skip inf steps
    inside the kernel instead of reading ``found_inf`` on the host every step."""
    fused = device.type in ("cuda", "cpu")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=fused)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)
    raise ValueError(f"unknown optimizer {name!r}")


def make_scheduler(name: str, optimizer: torch.optim.Optimizer, epochs: int):
    """Per-epoch LR schedule: ``constant`` or ``cosine`` (to zero over ``epochs``)."""
    if name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    if name == "constant":
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    raise ValueError(f"unknown scheduler {name!r}")


def init_state(model: nn.Module, policy: PrecisionPolicy, cfg: TrainConfig, device: torch.device) -> TrainState:
    """Fresh optimizer, scheduler, scaler and data-order generator for ``model`` (already on ``device``)."""
    optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr, cfg.weight_decay, cfg.momentum, device)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=make_scheduler(cfg.scheduler, optimizer, cfg.epochs),
        scaler=policy.grad_scaler(**cfg.scaler_settings),
        generator=torch.Generator().manual_seed(cfg.seed),
    )


def train_step(model, optimizer, scaler, policy: PrecisionPolicy, x: torch.Tensor, y: torch.Tensor,
               clip_grad_norm: float | None = None, probe: GradProbe | None = None, loss_multiplier: float = 1.0):
    """One optimizer step, the tutorial's order. Returns (loss, logits), both still on the device.

    With clipping or a probe: scale → backward → ``unscale_`` → clip → step → update, so the clip threshold
    and the probe's "true" numbers apply to real gradients; ``step`` then skips its own unscaling.
    """
    optimizer.zero_grad(set_to_none=True)
    with policy.autocast():
        logits = model(x)
        # float32 loss for every arm (autocast would keep cross_entropy in float32 anyway; the *_pure arms don't)
        loss = F.cross_entropy(logits.float(), y) * loss_multiplier
    scaler.scale(loss).backward()  # scale up so small fp16 gradients survive
    if probe is not None:
        probe.sample(model, "scaled")  # what the scaler protects: gradients as backward left them
    if clip_grad_norm is not None or probe is not None:
        scaler.unscale_(optimizer)  # true gradients from here on
        if probe is not None:
            probe.sample(model, "true")
        if clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    scaler.step(optimizer)  # unscale (unless done above), then step unless inf/NaN
    scaler.update()  # adjust the scale factor
    return loss, logits


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, policy: PrecisionPolicy, batch_size: int) -> torch.Tensor:
    """Logits for ``x`` in the policy's precision, returned as float32 (N, classes) on x's device."""
    was_training = model.training
    model.eval()
    outs = []
    for start in range(0, len(x), batch_size):
        with policy.autocast():
            outs.append(model(policy.cast_input(x[start:start + batch_size])).float())
    model.train(was_training)
    return torch.cat(outs)


def _batches(n: int, batch_size: int, generator: torch.Generator, device: torch.device, ranks: int = 1):
    """Shuffled global index batches (the same on every rank: one generator, one seed). A trailing batch of one
    sample is dropped (BatchNorm cannot train on it), and with several ranks one that does not split evenly."""
    perm = torch.randperm(n, generator=generator).to(device)
    for start in range(0, n, batch_size):
        idx = perm[start:start + batch_size]
        if len(idx) > 1 and len(idx) % ranks == 0:
            yield idx


def fit(state: TrainState, train: Split, val: Split, policy: PrecisionPolicy, cfg: TrainConfig,
        on_epoch: Callable[[dict[str, float], TrainState], None] | None = None,
        world: World = World()) -> TrainResult:
    """Train ``state.model`` from ``state.epoch`` to ``cfg.epochs``; call ``on_epoch(row, state)`` after each.

    ``row`` holds the epoch's metrics and, under ``"steps"``, rows sampled every ``cfg.telemetry_every`` steps
    (global step, loss, loss scale, skipped steps so far), under ``"layers"`` the per-parameter telemetry,
    under ``"windows"`` the throughput (samples/s) of each timing window after warm-up. A resumed run passes
    a state restored from a checkpoint (``state.epoch`` > 0) and continues exactly where it stopped.

    ``train`` and ``val`` must already be on the model's device. With several ranks (``world``), every rank
    walks the same global batches and trains on its slice; ``state.model`` is DDP-wrapped; sums are all-reduced
    and samples/s counts the global batch.
    """
    model, device = state.model, train.x.device
    train_x = policy.cast_input(train.x)  # once, not per step (a no-op unless a *_pure ablation)
    probe = GradProbe(unwrap(model), device)
    result = TrainResult()
    # Scaling a dummy value makes GradScaler create its scale tensor now, so the very first step's skip
    # (the default 2**16 scale often overflows at once) is counted too. A disabled scaler returns it unchanged.
    state.scaler.scale(torch.zeros((), device=device))
    for epoch in range(state.epoch, cfg.epochs):
        model.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.int64)
        skipped = torch.zeros((), device=device, dtype=torch.int64)
        run_of_skips = torch.zeros((), device=device, dtype=torch.int64)  # consecutive skipped steps so far
        longest_skips = torch.zeros((), device=device, dtype=torch.int64)
        seen = steps = 0
        step_rows: list[dict[str, float]] = []
        bar = _progress_bar(cfg, len(train), f"{policy.name} seed{cfg.seed} epoch {epoch + 1}/{cfg.epochs}")
        _sync(device)
        t0 = window_t0 = time.perf_counter()
        window_steps = window_samples = 0
        windows: list[float] = []
        for idx in _batches(len(train), cfg.batch_size, state.generator, device, world.size):
            sample = steps % cfg.telemetry_every == 0
            with _sync_guard(cfg.sync_debug and not sample and device.type == "cuda"):
                mine = distributed.shard(idx, world)  # this rank's slice of the global batch
                x, y = train_x[mine], train.y[mine]
                scale_before = _scale_tensor(state.scaler)
                loss, logits = train_step(model, state.optimizer, state.scaler, policy, x, y, cfg.clip_grad_norm,
                                          probe if sample else None, cfg.loss_multiplier)
                if scale_before is not None:  # the scaler lowers its scale exactly when it skipped the step
                    was_skipped = (_scale_tensor(state.scaler) < scale_before).long()
                    skipped += was_skipped
                    run_of_skips = (run_of_skips + was_skipped) * was_skipped
                    longest_skips = torch.maximum(longest_skips, run_of_skips)
                loss_sum += loss.detach().float() * len(mine)
                correct += (logits.argmax(dim=1) == y).sum()
            seen += len(idx)
            steps += 1
            state.step += 1
            bar.update(len(idx))
            window_steps += 1
            window_samples += len(idx)
            if window_steps == cfg.timing_window:  # windows never span an epoch boundary (validation)
                _sync(device)
                now = time.perf_counter()
                if state.step - window_steps >= cfg.warmup_steps:
                    windows.append(window_samples / (now - window_t0))
                window_t0, window_steps, window_samples = now, 0, 0
            if cfg.progress and steps % cfg.log_every == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
            if sample:
                _check_divergence(policy, state.scaler, loss_sum, longest_skips, cfg, epoch, steps)
                step_rows.append({"step": state.step, "loss": loss.item(), "skipped_in_epoch": int(skipped.item()),
                                  "loss_scale": _loss_scale(state.scaler)})
        _sync(device)  # time the work, not the queueing
        train_seconds = time.perf_counter() - t0
        n_skipped = int(skipped.item())
        if n_skipped < steps:  # the LR schedule advances only when the optimizer really stepped
            state.scheduler.step()
        state.epoch = epoch + 1

        _check_divergence(policy, state.scaler, loss_sum, longest_skips, cfg, epoch, steps)
        distributed.sum_(loss_sum, world)  # every rank's share of the epoch: seen already counts global batches
        distributed.sum_(correct, world)
        val_logits = predict(model, val.x, policy, cfg.eval_batch_size)
        grad_stats, layers = probe.epoch_summary()
        row = {
            "epoch": epoch + 1,
            "train_loss": (loss_sum / max(seen, 1)).item(),
            "train_accuracy": correct.item() / max(seen, 1),
            "val_loss": F.cross_entropy(val_logits, val.y).item(),
            "val_accuracy": (val_logits.argmax(dim=1) == val.y).float().mean().item(),
            "samples_per_s": seen / train_seconds,
            "epoch_seconds": train_seconds,
            "loss_scale": _loss_scale(state.scaler),
            "skipped_steps": n_skipped,
            "lr": state.optimizer.param_groups[0]["lr"],
            **grad_stats,
        }
        bar.set_postfix(loss=f"{row['train_loss']:.4f}", val_acc=f"{row['val_accuracy']:.3f}")
        bar.close()
        result.history.append(row)
        result.layers.append(layers)
        result.windows += windows
        if on_epoch is not None:
            on_epoch({**row, "steps": step_rows, "layers": layers, "windows": windows}, state)
    return result


class _NoBar:
    """Stands in for tqdm when progress is off (and where tqdm is not installed, e.g. a bare GPU box)."""

    def update(self, n: int) -> None: ...
    def set_postfix(self, **kw) -> None: ...
    def close(self) -> None: ...


def _progress_bar(cfg: TrainConfig, total: int, desc: str):
    if not cfg.progress:
        return _NoBar()
    from tqdm.auto import tqdm

    # disable=None: draw only when attached to a terminal
    return tqdm(total=total, unit="sample", unit_scale=True, leave=False, disable=None, desc=desc)


@contextlib.contextmanager
def _sync_guard(enabled: bool):
    """Make any host-device sync inside the block an error (CUDA's sync debug mode)."""
    if not enabled:
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_divergence(policy: PrecisionPolicy, scaler, loss_sum: torch.Tensor, longest_skips: torch.Tensor,
                      cfg: TrainConfig, epoch: int, steps: int) -> None:
    """Raise Diverged when training has gone numerically wrong (reads two numbers from the device)."""
    where = f"{policy.name}: epoch {epoch + 1}, step {steps}"
    if scaler.is_enabled():
        # With a scaler, inf/NaN losses are expected now and then (the step is skipped); a collapsing
        # scale or a long run of skips means every step overflows.
        scale = scaler.get_scale()
        if scale < cfg.min_loss_scale:
            raise Diverged(f"{where}: loss scale collapsed to {scale:g} (< {cfg.min_loss_scale:g}): fp16 overflows "
                           "on every step")
        if int(longest_skips) >= cfg.max_consecutive_skips:
            raise Diverged(f"{where}: {int(longest_skips)} optimizer steps in a row skipped for inf/NaN gradients")
    elif not torch.isfinite(loss_sum):
        raise Diverged(f"{where}: loss became {float(loss_sum)} (no scaler to skip bad steps)")


def _loss_scale(scaler: torch.amp.GradScaler) -> float:
    """The current loss scale as a number (a host read); 1.0 for arms without a scaler."""
    return scaler.get_scale() if scaler.is_enabled() else 1.0


def _scale_tensor(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """A device-side copy of the current loss scale (None when the scaler is disabled).

    Reads GradScaler's ``_scale`` tensor rather than ``get_scale()``, which would sync with the host every step.
    """
    scale = getattr(scaler, "_scale", None) if scaler.is_enabled() else None
    return None if scale is None else scale.clone()
