"""FLOPs by dtype: one training step's forward and backward counted at the dispatcher, by the dtype each matmul,
convolution and attention computed in (float32 on CUDA with TF32 on counts as tf32) — proof of what an arm ran.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ampbench.precision.policy import PrecisionPolicy
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task
from ampbench.training.step import forward_backward, side_effect_free

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
LOW = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")  # below float32: what the low-precision share counts


def _dtype_label(operand: torch.Tensor) -> str:
    # torchao's float8 tensors report their original dtype; the matmul reads their float8 data
    dtype = getattr(operand, "_data", operand).dtype if type(operand).__name__.startswith("Float8") else operand.dtype
    name, device_type = str(dtype).removeprefix("torch."), operand.device.type
    if name == "float32" and device_type == "cuda" and torch.backends.cuda.matmul.fp32_precision == "tf32":
        return "tf32"  # float32 operands on tensor cores in TF32 (the cuDNN flag is set together: precision/policy.py)
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
                key = (kind, _dtype_label(operand))
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


def count_step_flops(model: nn.Module, policy: PrecisionPolicy, x: torch.Tensor, y: torch.Tensor,
                     task: Task = CLASSIFICATION) -> dict[str, Any]:
    """FLOPs of one training step's forward and backward on ``x`` (as ``flop_summary``), counted on ``model``
    without changing its training (``side_effect_free``); the optimizer's own arithmetic is not counted."""
    counter = DtypeFlopCounter()
    with side_effect_free(model):
        with counter:
            forward_backward(model, policy, x, y, task=task)
        model.zero_grad(set_to_none=True)
    return flop_summary(counter.flops, len(x))
