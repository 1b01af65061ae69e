"""Numerics a user can act on: activation ranges per module, the first module that went non-finite, and the FLOPs
each dtype computed.

- ``ActivationProbe``: hooks attached only around sampled steps (``train.telemetry_every``; outside them the model
  runs untouched) record per module the largest |output| (over every element) and the shares of outputs float16
  would turn into inf or 0 (the thresholds of ``telemetry.py``; counted on an evenly strided sample of at most
  ``SAMPLE`` elements per tensor), on the device; the same hooks note, for that step, which modules' outputs
  (forward order) and input gradients (backward order) were not finite, so a bad hooked step names its culprit.
- ``NonFiniteFinder``: which hooked step to blame; hunts uncaught skips; at divergence with nothing caught,
  ``replay_first_nonfinite`` replays the batch through the unwrapped model with the probe attached (random state
  forked, buffers and gradients put back, no optimizer step).
- ``count_step_flops``: one forward and backward counted at the dispatcher level: FLOPs of matmul, convolution
  and attention by the dtype they computed in (float32 on CUDA with TF32 on counts as tf32).

Module names are ``model.named_modules()`` names; the whole model is ``(model)``.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ampbench.telemetry import FP16_INF_AT_OR_ABOVE, FP16_ZERO_AT_OR_BELOW

FP16_MAX = 65504.0
ROOT = "(model)"
# Columns of the per-module count table, accumulated over sampled steps ("elements" is counted on the host).
_COLS = ("elements", "nonzero", "underflow", "overflow", "nonfinite")
_DEVICE_COLS = _COLS[1:]
SAMPLE = 2**16  # elements per output tensor that the shares are counted on (the maximum uses all of them)


def _float_tensors(output: Any) -> list[torch.Tensor]:
    """The floating-point tensors in a module's output (a tensor, or tuples/lists/dicts of them)."""
    if isinstance(output, torch.Tensor):  # the common case, without pytree's walk
        return [output] if output.is_floating_point() else []
    return [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


@dataclass(frozen=True)
class Culprit:
    """The first module whose output (forward), input gradient (backward) or weight gradient was not finite in one
    step, or whose weights already were not."""

    module: str
    module_type: str
    phase: str  # forward | backward | weight_grad | weights (already non-finite before the step) | none
    step: int  # optimizer step (1-based over the run)
    loss_scale: float  # the scale the step ran with (1.0 without a scaler)
    how: str  # "sampled step" | "replayed step"

    def __str__(self) -> str:
        if self.phase == "none":
            return f"no non-finite value in a replay of step {self.step}"
        what = {"forward": "output", "backward": "input gradient (its backward)", "weight_grad": "weight gradient",
                "weights": "weights"}[self.phase]
        scale = f", loss scale {self.loss_scale:g}" if self.loss_scale != 1.0 else ""
        return f"first non-finite {what} in module '{self.module}' ({self.module_type}) at step {self.step}{scale}"

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "module_type": self.module_type, "phase": self.phase, "step": self.step,
                "loss_scale": self.loss_scale, "how": self.how, "message": str(self)}


class ActivationProbe:
    """Per-module output statistics over sampled steps, and the step's first non-finite module.

    ``with probe.attached():`` around a training step adds the hooks; outside it the model runs untouched.
    """

    def __init__(self, model: nn.Module, device: torch.device):
        self.model = model
        self.names = [name or ROOT for name, _ in model.named_modules()]
        self.types = [type(m).__name__ for _, m in model.named_modules()]
        n = len(self.names)
        self.elements = [0] * n
        self.counts = torch.zeros((n, len(_DEVICE_COLS)), device=device, dtype=torch.float64)
        self.maxima = torch.zeros(n, device=device, dtype=torch.float64)
        self.samples = 0
        self._bad_fwd = torch.zeros(n, device=device, dtype=torch.bool)
        self._bad_bwd = torch.zeros(n, device=device, dtype=torch.bool)
        self._fwd_order: list[int] = []
        self._bwd_order: list[int] = []
        self._seen: dict[int, weakref.ref] = {}
        self._consumer: dict[int, tuple[weakref.ref, int]] = {}  # input tensor → the innermost module taking it

    @torch.no_grad()
    def _record(self, i: int, output: Any) -> None:
        tensors = [t for t in _float_tensors(output) if not self._seen_this_step(t)]
        if not tensors:
            return
        self._fwd_order.append(i)
        for t in tensors:
            flat = t.detach().view(-1) if t.is_contiguous() else t.detach().reshape(-1)
            if flat.numel() == 0:
                continue
            # The largest |x| over every element: one pass, no copy (aminmax is ~10× faster on CPU than an inf-norm
            # or isfinite().all()); inf and NaN propagate into it.
            lo, hi = torch.aminmax(flat)
            top = torch.maximum(-lo.double(), hi.double())
            self.maxima[i] = torch.maximum(self.maxima[i], torch.nan_to_num(top, nan=math.inf, posinf=math.inf))
            self._bad_fwd[i] |= ~torch.isfinite(top)
            # The shares from an evenly strided sample of at most SAMPLE elements: a few passes over every
            # activation would cost more than the step itself on small models.
            stride = max(1, flat.numel() // SAMPLE)
            a = flat[::stride].abs().float()
            self.elements[i] += len(range(0, flat.numel(), stride))
            nz = a != 0
            self.counts[i] += torch.stack([nz.sum(), (nz & (a <= FP16_ZERO_AT_OR_BELOW)).sum(),
                                           (a >= FP16_INF_AT_OR_ABOVE).sum(), (~torch.isfinite(a)).sum()]).double()

    def _inputs(self, i: int, args: tuple, kwargs: dict) -> None:
        """Before module ``i`` runs: a gradient hook on each input that needs one. The gradient of an input is what
        this module's backward produced, so a non-finite one names the module whose backward overflowed. A tensor
        several modules take (a container and its first child) is named after the innermost, which runs last."""
        for t in _float_tensors((args, kwargs)):
            if not t.requires_grad:
                continue
            known = self._consumer.get(id(t))
            self._consumer[id(t)] = (weakref.ref(t), i)
            if known is None or known[0]() is not t:
                key = id(t)
                t.register_hook(lambda g, key=key: self._grad(self._consumer[key][1], g))

    def _seen_this_step(self, t: torch.Tensor) -> bool:
        """Whether ``t`` was already recorded this step (a container returns its last child's output): a weak
        reference, so no activation lives longer than training keeps it."""
        ref = self._seen.get(id(t))
        if ref is not None and ref() is t:
            return True
        self._seen[id(t)] = weakref.ref(t)
        return False

    @torch.no_grad()
    def _grad(self, i: int, grad: torch.Tensor) -> None:
        self._bwd_order.append(i)
        if grad.numel():
            lo, hi = torch.aminmax(grad)
            self._bad_bwd[i] |= ~(torch.isfinite(lo) & torch.isfinite(hi))

    @contextlib.contextmanager
    def attached(self, backward: bool = True):
        """Hooks on every module for one step: outputs, and with ``backward`` the input gradients too (a pass
        over every gradient: training's sampled steps leave it to a replay of a bad step)."""
        self._bad_fwd.zero_()
        self._bad_bwd.zero_()
        self._fwd_order, self._bwd_order, self._seen, self._consumer = [], [], {}, {}
        handles = []
        for i, (_, m) in enumerate(self.model.named_modules()):
            if backward:
                handles.append(m.register_forward_pre_hook(lambda mod, args, kw, i=i: self._inputs(i, args, kw),
                                                           with_kwargs=True))
            handles.append(m.register_forward_hook(lambda mod, args, out, i=i: self._record(i, out)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self._seen = {}
        self.samples += 1

    def culprit(self) -> tuple[str, int] | None:
        """(phase, module index) of the last attached step's first non-finite module: outputs in forward order
        (hooks fire as modules finish, so a module that made it non-finite itself comes before its containers),
        then input gradients in backward order (the module whose backward made them), then weight gradients;
        None if everything was finite."""
        for phase, order, bad in (("forward", self._fwd_order, self._bad_fwd),
                                  ("backward", self._bwd_order, self._bad_bwd)):
            if order:
                flags = bad[torch.tensor(order, device=bad.device)].cpu().tolist()
                if any(flags):
                    return phase, order[flags.index(True)]
        # Finite outputs and output gradients can still give a non-finite weight gradient (its matmul overflows):
        # the last module in registration order, i.e. the first backward reaches, holding one.
        modules = [m for _, m in self.model.named_modules()]
        for i in reversed(range(len(modules))):
            grads = [p.grad for p in modules[i].parameters(recurse=False) if p.grad is not None]
            if grads and not all(bool(torch.isfinite(g).all()) for g in grads):
                return "weight_grad", i
        return None

    def table(self) -> list[dict[str, Any]]:
        """Per-module rows (counts, so tables of several epochs or seeds merge by ``merge_tables``)."""
        counts, maxima = self.counts.cpu().tolist(), self.maxima.cpu().tolist()
        rows = []
        for name, kind, n, c, mx in zip(self.names, self.types, self.elements, counts, maxima, strict=True):
            c = [n, *c]
            if n == 0:
                continue  # no floating output in the sampled steps (e.g. a container of non-tensor outputs)
            rows.append({"module": name, "type": kind, "max_abs": mx, "samples": self.samples,
                         **{col: int(v) for col, v in zip(_COLS, c, strict=True)}})
        return rows

    def take(self) -> list[dict[str, Any]]:
        """The table so far, and a fresh one."""
        table = self.table()
        self.reset()
        return table

    def reset(self) -> None:
        self.counts.zero_()
        self.maxima.zero_()
        self.elements = [0] * len(self.names)
        self.samples = 0


def headroom_log2(max_abs: float) -> float:
    """Powers of two between the largest |output| seen and float16's largest finite value (negative: overflows;
    inf when nothing but zeros was seen)."""
    if max_abs <= 0:
        return math.inf
    if not math.isfinite(max_abs):
        return -math.inf
    return math.log2(FP16_MAX / max_abs)


def merge_tables(tables: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Several per-module tables (epochs, seeds) as one: counts summed, the maximum kept; with the shares
    ``overflow_frac`` (of all outputs), ``underflow_frac`` (of the non-zero ones) and ``headroom_log2``; sorted
    closest to float16's top first. In the JSON files a non-finite ``max_abs`` or ``headroom_log2`` is null."""
    merged: dict[str, dict[str, Any]] = {}
    for table in tables:
        for row in table:
            m = merged.setdefault(row["module"], {"module": row["module"], "type": row["type"], "max_abs": 0.0,
                                                  "samples": 0, **{c: 0 for c in _COLS}})
            # JSON files hold a non-finite maximum as null (fileio writes strict JSON)
            m["max_abs"] = max(m["max_abs"], math.inf if row["max_abs"] is None else row["max_abs"])
            m["samples"] += row["samples"]
            for c in _COLS:
                m[c] += row[c]
    rows = []
    for m in merged.values():
        m["overflow_frac"] = m["overflow"] / m["elements"] if m["elements"] else 0.0
        m["underflow_frac"] = m["underflow"] / m["nonzero"] if m["nonzero"] else 0.0
        m["headroom_log2"] = headroom_log2(m["max_abs"])
        rows.append(m)
    return sorted(rows, key=lambda r: (r["headroom_log2"], -r["overflow_frac"]))


class NonFiniteFinder:
    """Which module went non-finite first, per epoch, from the steps the probe was attached to.

    Sampled steps are hooked anyway; a bad one (skipped by the scaler, or a non-finite loss) names its culprit
    from its own hooks. When the sampled check sees skips that no hooked step caught, the next ``hunt_steps``
    steps are hooked too, so a recurring overflow is caught in the act. At divergence with nothing caught, the
    current batch is replayed (``replay_first_nonfinite``).
    """

    def __init__(self, hunt_steps: int):
        self.hunt_steps = hunt_steps
        self.hunting_left = 0
        self.caught = 0  # bad hooked steps this epoch
        self.first: Culprit | None = None  # this epoch's first culprit
        self.run_first: Culprit | None = None  # the first of the whole run (this process)

    @property
    def hunting(self) -> bool:
        return self.hunting_left > 0

    def after_step(self, probe: ActivationProbe, bad: torch.Tensor, step: int, scale: float,
                   replay: Callable[[], Culprit] | None = None) -> None:
        """After a hooked step (output hooks only); ``bad``: its device flag (one host read). A bad step with
        finite outputs overflowed in the backward: ``replay`` (given when the step left the weights as they were,
        i.e. the scaler skipped it) reruns it with gradient hooks; otherwise the weight gradients name it."""
        self.hunting_left = max(self.hunting_left - 1, 0)
        if not bool(bad):
            return
        self.caught += 1
        self.hunting_left = 0
        if self.first is not None:
            return
        found = probe.culprit()
        if (found is None or found[0] == "weight_grad") and replay is not None:
            replayed = replay()
            if replayed.phase != "none":
                self.first = replayed
        if self.first is None and found is not None:
            phase, i = found
            self.first = Culprit(probe.names[i], probe.types[i], phase, step, scale, "sampled step")
        self.run_first = self.run_first or self.first

    def skips_seen(self, skipped_in_epoch: int) -> None:
        """At a sampled check: skips this epoch beyond those caught start a hunt (once per epoch)."""
        if skipped_in_epoch > self.caught and self.first is None and not self.hunting:
            self.hunting_left = self.hunt_steps
            self.caught = skipped_in_epoch  # a hunt per new batch of uncaught skips, not per check

    def explain(self, exc: Exception, model: nn.Module, policy, x: torch.Tensor | None, y: torch.Tensor | None,
                loss_multiplier: float, step: int, scale: float, activations: list | None = None):
        """``exc`` (a monitor.Diverged) again, naming the culprit: the run's first caught, else a replay of
        (``x``, ``y``) at ``scale`` (no batch: no replay; a replay that stays finite is said as such)."""
        from ampbench.monitor import Diverged

        culprit = self.run_first
        if culprit is None and x is not None:
            culprit = replay_first_nonfinite(model, policy, x, y, scale, loss_multiplier, step)
        if culprit is None or culprit.phase == "none":
            return Diverged(f"{exc}" + (f"; {culprit}" if culprit else ""), activations=activations)
        return Diverged(f"{exc}; {culprit}", culprit=culprit.to_dict(), activations=activations)

    def take(self) -> dict[str, Any] | None:
        """This epoch's first culprit (as a dict), and a fresh epoch."""
        first, self.first, self.caught, self.hunting_left = self.first, None, 0, 0
        return first.to_dict() if first else None


@torch.no_grad()
def first_nonfinite_weights(model: nn.Module) -> str | None:
    """The first module (registration order) holding a non-finite parameter, or None."""
    for name, module in model.named_modules():
        if any(not torch.isfinite(p).all() for p in module.parameters(recurse=False)):
            return name or ROOT
    return None


@contextlib.contextmanager
def side_effect_free(model: nn.Module):
    """Run a forward/backward on ``model`` without changing training: random state forked (dropout), buffers
    (BatchNorm statistics) and gradients put back afterwards."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    grads = {p: p.grad for p in model.parameters()}
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(buffers[k])
        for p, g in grads.items():
            p.grad = g


def _forward_backward(model: nn.Module, policy, x: torch.Tensor, y: torch.Tensor, scale: float,
                      loss_multiplier: float) -> None:
    """The training step's forward and backward, as ``training.train_step`` does them, without the optimizer."""
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    with policy.autocast():
        loss = F.cross_entropy(model(x).float(), y)
    (loss * loss_multiplier * scale).backward()


def replay_first_nonfinite(model: nn.Module, policy, x: torch.Tensor, y: torch.Tensor, scale: float,
                           loss_multiplier: float, step: int) -> Culprit:
    """Replay one step's forward and backward (at loss scale ``scale``) with the probe attached and name the first
    module whose output or output gradient was not finite; weights already non-finite are named as such (the
    step that made them so was earlier and not sampled). Training is unaffected (``side_effect_free``)."""
    device = next(model.parameters()).device
    modules = [m for _, m in model.named_modules()]
    bad_weights = first_nonfinite_weights(model)
    if bad_weights is not None:
        module = model.get_submodule("" if bad_weights == ROOT else bad_weights)
        return Culprit(bad_weights, type(module).__name__, "weights", step, scale, "replayed step")
    probe = ActivationProbe(model, device)
    with side_effect_free(model), probe.attached():
        _forward_backward(model, policy, x, y, scale, loss_multiplier)
    found = probe.culprit()
    if found is None:
        return Culprit("(none: the replay stayed finite)", "-", "none", step, scale, "replayed step")
    phase, i = found
    return Culprit(probe.names[i], type(modules[i]).__name__, phase, step, scale, "replayed step")


# --- FLOPs by dtype ----------------------------------------------------------------------------------------------

_KINDS = {  # aten op name → what it computes (the FLOP counter's registry says how many)
    "mm": "matmul", "addmm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "_scaled_mm": "matmul",
    "convolution": "conv", "_convolution": "conv", "cudnn_convolution": "conv", "convolution_backward": "conv",
    "convolution_overrideable": "conv", "_slow_conv2d_forward": "conv",
    "_scaled_dot_product_efficient_attention": "attention", "_scaled_dot_product_flash_attention": "attention",
    "_scaled_dot_product_cudnn_attention": "attention", "_flash_attention_forward": "attention",
    "_efficient_attention_forward": "attention", "_scaled_dot_product_efficient_attention_backward": "attention",
    "_scaled_dot_product_flash_attention_backward": "attention", "_flash_attention_backward": "attention",
    "_efficient_attention_backward": "attention", "_scaled_dot_product_cudnn_attention_backward": "attention",
}
LOW = ("float16", "bfloat16")


def _dtype_label(dtype: torch.dtype, device_type: str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name == "float32" and device_type == "cuda" and torch.backends.cuda.matmul.fp32_precision == "tf32":
        return "tf32"  # float32 operands on tensor cores in TF32 (the cuDNN flag is set together: precision.py)
    return name


class DtypeFlopCounter(TorchDispatchMode):
    """Counts FLOPs of matmul, convolution and attention per (kind, dtype) at the dispatcher, with torch's own
    per-op formulas (``torch.utils.flop_counter``); the dtype is the first floating operand's. An op without a
    formula is decomposed where torch can (as torch's ``FlopCounterMode`` does: e.g. the CPU attention kernel
    becomes the matmuls it stands for, counted as matmul)."""

    def __init__(self):
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.flops: dict[tuple[str, str], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in self.registry:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        kind = _KINDS.get(packet.__name__)
        if kind is not None and packet in self.registry:
            operand = next((t for t in tree_flatten((args, kwargs))[0]
                            if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
            if operand is not None:
                key = (kind, _dtype_label(operand.dtype, operand.device.type))
                self.flops[key] = self.flops.get(key, 0) + int(self.registry[packet](*args, **kwargs, out_val=out))
        return out


def flop_summary(flops: dict[tuple[str, str], int], samples: int) -> dict[str, Any]:
    """Counted FLOPs as a record: per kind and dtype, per sample, the 16-bit share and the dominant dtype."""
    total = sum(flops.values())
    by_dtype: dict[str, int] = {}
    for (_, dtype), n in flops.items():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n
    low = sum(n for d, n in by_dtype.items() if d in LOW)
    return {"samples": samples, "total": total, "per_sample": total / samples if samples else 0.0,
            "by_kind_dtype": {f"{k}/{d}": n for (k, d), n in sorted(flops.items())},
            "by_dtype": dict(sorted(by_dtype.items())), "low_precision_share": low / total if total else 0.0,
            "dominant_dtype": max(by_dtype, key=by_dtype.get) if by_dtype else None}


def count_step_flops(model: nn.Module, policy, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """FLOPs of one training step's forward and backward on ``x`` (as ``flop_summary``), counted on ``model``
    without changing its training (``side_effect_free``); the optimizer's own arithmetic is not counted."""
    counter = DtypeFlopCounter()
    with side_effect_free(model):
        with counter:
            _forward_backward(model, policy, x, y, 1.0, 1.0)
        model.zero_grad(set_to_none=True)
    return flop_summary(counter.flops, len(x))
