"""The task seam: what a training job computes, so that the loop, the numerics probes, the FLOP count and the
bench need not know whether a model classifies images or predicts the next token.

``train.task`` names it (``resolve.resolve_task``): ``classification`` (the default: image classification,
``classification.py``), ``language_model`` (``language_model.py``: next-token prediction over text) or
``package.module:callable``, a callable (no arguments) returning your ``Task``. A task owns, for the loop:

- ``view``: the prepared data as the batches it trains on (e.g. token streams cut into sequences);
- the model's contract: ``model_args`` (what the model factory receives, e.g. input shape and classes) and
  ``output_error`` (what the dry run refuses, e.g. logits of the wrong shape);
- ``logits``: the model's output as a logits tensor (a tensor, or an object with ``.logits``);
- ``loss``: the training loss of a batch (float32, a mean over its units: examples or tokens);
- ``correct``: how many units of a batch the logits get right, and how many units it has;
- ``validate``: (loss, accuracy) of a model on a split, the two numbers every epoch record carries;

and for the evaluation against the float32 baseline:

- ``evaluate``: one arm's model (and the baseline's, same seed) on the test split: the seed's metrics, the
  per-example outcomes the paired statistics use, and the predictions fp32's seed-to-seed noise is measured on;
- ``paired``: the paired intervals of accuracy and loss from two arms' outcomes (examples as clusters);
- ``deciding``, ``accuracy_label``, ``loss_label``: which of the two decides the verdict, and their names in the
  report and in MLflow.

Everything here runs on the model's device and reads no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ampbench.data.splits import Prepared, Split
from ampbench.precision.policy import PrecisionPolicy

if TYPE_CHECKING:  # the paired statistics' type; they are imported where a task computes them
    pass


@dataclass(frozen=True)
class SeedEvaluation:
    """What ``Task.evaluate`` gives for one arm and seed."""

    metrics: dict[str, float]  # test metrics and their differences from the baseline (metrics.arm_seed_metrics)
    outcomes: dict[str, np.ndarray]  # per-example arrays for the paired statistics, the same examples every arm
    finite: bool  # every logit finite
    predictions: torch.Tensor  # the predicted classes (tokens), for fp32's seed-to-seed disagreement


class Task:
    """The contract a task fulfils (see the module docstring). Subclass it, or return any object with these."""

    name = "task"
    deciding = "accuracy"  # accuracy | loss: whose verdict is the arm's verdict
    accuracy_label = "accuracy"
    loss_label = "loss"

    def view(self, data: Prepared) -> Prepared:
        """The prepared data as this task trains on it (DataError when it is data of another task)."""
        return data

    def model_args(self, meta: dict[str, Any]) -> dict[str, Any]:
        """What the model factory receives from the prepared data's ``meta`` (besides train.model_args)."""
        raise NotImplementedError

    def output_error(self, out: Any, x: torch.Tensor, args: dict[str, Any]) -> tuple[str, str] | None:
        """(what ``out`` is, what is needed) when the model's output for inputs ``x`` is not what this task trains
        on; None when it is."""
        raise NotImplementedError

    def logits(self, out: Any) -> torch.Tensor:
        """The logits in the model's output."""
        return out

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch's training loss, float32 (a mean over its units)."""
        raise NotImplementedError

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(units the logits get right, on the device; units in the batch)."""
        raise NotImplementedError

    def validate(self, model: nn.Module, split: Split, policy: PrecisionPolicy,
                 batch_size: int) -> tuple[float, float]:
        """(loss, accuracy) of ``model`` on ``split`` in the policy's precision."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, ref_model: nn.Module, policy: PrecisionPolicy, strict: PrecisionPolicy,
                 test: Split, batch_size: int, calibration_bins: int) -> SeedEvaluation:
        """``model`` (an arm's, on its device) on ``test`` in the arm's ``policy`` and, its weights as they are, in
        ``strict`` fp32; compared with ``ref_model`` (the baseline's of the same seed; ``model`` itself for it)."""
        raise NotImplementedError

    def paired(self, arm: dict[str, np.ndarray], ref: dict[str, np.ndarray], confidence: float, finite: bool):
        """(accuracy, loss) as ``verdict.stats.PairedSummary``: arm − baseline from the outcomes, seeds × examples."""
        raise NotImplementedError
