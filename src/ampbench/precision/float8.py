"""float8 training of Linear layers with torchao (``convert_to_float8_training``): which layers, and where it runs.

The fp8 arms swap each eligible ``nn.Linear`` for torchao's ``Float8Linear``: its three matmuls (output, input
gradient, weight gradient) take float8 operands with dynamic scales (one per tensor, or one per row), the rest of
the model runs under bfloat16 autocast. Eligible: both dimensions divisible by 16 (the float8 kernels' tile), not
kept in float32 by train.fp32_modules. ``choices`` says for every Linear layer whether it is converted and why not;
``record`` reads it back from a converted model. On CUDA the kernels need compute capability 8.9 (tensorwise) or
9.0 (rowwise); on the CPU torch runs ``torch._scaled_mm`` on float8 operands with a reference kernel, so the
numerics are float8's and the speed is not (``cpu_can_run``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

MULTIPLE = 16  # both Linear dimensions must be divisible by this
CAPABILITY = {"tensorwise": (8, 9), "rowwise": (9, 0), "rowwise_with_gw_hp": (9, 0)}  # CUDA, per recipe


def _why_not(module: nn.Linear, name: str, float32: list[str]) -> str | None:
    if any(name == m or name.startswith(m + ".") for m in float32):
        return "kept in float32 (train.fp32_modules)"
    if module.in_features % MULTIPLE or module.out_features % MULTIPLE:
        return f"{module.in_features}→{module.out_features} not divisible by {MULTIPLE}"
    return None


def choices(model: nn.Module, float32: list[str] = ()) -> list[dict[str, Any]]:
    """Every Linear layer of ``model``: name, dimensions, whether float8 training converts it and, if not, why
    (``float32``: the module names train.fp32_modules matched)."""
    rows = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            why = _why_not(m, name, list(float32))
            rows.append({"module": name, "in_features": m.in_features, "out_features": m.out_features,
                         "converted": why is None, "reason": why})
    return rows


def convert(model: nn.Module, recipe: str, float32: list[str] = ()) -> list[dict[str, Any]]:
    """Swap the eligible Linear layers of ``model`` for torchao's Float8Linear (in place) under ``recipe``;
    ValueError when no layer is eligible (the arm would only be labelled fp8). Returns ``choices``."""
    from ampbench.precision.optimizers import torchao_quietly

    with torchao_quietly():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = choices(model, float32)
    eligible = {c["module"] for c in chosen if c["converted"]}
    if not eligible:
        raise ValueError(no_eligible(chosen))
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda _m, name: name in eligible)
    return chosen


def no_eligible(chosen: list[dict[str, Any]]) -> str:
    """The one line for a model with no Linear layer float8 training could convert."""
    if not chosen:
        return "the model has no Linear layer, so float8 training would convert nothing"
    shown = "; ".join(f"{c['module']}: {c['reason']}" for c in chosen[:4]) + ("; …" if len(chosen) > 4 else "")
    return f"no Linear layer of the model can train in float8 ({shown})"


def record(model: nn.Module, recipe: str) -> dict[str, Any]:
    """What a converted model really runs: the recipe, and each Linear layer converted or left out with why."""
    from ampbench.precision.optimizers import torchao_quietly

    with torchao_quietly():
        from torchao.float8.float8_linear import Float8Linear
    rows = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            converted = isinstance(m, Float8Linear)
            why = None if converted else (_why_not(m, name, []) or "kept in float32 (train.fp32_modules)")
            if "_ampbench_float32" in m.__dict__:
                why = "kept in float32 (train.fp32_modules)"
            rows.append({"module": name, "in_features": m.in_features, "out_features": m.out_features,
                         "converted": converted, "reason": why})
    return {"recipe": recipe, "converted": sum(r["converted"] for r in rows), "linear_layers": len(rows),
            "modules": rows}


def unconvert(model: nn.Module) -> nn.Module:
    """``model`` with every Float8Linear back to a plain ``nn.Linear`` on the same parameters (in place)."""
    from ampbench.precision.optimizers import torchao_quietly

    with torchao_quietly():
        from torchao.float8.float8_linear import Float8Linear
    for name, m in list(model.named_modules()):
        if isinstance(m, Float8Linear):
            plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
            plain.weight, plain.bias = m.weight, m.bias
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, plain)
    return model


@functools.cache
def cpu_can_run() -> str | None:
    """None when this torch runs float8 matmuls on the CPU, else why not (one line)."""
    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
        return f"torch {torch.__version__} cannot run float8 matmuls on the CPU ({str(exc).splitlines()[0][:120]})"
    return None


def cuda_refusal(recipe: str, capability: tuple[int, int]) -> str | None:
    """Why a GPU of ``capability`` cannot run ``recipe``'s float8 kernels, or None."""
    need = CAPABILITY[recipe]
    if capability >= need:
        return None
    return (f"float8 {recipe} needs compute capability ≥ {need[0]}.{need[1]} "
            f"({'Ada or Hopper' if need == (8, 9) else 'Hopper'}); this GPU is {capability[0]}.{capability[1]}")
