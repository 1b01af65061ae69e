"""The two watchers ``loop.fit`` calls around its step, so the loop itself reads as the tutorial's recipe.

- ``NumericsWatch``: what the step's numbers did. It owns the instruments that depend on each other: the
  scaler's skip counting and divergence check (``instruments.ScalerHealth``), gradient ranges (``gradients.GradProbe``)
  and module outputs (``activations.ActivationProbe``) on sampled steps, and the first non-finite module
  (``nonfinite.NonFiniteFinder``), which hooks extra steps while it hunts and replays a skipped step.
- ``SpeedWatch``: how fast: the timing windows (``instruments.WindowTimer``) and the progress bar.

Neither counts steps: the loop's ``TrainState.step`` is the one counter, passed in. Every step of an epoch is
"sampled" when its index in the epoch is a multiple of ``train.telemetry_every``: such a step feeds the telemetry
and the divergence check (a few host reads); all other steps stay on the device (``sync_guard`` checks it on CUDA).
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import torch
from torch import nn

from ampbench.data.loader import Batch
from ampbench.errors import Diverged
from ampbench.precision.policy import PrecisionPolicy
from ampbench.training.activations import ActivationProbe
from ampbench.training.gradients import GradProbe
from ampbench.training.instruments import ProgressBar, ScalerHealth, WindowTimer, sync_guard
from ampbench.training.nonfinite import NonFiniteFinder, replay_first_nonfinite
from ampbench.training.state import LoopConfig


class NumericsWatch:
    """Scaler health, gradient and activation probes and the non-finite finder of one training run."""

    def __init__(self, model: nn.Module, policy: PrecisionPolicy, scaler: torch.amp.GradScaler, cfg: LoopConfig,
                 device: torch.device):
        tp = cfg.train
        self.model, self.policy, self.task = model, policy, cfg.task
        self.every, self.loss_multiplier = tp.telemetry_every, tp.loss_multiplier
        self.health = ScalerHealth(policy.name, scaler, tp.divergence, device)
        self.grads = GradProbe(model, device)
        # Hooks on a compiled model would recompile it whenever they come and go: no activation sampling there.
        self.acts = None if tp.compile else ActivationProbe(model, device)
        self.finder = NonFiniteFinder(tp.telemetry_every)
        self.sync_debug = cfg.sync_debug and device.type == "cuda"
        # Per epoch (epoch_start resets them):
        self.epoch = self.first_step = 0  # the epoch (0-based) and the run's steps before it
        self.sampled: list[dict[str, float]] = []  # rows of the sampled steps: step, loss, scale, skips
        self.batch: Batch | None = None  # the epoch's last batch, replayed at divergence (an epoch may yield none)
        # Per step (step sets them, after_step reads them):
        self.sample = self.hooked = False  # a sampled step; module outputs hooked on it
        self.scale = 1.0  # the loss scale the step ran with (read from the scaler only on hooked steps)

    def epoch_start(self, epoch: int, step: int) -> None:
        """Before the first step of ``epoch`` (0-based); ``step``: the run's steps so far."""
        self.health.new_epoch()
        self.epoch, self.first_step = epoch, step
        self.sampled = []
        self.batch = None

    @contextlib.contextmanager
    def step(self, step: int):
        """Around step ``step + 1`` (forward to update): counts a skip; on sampled steps yields the gradient probe
        for ``train_step`` (else None) and hooks module outputs; steady-state steps run under the sync guard."""
        self.sample = (step - self.first_step) % self.every == 0
        # Hooks on for sampled steps, and for every step while hunting an unsampled skip's module.
        self.hooked = self.acts is not None and (self.sample or self.finder.hunting)
        self.scale = self.health.loss_scale if self.hooked else 1.0  # the scale this step runs with (a host read)
        hooks = self.acts.attached(backward=False) if self.hooked else contextlib.nullcontext()
        with sync_guard(self.sync_debug and not self.hooked), self.health.watch(), hooks:
            yield self.grads if self.sample else None

    def after_step(self, step: int, batch: Batch, loss: torch.Tensor, loss_sum: torch.Tensor,
                   logits: torch.Tensor | None = None) -> None:
        """After step ``step`` (the run's count, this one included): blame a bad hooked step; on sampled steps the
        divergence check (``loss_sum``: the epoch's running loss sum) and the step's row. Without a scaler, the
        ``loss`` and the ``logits`` of every step go to the finder (on the device), so a non-finite loss between
        sampled steps is still told from a non-finite output."""
        self.batch = batch
        if logits is not None and not self.health.enabled:
            self.finder.watch_loss(loss, logits, step)
        if self.hooked:
            # A skipped step left the weights as they were, so it can be replayed as it ran.
            replay = (functools.partial(replay_first_nonfinite, self.model, self.policy, batch.x, batch.y,
                                        self.scale, self.loss_multiplier, step, self.task)
                      if self.health.enabled else None)
            self.finder.after_step(self.acts, self.health.went_bad(loss), step, self.scale, replay, loss, self.task)
        if self.sample:
            self.finder.skips_seen(self.health.skipped_steps())
            self.check(step, loss_sum)
            self.sampled.append({"step": step, "loss": loss.item(), "loss_scale": self.health.loss_scale,
                                 "skipped_in_epoch": self.health.skipped_steps()})

    def stepped(self, step: int) -> bool:
        """Whether the optimizer really stepped at least once this epoch (the scaler skipped fewer than all)."""
        return self.health.skipped_steps() < step - self.first_step

    def check(self, step: int, loss_sum: torch.Tensor) -> None:
        """The divergence check; a Diverged names the first non-finite module (caught, else a replay of the
        epoch's last batch, if it had one) and carries the epoch's activation table so far."""
        try:
            self.health.check(loss_sum, f"epoch {self.epoch + 1}, step {step - self.first_step}")
        except Diverged as exc:
            x, y = (self.batch.x, self.batch.y) if self.batch is not None else (None, None)
            raise self.finder.explain(exc, self.model, self.policy, x, y, self.loss_multiplier, step,
                                      self.health.loss_scale, self.acts.take() if self.acts else None,
                                      self.task) from None

    def take(self) -> dict[str, Any]:
        """The epoch's numerics (fields of ``state.EpochRecord``); the probes start a fresh epoch."""
        grads, layers = self.grads.epoch_summary()
        return {"loss_scale": self.health.loss_scale, "skipped_steps": self.health.skipped_steps(), "grads": grads,
                "steps": self.sampled, "layers": layers, "activations": self.acts.take() if self.acts else [],
                "nonfinite": self.finder.take()}


class SpeedWatch:
    """Timing windows after warm-up and the progress bar of one training run."""

    def __init__(self, device: torch.device, cfg: LoopConfig, samples_per_epoch: int):
        self.cfg, self.samples_per_epoch = cfg, samples_per_epoch
        self.timer = WindowTimer(device, cfg.timing_window, cfg.warmup_steps)
        self.bar: ProgressBar | None = None  # one per epoch

    def epoch_start(self, desc: str) -> None:
        self.bar = ProgressBar(self.cfg.show_progress, self.samples_per_epoch, desc)
        self.timer.start()

    def after_step(self, samples: int, loss: torch.Tensor, step: int) -> None:
        self.timer.tick(samples, step)
        self.bar.step(samples, loss, step)

    @contextlib.contextmanager
    def paused(self):
        """Around work that is not training (a validation between steps): yields the epoch's training seconds so
        far; the time inside is left out of the epoch's time and of the open timing window."""
        seconds = self.timer.elapsed()  # syncs: the steps queued so far count, the evaluation does not
        start = time.perf_counter()
        yield seconds
        self.timer.shift(time.perf_counter() - start)

    def epoch_end(self) -> float:
        """Seconds the epoch's training took (after the device finished it); the bar closes."""
        seconds = self.timer.elapsed()
        self.bar.close()
        return seconds

    def take(self) -> list[float]:
        """Samples/s of the epoch's timing windows."""
        return self.timer.take()
