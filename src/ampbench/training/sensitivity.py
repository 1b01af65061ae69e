"""Which module needs float32 when nothing overflows: a ranking measured on a trained float32 model, without
training.

For every candidate module (every named module but the model itself and a wrapper of all of it: leaves and the
modules that hold them, named as ``train.fp32_modules`` names them), on the same inputs, the error of the model's
output (its logits, centred per example: softmax ignores a shift) relative to how much that output varies between
examples:

- ``kept``: the whole model under the arm's autocast but that module kept in float32 by ``train.fp32_modules``' own
  mechanism (``policy.keep_float32``: its inputs cast to float32, autocast off inside). This is the ranking, lowest
  first: it measures the fix itself. It finds a module that is lossy by itself (a matmul on features around a large
  origin), one that is lossy because of the dtype of what it receives (an elementwise op after a 16-bit matmul, where
  the island's float32 inputs are the fix), and a parent whose own arithmetic between its children is the loss.
- ``alone``: only that module under the arm's autocast, everything else in float32: what the module by itself does
  to the output. It does not see a module whose loss comes from its 16-bit inputs; it is shown beside ``kept``
  (autocast arms only: NaN, shown as —, for the others).
- ``arm``: the error with nothing kept, over the same inputs.

The arms that change the model itself, the *_pure ablations (16-bit weights) and the float8 arms (torchao's float8
Linear layers under bf16 autocast), are ranked on copies: the arm's model as the train stage prepares it
(``PrecisionPolicy.prepare_model``), once as it is and once per candidate with that module in
``train.fp32_modules`` (kept in float32 weights and, for float8, out of torchao's conversion). One copy at a time:
the memory of the model once more.

A ranking is not a verdict: an output error on a few batches need not change what training reaches, and an error
that is small per step can accumulate over training. Train with the suggested ``train.fp32_modules`` and let the
evaluate stage judge it. When no single module removes most of the arm's error, several may be needed together: the
ranking's top is where to start. No files or MLflow here.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from dataclasses import dataclass

import torch
from torch import nn

from ampbench.errors import ParamsError
from ampbench.precision.policy import PrecisionPolicy, keep_float32, without_float32
from ampbench.tasks.contract import Task


@dataclass(frozen=True)
class ModuleError:
    """One candidate's errors (relative, of the centred output; 0 is exact)."""

    module: str
    kind: str  # its class name
    parameters: int
    kept: float  # the arm everywhere but this module (the ranking)
    alone: float  # only this module in the arm's precision (NaN: not measured, an arm that changes the model)


@dataclass(frozen=True)
class Ranking:
    """The candidates by ``kept``, lowest first, and the arm's own error over the same inputs."""

    arm: str
    arm_error: float
    modules: list[ModuleError]
    inputs: int  # examples the errors were measured on


def candidates(model: nn.Module) -> list[str]:
    """Every named module but the model itself and those that hold all of its parameters (a wrapper, such as a
    LightningModule's ``net``: kept in float32 it is the whole model in float32, which the train stage refuses), in
    ``named_modules`` order."""
    total = sum(p.numel() for p in model.parameters())
    return [name for name, module in model.named_modules()
            if name and not (total and sum(p.numel() for p in module.parameters()) == total)]


def rank(model: nn.Module, policy: PrecisionPolicy, inputs: list[torch.Tensor], task: Task) -> Ranking:
    """Rank ``model``'s candidate modules (``candidates``) for ``policy``'s arm on ``inputs`` (batches of model
    inputs on the model's device). ``model``: float32 weights; it is left as it was."""
    if not policy.low_precision and not policy.float8_recipe:
        raise ParamsError(f"{policy.name} computes in float32: no module of it to keep in float32")
    names = candidates(model)
    if not names:
        raise ParamsError("the model has no submodule to keep in float32")
    was_training = model.training
    model.eval()
    try:
        reference = _outputs(model, inputs, task)
        if policy.param_dtype != torch.float32 or policy.float8_recipe:
            rows = [ModuleError(name, type(model.get_submodule(name)).__name__,
                                sum(p.numel() for p in model.get_submodule(name).parameters()),
                                _on_a_copy(model, policy, (name,), inputs, task, reference), float("nan"))
                    for name in names]
            return _ranked(policy, _on_a_copy(model, policy, (), inputs, task, reference), rows, inputs)
        with policy.autocast():
            arm_error = _error(_outputs(model, inputs, task), reference)
        rows = []
        for name in names:
            module = model.get_submodule(name)
            with _alone_in(module, policy):
                alone = _error(_outputs(model, inputs, task), reference)
            keep_float32(model, [name], policy.device_type, policy.param_dtype)
            try:
                with policy.autocast():
                    kept = _error(_outputs(model, inputs, task), reference)
            finally:
                without_float32(module)
            rows.append(ModuleError(name, type(module).__name__, sum(p.numel() for p in module.parameters()),
                                    kept, alone))
    finally:
        model.train(was_training)
    return _ranked(policy, arm_error, rows, inputs)


def _ranked(policy: PrecisionPolicy, arm_error: float, rows: list[ModuleError],
            inputs: list[torch.Tensor]) -> Ranking:
    """The best fix first; of equal fixes, the module lossier alone, then the smaller."""
    rows.sort(key=lambda r: (r.kept, -(r.alone if r.alone == r.alone else 0.0), r.parameters, r.module))
    return Ranking(policy.name, arm_error, rows, sum(len(x) for x in inputs))


def _on_a_copy(model: nn.Module, policy: PrecisionPolicy, kept: tuple[str, ...], inputs: list[torch.Tensor],
               task: Task, reference: list[torch.Tensor]) -> float:
    """The output's error of the arm's own model, prepared from a copy of ``model`` as the train stage prepares it
    with ``kept`` in train.fp32_modules (16-bit weights, float8 layers, the float32 islands)."""
    arm = dataclasses.replace(policy, fp32_modules=kept)
    prepared = arm.prepare_model(copy.deepcopy(model)).eval()
    with arm.autocast():
        return _error(_outputs(prepared, [arm.cast_input(x) for x in inputs], task), reference)


@torch.no_grad()
def _outputs(model: nn.Module, inputs: list[torch.Tensor], task: Task) -> list[torch.Tensor]:
    """The model's logits for each batch, float32, centred over the last dimension."""
    out = []
    for x in inputs:
        logits = task.logits(model(x)).float()
        out.append(logits - logits.mean(dim=-1, keepdim=True))
    return out


def _error(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """‖outputs − reference‖ over every batch, relative to how much the reference varies between the batch's
    examples (‖reference − its mean over the examples‖): the part of the output that tells examples apart. Against
    the output's whole size, a large offset that every example shares would hide the loss of exactly that part
    (features around a large origin). Inf when an output is not finite, or the reference does not vary."""
    diff = sum(float((o - r).double().pow(2).sum()) for o, r in zip(outputs, reference, strict=True))
    spread = sum(float((r - r.mean(dim=0, keepdim=True)).double().pow(2).sum()) for r in reference)
    return (diff / spread) ** 0.5 if spread > 0 and diff == diff else float("inf")


class _alone_in:
    """Within the block, ``module`` alone runs under the policy's autocast (its forward wrapped on the instance,
    its floating outputs back to float32 for the float32 model around it)."""

    def __init__(self, module: nn.Module, policy: PrecisionPolicy):
        self.module, self.policy = module, policy

    def __enter__(self) -> None:
        policy = self.policy

        def forward(inner: nn.Module, *args, **kwargs):
            with policy.autocast():
                out = type(inner).forward(inner, *args, **kwargs)
            return torch.utils._pytree.tree_map(
                lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)

        self.module.forward = types.MethodType(forward, self.module)

    def __exit__(self, *exc) -> None:
        del self.module.__dict__["forward"]
