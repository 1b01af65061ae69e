"""Activation ranges per module: how close each module's outputs come to float16's limits, on sampled steps.

``ActivationProbe``: hooks attached only around sampled steps (``train.telemetry_every``; outside them the model
runs untouched) record per module the largest |output| (over every element) and the shares of outputs float16
would turn into inf or 0 (the thresholds of ``gradients.py``; counted on an evenly strided sample of at most
``SAMPLE`` elements per tensor), on the device; the same hooks note, for that step, which modules' outputs
(forward order) and input gradients (backward order) were not finite, so a bad hooked step names its culprit
(``nonfinite.py`` decides which step to blame). ``merge_tables`` sums tables of several epochs or seeds.

Module names are ``model.named_modules()`` names; the whole model is ``(model)``.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ampbench.training.gradients import FP16_INF_AT_OR_ABOVE, FP16_ZERO_AT_OR_BELOW

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
        self._bad_in = torch.zeros(n, device=device, dtype=torch.bool)  # a non-finite input reached the module
        self._bad_bwd = torch.zeros(n, device=device, dtype=torch.bool)
        index = {name: i for i, name in enumerate(self.names)}
        self._parent = [None if name == ROOT else index[name.rpartition(".")[0] or ROOT] for name in self.names]
        self._fwd_order: list[int] = []
        self._bwd_order: list[int] = []
        self._seen: dict[int, tuple[weakref.ref, int]] = {}  # output tensor → the module that gave it
        self._consumer: dict[int, tuple[weakref.ref, int]] = {}  # input tensor → the innermost module taking it

    @torch.no_grad()
    def _record(self, i: int, args: tuple, output: Any) -> None:
        self._check_inputs(i, args)
        tensors = [t for t in _float_tensors(output) if self._seen_this_step(t, i) is None]
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

    def _seen_this_step(self, t: torch.Tensor, i: int | None = None) -> int | None:
        """The module that already output ``t`` this step (a container returns its last child's output), else
        None, and ``t`` is now module ``i``'s: a weak reference, so no activation lives longer than training
        keeps it."""
        known = self._seen.get(id(t))
        if known is not None and known[0]() is t:
            return known[1]
        if i is not None:
            self._seen[id(t)] = (weakref.ref(t), i)
        return None

    def _check_inputs(self, i: int, args: tuple) -> None:
        """Whether module ``i`` got a non-finite input: known for an earlier module's output, measured (one pass)
        for what the parent's own code computed (e.g. attention scores between two Linear layers)."""
        for t in _float_tensors(args):
            j = self._seen_this_step(t)
            if j is not None:
                self._bad_in[i] |= self._bad_fwd[j]
            elif t.numel():
                lo, hi = torch.aminmax(t.detach())
                self._bad_in[i] |= ~(torch.isfinite(lo) & torch.isfinite(hi))

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
        self._bad_in.zero_()
        self._bad_bwd.zero_()
        self._fwd_order, self._bwd_order, self._seen, self._consumer = [], [], {}, {}
        handles = []
        for i, (_, m) in enumerate(self.model.named_modules()):
            if backward:
                handles.append(m.register_forward_pre_hook(lambda mod, args, kw, i=i: self._inputs(i, args, kw),
                                                           with_kwargs=True))
            handles.append(m.register_forward_hook(lambda mod, args, out, i=i: self._record(i, args, out)))
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
        None if everything was finite. A first non-finite output from a non-finite input was made by the code of
        a containing module between its children: the innermost container whose own inputs were finite."""
        for phase, order, bad in (("forward", self._fwd_order, self._bad_fwd),
                                  ("backward", self._bwd_order, self._bad_bwd)):
            if order:
                flags = bad[torch.tensor(order, device=bad.device)].cpu().tolist()
                if any(flags):
                    i = order[flags.index(True)]
                    if phase == "forward":
                        bad_in = self._bad_in.cpu().tolist()
                        while bad_in[i] and self._parent[i] is not None:
                            i = self._parent[i]
                    return phase, i
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
            # JSON files hold a non-finite maximum as null (runtime/files.py writes strict JSON)
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

