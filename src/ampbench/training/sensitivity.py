"""Which module needs float32 when nothing overflows: a ranking measured on a trained float32 model, without
training.

For every candidate module (every named module but the model itself: leaves and the modules that hold them, named
as ``train.fp32_modules`` names them), on the same inputs, the error of the model's output (its logits, centred per
example: softmax ignores a shift) relative to how much that output varies between examples:

- ``kept``: the whole model under the arm's autocast but that module kept in float32 by ``train.fp32_modules``' own
  mechanism (``policy.keep_float32``: its inputs cast to float32, autocast off inside). This is the ranking, lowest
  first: it measures the fix itself. It finds a module that is lossy by itself (a matmul on features around a large
  origin), one that is lossy because of the dtype of what it receives (an elementwise op after a 16-bit matmul, where
  the island's float32 inputs are the fix), and a parent whose own arithmetic between its children is the loss.
- ``alone``: only that module under the arm's autocast, everything else in float32: what the module by itself does
  to the output. It does not see a module whose loss comes from its 16-bit inputs; it is shown beside ``kept``.
- ``arm``: the error with nothing kept, over the same inputs.

A ranking is not a verdict: an output error on a few batches need not change what training reaches, and an error
that is small per step can accumulate over training. Train with the suggested ``train.fp32_modules`` and let the
evaluate stage judge it. When no single module removes most of the arm's error, several may be needed together: the
ranking's top is where to start. Autocast arms only (fp16, bf16 and their ablations); the pure and float8 arms
change weights and layers, which this measure does not model. No files or MLflow here.
"""

from __future__ import annotations

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
    alone: float  # only this module in the arm's precision


@dataclass(frozen=True)
class Ranking:
    """The candidates by ``kept``, lowest first, and the arm's own error over the same inputs."""

    arm: str
    arm_error: float
    modules: list[ModuleError]
    inputs: int  # examples the errors were measured on


def candidates(model: nn.Module) -> list[str]:
    """Every named module but the model itself, in ``named_modules`` order."""
    return [name for name, _ in model.named_modules() if name]


def rank(model: nn.Module, policy: PrecisionPolicy, inputs: list[torch.Tensor], task: Task) -> Ranking:
    """Rank ``model``'s candidate modules (``candidates``) for ``policy``'s autocast arm on ``inputs`` (batches of
    model inputs on the model's device). ``model``: float32 weights; it is left as it was."""
    if policy.autocast_dtype is None or policy.param_dtype != torch.float32 or policy.float8_recipe:
        raise ParamsError(f"{policy.name}: the ranking measures autocast arms (fp16, bf16); {policy.name} changes "
                          "the weights' dtype or the layers themselves")
    names = candidates(model)
    if not names:
        raise ParamsError("the model has no submodule to keep in float32")
    was_training = model.training
    model.eval()
    try:
        reference = _outputs(model, inputs, task)
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
    # The best fix first; of equal fixes, the module lossier alone, then the smaller.
    rows.sort(key=lambda r: (r.kept, -r.alone, r.parameters, r.module))
    return Ranking(policy.name, arm_error, rows, sum(len(x) for x in inputs))


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
