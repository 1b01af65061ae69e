"""``StepBook``: what the pipeline reads from a framework's training run, step by step, whatever the framework (its
callbacks call it: ``lightning.py``, ``hf.py``).

- Per epoch an ``EpochRecord``: the mean of the losses ``training_step`` returned, the pipeline's own validation on
  the prepared val split (the same numbers a built-in task records), throughput windows, loss scale, skipped steps.
- On sampled steps (``train.telemetry_every``), what every matmul and convolution module computed in (its output's
  dtype, the autocast state around it, its weights' dtype) and the gradients' dtypes.
- The numerics a built-in task records, where a framework's callbacks reach: skipped steps and the loss scale
  (``ScalerHealth``, its divergence guard: a collapsing loss scale, a run of skipped steps, or a non-finite loss
  without a scaler stops the seed, recorded as diverged), and the first non-finite module: once a sampled step sees
  skips, the next steps hook every module's output (``NonFiniteFinder``'s hunt, ``ActivationProbe``) until one
  names it. Healthy steps are never hooked (every 10th step hooked cost the Lightning example's step 12%), so the
  per-module output and gradient ranges of the pipeline's own loop are not read.
- A refusal (``ArmMismatch``, one line naming the user's file and line) when the arm asked for 16-bit compute and
  none ran, or for float32 and 16 bits ran: a framework or a model overriding the flag silently.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampbench.config.params import DivergenceParams
from ampbench.config.user_code import _ours_or_installed
from ampbench.errors import AmpbenchError, Diverged
from ampbench.precision.policy import PrecisionPolicy
from ampbench.runtime import signals
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task
from ampbench.training.activations import ActivationProbe
from ampbench.training.flops import DtypeFlopCounter, flop_summary
from ampbench.training.instruments import ScalerHealth
from ampbench.training.nonfinite import NonFiniteFinder
from ampbench.training.state import EpochRecord

MATMUL = (nn.Linear, nn.modules.conv._ConvNd)  # what autocast runs in 16 bits: the compute the arm is about
MATMUL_NAMES = ("Conv1D",)  # Hugging Face's GPT-2 projections (an addmm on a weight matrix), by class name


class ArmMismatch(AmpbenchError):
    """The arm trained as something else than it asked. ``framework_ignored``: the framework itself did not apply
    the arm's setting (autocast off with none of the user's code on the stack: it ignores the flag on this device),
    and the arm is skipped, not refused."""

    def __init__(self, message: str, arm: str = "", framework_ignored: bool = False):
        super().__init__(message)
        self.arm, self.framework_ignored = arm, framework_ignored


def expected_dtype(policy: PrecisionPolicy) -> torch.dtype:
    """What the arm's matmuls and convolutions compute in."""
    return policy.autocast_dtype or policy.param_dtype


def _user_line(code: tuple[Path, ...]) -> str | None:
    """``file:line`` of the innermost frame on the current stack from the user's ``code`` (files or folders: the
    params' model and data code), None when there is none."""
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if not _ours_or_installed(frame.f_code.co_filename) and any(path == c or path.is_relative_to(c) for c in code):
            path = Path(frame.f_code.co_filename)
            shown = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
            return f"{shown}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _dtype(d: torch.dtype | None) -> str:
    return str(d).removeprefix("torch.") if d is not None else "none"


class StepBook:
    """The read-back of one Trainer's run (see the module docstring), fed by a framework's callback: ``epoch_start``,
    ``step_start`` / ``grads`` / ``step_end`` per step, ``record`` per epoch. ``count_flops``: count the first
    step's FLOPs by dtype (the preflight's dry step). ``divergence``: the guard's limits (train.divergence);
    ``task``: whose loss a non-finite loss with finite outputs is named after."""

    def __init__(self, arm: str, policy: PrecisionPolicy, float32: list[str], every: int, window: int,
                 warmup: int, count_flops: bool = False, user_code: tuple[Path, ...] = (),
                 divergence: DivergenceParams | None = None, task: Task = CLASSIFICATION):
        self.arm, self.policy, self.float32 = arm, policy, tuple(float32)
        self.user_code = tuple(Path(c).resolve() for c in user_code)  # where the model's code lies (its line)
        self.expect = expected_dtype(policy)
        self.every, self.window, self.warmup, self.count_flops = every, window, warmup, count_flops
        self.seen: dict[str, dict[str, str]] = {}  # module → what it computed in, on the last sampled step
        self.where: dict[str, str | None] = {}  # module → the user's line around its first 16-vs-32 surprise
        self.grad_dtypes: set[str] = set()
        self.flops: dict[str, Any] | None = None
        self._hooks: list[Any] = []
        self._counter: DtypeFlopCounter | None = None
        self.batches = 0  # training batches run by this Trainer
        self.all_windows: list[float] = []  # every timing window of the run, across epochs (the speed harness's)
        self.sampled = self.hooked = False  # this step: sampled; its module outputs hooked (a hunt)
        self.divergence, self.task = divergence or DivergenceParams(), task
        self.finder = NonFiniteFinder(every)
        # Made at the first step, from the framework's model and scaler (``_numerics``):
        self.model: nn.Module | None = None
        self.health: ScalerHealth | None = None
        self.probe: ActivationProbe | None = None
        self._open: list[Any] = []  # the step's scale watch and output hooks, closed as it ends
        self.scale = 1.0  # the loss scale a hooked step ran with

    # -- what ran -------------------------------------------------------------------------------------------------
    def _watch(self, module: nn.Module) -> None:
        for name, m in module.named_modules():
            if ((isinstance(m, MATMUL) or type(m).__name__ in MATMUL_NAMES)
                    and not any(name == f or name.startswith(f + ".") for f in self.float32)):
                self._hooks.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        device_type = self.policy.device_type

        def seen(m: nn.Module, args: Any, out: Any) -> None:
            if not isinstance(out, torch.Tensor) or name in self.seen:
                return
            on = torch.is_autocast_enabled(device_type)
            self.seen[name] = {"output": _dtype(out.dtype), "autocast": _dtype(torch.get_autocast_dtype(device_type))
                               if on else "off", "weight": _dtype(getattr(m, "weight", out).dtype)}
            if (out.dtype == torch.float32) != (self.expect == torch.float32) and name not in self.where:
                self.where[name] = _user_line(self.user_code)
        return seen

    def check(self) -> None:
        """ArmMismatch when a module's weights are not the arm's (16-bit weights under a mixed-precision or float32
        arm), or when the sampled step computed nothing in the arm's type (a 16-bit arm) or something in 16 bits (a
        float32 arm), naming the user's line on the stack when there was one."""
        if not self.seen:
            return
        weights = _dtype(self.policy.param_dtype)
        heavy = next(((n, s) for n, s in self.seen.items() if s["weight"] != weights), None)
        if heavy is not None:  # never a framework's doing for these arms: the model was cast or loaded so
            name, s = heavy
            raise ArmMismatch(f"the {self.arm} arm trained with {s['weight']} weights: {name}'s weights are "
                              f"{s['weight']}, not {weights} (your code casts or loads the model in it)", self.arm)
        if self.expect == torch.float32:
            odd = [(n, s) for n, s in self.seen.items() if s["output"] != "float32"]
        elif any(s["output"] == _dtype(self.expect) for s in self.seen.values()):
            return
        else:
            odd = list(self.seen.items())
        if not odd:
            return
        name, s = odd[0]
        where = self.where.get(name)
        if s["autocast"] == "off" and self.policy.autocast_dtype is not None:
            why = (f"autocast was off around {name} (your code turns it off or casts to float32)" if where else
                   f"autocast was off around {name}: the framework did not apply the arm's flag on "
                   f"{self.policy.device_type}")
        elif s["autocast"] != "off" and self.policy.autocast_dtype is None:
            why = f"autocast ({s['autocast']}) was on around {name}"
        else:
            why = f"{name} computed in {s['output']} with {s['weight']} weights and autocast {s['autocast']}"
        ignored = where is None and s["autocast"] == "off" and self.policy.autocast_dtype is not None
        raise ArmMismatch(f"the {self.arm} arm trained in {s['output']}: {why}" + (f" ({where})" if where else ""),
                          self.arm, ignored)

    def what_ran(self) -> dict[str, Any]:
        """The read-back, for the seed's record and its MLflow tags."""
        dtypes = sorted({s["output"] for s in self.seen.values()})
        return {"compute_dtypes": dtypes, "autocast": sorted({s["autocast"] for s in self.seen.values()}),
                "weight_dtypes": sorted({s["weight"] for s in self.seen.values()}),
                "grad_dtypes": sorted(self.grad_dtypes), "modules_read": len(self.seen)}

    # -- a run's steps and epochs ---------------------------------------------------------------------------------
    def epoch_start(self, device: torch.device, global_step: int) -> None:
        self.device = device
        self.loss_sum, self.samples = torch.zeros((), device=device), 0
        if self.health is not None:
            self.health.new_epoch()
        self.first_step, self.windows, self.steps = global_step, [], []
        self.t0 = self.t_last = self.t_window = time.perf_counter()
        self.in_window = 0

    def _numerics(self, module: nn.Module, scaler: Any) -> None:
        """At the first step: the guard on the framework's scaler (a disabled one for arms without), the probe on
        its model."""
        self.model = module
        scaler = scaler if scaler is not None else torch.amp.GradScaler(self.device.type, enabled=False)
        self.health = ScalerHealth(self.arm, scaler, self.divergence, self.device)
        self.probe = ActivationProbe(module, self.device)

    def step_start(self, module: nn.Module, scaler: Any) -> None:
        """Before a step's forward: dtype hooks on a sampled step, output hooks while hunting an uncaught skip, the
        loss scale's watch, the FLOP counter on the first."""
        signals.checkpoint()  # a signal a finalizer swallowed stops training here
        if self.health is None:
            self._numerics(module, scaler)
        self.sampled = self.batches % self.every == 0
        self.hooked = self.finder.hunting
        if self.sampled:
            self.seen = {}
            self._watch(module)
        self.scale = self.health.loss_scale if self.hooked else 1.0
        self._enter(self.health.watch())
        if self.hooked:
            self._enter(self.probe.attached(backward=False))
        if self.count_flops and self.batches == 0:
            self._counter = DtypeFlopCounter().__enter__()

    def _enter(self, context: Any) -> None:
        context.__enter__()
        self._open.append(context)

    def _end_step(self) -> None:
        """The step's scale watch (it counts a skip) and output hooks, closed; the sampled step's dtype hooks off."""
        while self._open:
            self._open.pop().__exit__(None, None, None)
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def close(self) -> None:
        """Whatever a step left in place when it ended by an exception (the user's code refused, an interruption):
        the FLOP counter's dispatch mode, which would stay pushed for every later torch call of the process, and
        the sampled step's hooks. Each framework's run calls it as it ends, however it ends."""
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None
        self._end_step()

    def grads(self, module: nn.Module) -> None:
        """Before the optimizer steps: the gradients' dtypes, on a sampled step."""
        if self.sampled:
            self.grad_dtypes = {_dtype(p.grad.dtype) for p in module.parameters() if p.grad is not None}

    def step_end(self, loss: torch.Tensor | None, n: int, scaler: Any, global_step: int) -> None:
        """After the optimizer step: ``loss`` (the step's, None when unseen) over ``n`` examples. On a sampled step
        the read-back's check and the divergence guard (Diverged, naming the first non-finite module caught)."""
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops, self._counter = flop_summary(self._counter.flops, n), None
        self._end_step()
        loss = loss.detach().float() if loss is not None else None
        if loss is not None:
            self.loss_sum += loss * n
        self.samples += n
        self.batches += 1
        if self.hooked:
            # No replay: the framework's step is its own (the batch, the user's loss), so a culprit comes from the
            # hooked steps themselves.
            bad = self.health.went_bad(loss if loss is not None else self.loss_sum)
            self.finder.after_step(self.probe, bad, global_step, self.scale, None, loss, self.task)
        if self.sampled:
            self.check()
            skipped = self.health.skipped_steps()
            self.finder.skips_seen(skipped)
            self.steps.append({"step": global_step, "loss": float(loss) if loss is not None else math.nan,
                               "loss_scale": self.health.loss_scale, "skipped_in_epoch": skipped})
            self._guard(global_step)
        self.in_window += n
        if self.batches > self.warmup and self.batches % self.window == 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            if self.batches - self.window >= self.warmup:
                self.windows.append(self.in_window / (now - self.t_window))
                self.all_windows.append(self.windows[-1])
            self.t_window, self.in_window = now, 0
        self.t_last = time.perf_counter()

    def _guard(self, global_step: int) -> None:
        """The divergence check of a sampled step: Diverged naming the first non-finite module caught (no
        activation table: the hunt's steps are the bad ones, not a sample of the run)."""
        try:
            self.health.check(self.loss_sum, f"step {global_step}")
        except Diverged as exc:
            raise self.finder.explain(exc, self.model, self.policy, None, None, 1.0, global_step,
                                      self.health.loss_scale, [], self.task) from None

    def record(self, epoch: int, global_step: int, val: tuple[float, float], scaler: Any,
               lr: float) -> EpochRecord:
        """The epoch just trained (``epoch``, 1-based) as the pipeline's ``EpochRecord``."""
        seconds = max(self.t_last - self.t0, 1e-9)  # the epoch's training, not the framework's evaluation after it
        return EpochRecord(
            epoch=epoch, train_loss=(self.loss_sum / max(self.samples, 1)).item(),
            train_accuracy=math.nan,  # the module's logits are its own business during training
            val_loss=val[0], val_accuracy=val[1], samples_per_s=self.samples / seconds, epoch_seconds=seconds,
            loss_scale=float(scaler.get_scale()) if scaler is not None else 1.0,
            skipped_steps=self.health.skipped_steps() if self.health is not None else 0,
            optimizer_steps=global_step - self.first_step, input_wait_seconds=math.nan, lr=lr, grads={},
            steps=self.steps, windows=self.windows, activations=[], nonfinite=self.finder.take(),
            evaluations=[{"step": global_step, "seconds": seconds, "val_loss": val[0]}])


def batch_size(batch: Any) -> int:
    """Examples in a batch: the first dimension of its first tensor."""
    first = batch
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    return len(first) if isinstance(first, torch.Tensor) and first.ndim else 1
