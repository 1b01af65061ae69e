"""The optimizer an arm trains with: train.optimizer (sgd, adam, adamw) from the implementation the arm names.

``torch`` is torch.optim (fused where the device allows). The pure-bf16 arms use well-kept implementations that
keep low-precision weights from cancelling small updates: torchao's ``_AdamW`` with ``bf16_stochastic_round``
(Adam's maths in float32, only the bf16 write of the weight rounded stochastically) and torch-optimi's optimizers
with ``kahan_sum`` (a bf16 compensation buffer per parameter carries what the rounded update lost). Every setting
is matched to torch.optim's (betas, eps, SGD's first momentum), so the arms differ in rounding only.
``describe`` reads back what was built; ``state_bytes`` counts the memory of weights, gradients and optimizer state.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from ampbench.config.arms import OPTIMIZERS
from ampbench.config.params import TrainParams

_TORCH_ADAM = {"betas": (0.9, 0.999), "eps": 1e-8}  # torch.optim's defaults; optimi's differ (0.99, 1e-6)


@contextlib.contextmanager
def torchao_quietly():
    """Import torchao without the warning torch 2.14 logs on every import of it (torchao registers an Enum as a
    pytree constant, which this torch deprecates): a line in every stage's output that says nothing about the run."""
    logger = logging.getLogger("torch.utils._pytree")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def build(impl: str, tp: TrainParams, params, device: torch.device) -> torch.optim.Optimizer:
    """train.optimizer from implementation ``impl`` (arms.Arm.optimizer); ValueError for a combination the
    implementation lacks (params validation refuses it earlier, with the keys)."""
    if tp.optimizer not in OPTIMIZERS.get(impl, ()):
        raise ValueError(f"{impl} has no {tp.optimizer!r} optimizer (it has: {', '.join(OPTIMIZERS.get(impl, ()))})")
    if impl == "torch":
        return _torch(tp, params, device)
    if impl == "torchao_sr":
        with torchao_quietly():
            from torchao.optim import _AdamW

        return _AdamW(params, lr=tp.lr, weight_decay=tp.weight_decay, bf16_stochastic_round=True, **_TORCH_ADAM)
    import optimi

    if tp.optimizer == "sgd":  # torch_init: the first momentum is the gradient itself, as torch.optim.SGD does
        return optimi.SGD(params, lr=tp.lr, momentum=tp.momentum, weight_decay=tp.weight_decay, torch_init=True,
                          kahan_sum=True)
    cls = optimi.Adam if tp.optimizer == "adam" else optimi.AdamW  # Adam: L2 weight decay; AdamW: decoupled (× lr)
    return cls(params, lr=tp.lr, weight_decay=tp.weight_decay, kahan_sum=True, **_TORCH_ADAM)


def _torch(tp: TrainParams, params, device: torch.device) -> torch.optim.Optimizer:
    """SGD / Adam / AdamW, fused where the device allows: a fused optimizer lets GradScaler skip inf steps
    inside the kernel instead of reading ``found_inf`` on the host every step."""
    common = {"lr": tp.lr, "weight_decay": tp.weight_decay, "fused": device.type in ("cuda", "cpu")}
    if tp.optimizer == "sgd":
        return torch.optim.SGD(params, momentum=tp.momentum, **common)
    return (torch.optim.Adam if tp.optimizer == "adam" else torch.optim.AdamW)(params, **common)


def describe(optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """What the optimizer really is, read from the object: its class and how it writes low-precision weights."""
    cls = type(optimizer)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for g in optimizer.param_groups for p in g["params"]})
    low = any(d in ("bfloat16", "float16") for d in dtypes)
    if getattr(optimizer, "bf16_stochastic_round", False):
        rounding = "stochastic rounding of the bfloat16 weight write (float32 maths)"
    elif any(g.get("kahan_sum") for g in optimizer.param_groups) and low:
        rounding = "Kahan summation (a compensation buffer per low-precision parameter)"
    elif low:
        rounding = "round to nearest (no compensation)"
    else:
        rounding = "float32 weights"
    fused = any(g.get("fused") for g in optimizer.param_groups)
    return {"optimizer_class": f"{cls.__module__}.{cls.__qualname__}" + (" (fused)" if fused else ""),
            "optimizer_rounding": rounding, "weight_dtype": ",".join(dtypes)}


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Bytes of weights, gradients and optimizer state, counted tensor by tensor (the same on every device; on
    CUDA the isolated peak adds activations and workspace to it), and their sum per parameter."""
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    n = sum(p.numel() for p in params)
    total = weights + grads + state
    return {"weights": weights, "gradients": grads, "optimizer": state, "total": total,
            "per_parameter": total / n if n else None}
