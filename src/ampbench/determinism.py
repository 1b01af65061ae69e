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


def set_deterministic(enabled: bool, cudnn_benchmark: bool = False) -> None:
    """Deterministic kernels on or off; cuDNN autotuning (which picks kernels by timing) only when off."""
    torch.use_deterministic_algorithms(enabled, warn_only=False)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = cudnn_benchmark and not enabled
