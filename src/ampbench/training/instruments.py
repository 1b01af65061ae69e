"""The training loop's instruments, each a small object called once per step (``watchers.py`` holds them together).

- ``ScalerHealth``: which steps the GradScaler skipped, the longest run of skips, the loss scale, divergence.
- ``WindowTimer``: throughput over windows of steps bounded by one device sync (also the bench's bare loop).
- ``ProgressBar``: the tqdm bar, drawn only on a terminal; ``epoch_line``: the one line per epoch for every output.
- ``sync_guard``: CUDA's sync debug mode around steps that must not wait for the device.

Everything per step stays on the device; the host reads numbers only at sampled steps and at epoch ends.
"""

from __future__ import annotations

import contextlib
import time

import torch

from ampbench.config.params import DivergenceParams
from ampbench.errors import Diverged


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ScalerHealth:
    """Skip counting and divergence checks for one arm's GradScaler (and the loss, for arms without one).

    GradScaler does not say whether ``step`` stepped; it lowers its scale exactly when it skipped, so a skip is
    read off the scale tensor before and after the step, on the device (``get_scale()`` would sync every step).
    """

    def __init__(self, name: str, scaler: torch.amp.GradScaler, limits: DivergenceParams, device: torch.device):
        self.name, self.scaler, self.limits, self.device = name, scaler, limits, device
        self.enabled = scaler.is_enabled()
        # Scaling a dummy value makes GradScaler create its scale tensor now, so the very first step's skip
        # (the default 2**16 scale often overflows at once) is counted too. A disabled scaler passes it through.
        scaler.scale(torch.zeros((), device=device))
        self.new_epoch()

    def new_epoch(self) -> None:
        zero = lambda: torch.zeros((), device=self.device, dtype=torch.int64)  # noqa: E731
        self.skipped, self.run, self.longest = zero(), zero(), zero()  # skips; consecutive skips; longest run

    @contextlib.contextmanager
    def watch(self):
        """Around one optimizer step: counts it as skipped when the scale went down."""
        before = self.scaler._scale.clone() if self.enabled else None
        yield
        if before is not None:
            was_skipped = (self.scaler._scale < before).long()
            self.last_skipped = was_skipped
            self.skipped += was_skipped
            self.run = (self.run + was_skipped) * was_skipped
            self.longest = torch.maximum(self.longest, self.run)

    def went_bad(self, loss: torch.Tensor) -> torch.Tensor:
        """Whether the step just run was bad (on the device): the scaler skipped it, or its loss is not finite."""
        bad = ~torch.isfinite(loss.detach())
        return bad | self.last_skipped.bool() if self.enabled else bad

    @property
    def loss_scale(self) -> float:
        """The current loss scale (a host read); 1.0 for arms without a scaler."""
        return self.scaler.get_scale() if self.enabled else 1.0

    def skipped_steps(self) -> int:
        """Steps skipped so far this epoch (a host read)."""
        return int(self.skipped)

    def check(self, loss_sum: torch.Tensor, where: str) -> None:
        """Raise Diverged when training has gone numerically wrong (reads two numbers from the device)."""
        where = f"{self.name}: {where}"
        if self.enabled:
            # With a scaler, inf/NaN losses are expected now and then (the step is skipped); a collapsing
            # scale or a long run of skips means every step overflows.
            scale, limit = self.scaler.get_scale(), self.limits.min_loss_scale
            if scale < limit:
                raise Diverged(f"{where}: loss scale collapsed to {scale:g} (< {limit:g}): fp16 overflows on "
                               "every step")
            if int(self.longest) >= self.limits.max_consecutive_skips:
                raise Diverged(f"{where}: {int(self.longest)} optimizer steps in a row skipped for inf/NaN "
                               "gradients")
        elif not torch.isfinite(loss_sum):
            raise Diverged(f"{where}: loss became {float(loss_sum)} (no scaler to skip bad steps)")


class WindowTimer:
    """Samples/s over windows of ``window`` steps, each closed by one device sync; a window that starts within
    the first ``warmup_steps`` steps (allocator, autotuning, caches) is not kept. Windows never span an epoch."""

    def __init__(self, device: torch.device, window: int, warmup_steps: int):
        self.device, self.window, self.warmup_steps = device, window, warmup_steps
        self.windows: list[float] = []  # samples/s of each kept window

    def start(self) -> None:
        """Start of an epoch (or round): sync, then open a fresh window."""
        sync(self.device)
        self.t0 = self.window_t0 = time.perf_counter()
        self.in_window = self.samples = 0

    def tick(self, samples: int, step: int) -> None:
        """After one step of ``samples`` samples; ``step``: the steps done in the whole run, this one included (a
        resumed run starts past its warm-up)."""
        self.in_window += 1
        self.samples += samples
        if self.in_window == self.window:
            sync(self.device)
            now = time.perf_counter()
            if step - self.in_window >= self.warmup_steps:
                self.windows.append(self.samples / (now - self.window_t0))
            self.window_t0, self.in_window, self.samples = now, 0, 0

    def elapsed(self) -> float:
        """Seconds since ``start``, after the queued work finished (time the work, not the queueing)."""
        sync(self.device)
        return time.perf_counter() - self.t0

    def shift(self, seconds: float) -> None:
        """Leave ``seconds`` of other work (an evaluation between steps) out of the epoch and the open window."""
        self.t0 += seconds
        self.window_t0 += seconds

    def take(self) -> list[float]:
        """The windows kept since the last call."""
        taken, self.windows = self.windows, []
        return taken


class ProgressBar:
    """A tqdm bar per epoch when ``enabled`` and attached to a terminal; the loss is read (a host sync) only for a
    bar that is drawn, every ``every`` steps."""

    def __init__(self, enabled: bool, total: int, desc: str, every: int = 50):
        self.bar, self.every = None, every
        if enabled:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="sample", unit_scale=True, leave=False, disable=None, desc=desc)
            self.bar = None if bar.disable else bar

    def step(self, samples: int, loss: torch.Tensor, step: int) -> None:
        """After step ``step`` (of the run) of ``samples`` samples with loss ``loss`` (on the device)."""
        if self.bar is not None:
            self.bar.update(samples)
            if step % self.every == 0:
                self.bar.set_postfix(loss=f"{loss.item():.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def epoch_line(name: str, record, epochs: int, epochs_left: int) -> str:
    """One line per epoch, also where no bar is drawn (CI, `dvc queue logs`, a log file): who, where, how well,
    how fast and how long the arm still needs (``epochs_left`` of its epochs × this epoch's time)."""
    left = round(epochs_left * record.epoch_seconds)
    eta = f"{left // 3600}h{left % 3600 // 60:02d}m" if left >= 3600 else f"{left // 60}m{left % 60:02d}s"
    return (f"{name} epoch {record.epoch}/{epochs}: train_loss {record.train_loss:.4f}, val_accuracy "
            f"{record.val_accuracy:.4f}, {record.samples_per_s:,.0f} samples/s, {eta} left for this arm")


@contextlib.contextmanager
def sync_guard(enabled: bool):
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
