"""Seeding and deterministic-algorithm switches, so the same params and seed give the same numbers."""

from __future__ import annotations

import random

import numpy as np
import torch

# cuBLAS needs this workspace setting for deterministic matmuls; it must be in the environment before CUDA
# initialises, so the stage edge sets it (see pipeline/_common.py) and this module only checks it.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices). Data order has its own generator (see training.init_state)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_deterministic(enabled: bool, cudnn_benchmark: bool = False, compile: bool = False) -> None:
    """Deterministic kernels on or off; cuDNN autotuning (which picks kernels by timing) only when off.

    ``compile``: the model will be torch.compile'd, so inductor's own switch must be set too. Without it, and while
    inductor is not loaded, only the kernel switch is set: ``torch.use_deterministic_algorithms`` imports inductor
    to set its flag, about 2 s of every stage process for a compiler that process never uses.
    """
    import sys

    if compile or "torch._inductor" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(enabled, warn_only=False)
    else:
        torch._C._set_deterministic_algorithms(enabled, warn_only=False)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = cudnn_benchmark and not enabled
