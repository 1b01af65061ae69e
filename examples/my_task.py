"""Bring your own task: a ``Task`` that trains image classification with label smoothing.

Train it (from the project root):

    .venv/bin/dvc exp run --temp -S train.task=examples.my_task:task -S train.task_code=examples/my_task.py

The contract (``ampbench.Task``, docs/your-task.md): a callable returning an object with ``view``,
``model_args``, ``output_error``, ``logits``, ``loss``, ``correct``, ``validate``, ``evaluate`` and ``paired``.
Subclassing a built-in task and overriding what differs is the short way: here only the training loss changes,
so validation, the test metrics and the verdicts stay those of plain classification (cross-entropy, accuracy).
``train.task_code`` names this file so DVC retrains when it changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ampbench import Classification


class LabelSmoothing(Classification):
    """Classification whose training loss spreads ``smoothing`` of each target's probability over every class."""

    name = "label_smoothing"

    def __init__(self, smoothing: float):
        self.smoothing = smoothing

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), y, label_smoothing=self.smoothing)


def task() -> LabelSmoothing:
    return LabelSmoothing(0.1)
