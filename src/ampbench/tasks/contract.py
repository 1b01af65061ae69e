"""The task seam: what a training job computes, so that the loop, the numerics probes, the FLOP count and the
bench need not know whether a model classifies images or predicts the next token.

``train.task`` names it (``tasks.resolve_task``): ``classification`` (the default: image classification, here),
``language_model`` (``language_model.py``: next-token prediction over text) or ``package.module:callable``, a
callable (no arguments) returning your ``Task``. A task owns, for the loop:

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
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ampbench.data.splits import Prepared, Split
from ampbench.errors import DataError
from ampbench.models.builtins import unwrap
from ampbench.precision.policy import PrecisionPolicy


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

    def validate(self, model: nn.Module, split: Split, policy, batch_size: int) -> tuple[float, float]:
        """(loss, accuracy) of ``model`` on ``split`` in the policy's precision."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, ref_model: nn.Module, policy, strict, test: Split, batch_size: int,
                 calibration_bins: int) -> SeedEvaluation:
        """``model`` (an arm's, on its device) on ``test`` in the arm's ``policy`` and, its weights as they are, in
        ``strict`` fp32; compared with ``ref_model`` (the baseline's of the same seed; ``model`` itself for it)."""
        raise NotImplementedError

    def paired(self, arm: dict[str, np.ndarray], ref: dict[str, np.ndarray], confidence: float, finite: bool):
        """(accuracy, loss) as ``stats.PairedSummary``: arm − baseline from the outcomes, seeds × examples."""
        raise NotImplementedError


class Classification(Task):
    """Image classification: (N, C, H, W) images → (N, classes) logits; cross-entropy; accuracy per image."""

    name = "classification"

    def view(self, data: Prepared) -> Prepared:
        if data.meta.get("kind") == "tokens":
            raise DataError("train.task: classification trains on images; the prepared data is text (set "
                            "train.task: language_model, or another prepare.dataset)")
        return data

    def model_args(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {"input_shape": tuple(meta["input_shape"]), "num_classes": len(meta["classes"])}

    def output_error(self, out: Any, x: torch.Tensor, args: dict[str, Any]) -> tuple[str, str] | None:
        if not isinstance(out, torch.Tensor):
            return (f"a {type(out).__name__}", "a logits tensor is needed (an auxiliary-output model such as "
                    "googlenet or inception_v3 needs train.model_args: {aux_logits: false})")
        want = (len(x), args["num_classes"])
        if tuple(out.shape) != want or not out.is_floating_point():
            return f"{out.dtype} of shape {tuple(out.shape)}", f"expected logits of shape {want}"
        return None

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # float32 loss for every arm (autocast would keep cross_entropy in float32 anyway; the *_pure arms don't)
        return F.cross_entropy(logits.float(), y)

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (logits.argmax(dim=1) == y).sum(), len(y)

    def validate(self, model: nn.Module, split: Split, policy, batch_size: int) -> tuple[float, float]:
        logits = predict(model, split, policy, batch_size)
        y = split.y.to(logits.device)
        return F.cross_entropy(logits, y).item(), (logits.argmax(dim=1) == y).float().mean().item()

    def evaluate(self, model: nn.Module, ref_model: nn.Module, policy, strict, test: Split, batch_size: int,
                 calibration_bins: int) -> SeedEvaluation:
        from ampbench.verdict.metrics import arm_seed_metrics, example_outcomes

        policy.apply_backend_flags()
        own = predict(policy.prepare_model(model), test, policy, batch_size)
        strict.apply_backend_flags()
        ref = own if ref_model is model else predict(ref_model, test, strict, batch_size)
        f32 = predict(model.float(), test, strict, batch_size)
        y = test.y.to(own.device)
        correct, loss = example_outcomes(own, y)
        return SeedEvaluation(arm_seed_metrics(own, f32, ref, y, calibration_bins),
                              {"correct": correct.numpy(), "loss": loss.numpy()}, bool(torch.isfinite(own).all()),
                              own.argmax(dim=1))

    def paired(self, arm: dict[str, np.ndarray], ref: dict[str, np.ndarray], confidence: float, finite: bool):
        from ampbench.verdict.stats import paired_accuracy, paired_mean

        return (paired_accuracy(arm["correct"], ref["correct"], confidence, finite),
                paired_mean(arm["loss"] - ref["loss"], confidence, finite=finite))


CLASSIFICATION = Classification()


@torch.no_grad()
def predict(model: nn.Module, data: torch.Tensor | Split, policy: PrecisionPolicy, batch_size: int) -> torch.Tensor:
    """Logits in the policy's precision, float32 (N, classes), for model inputs ``data`` (on the model's device)
    or a ``Split`` (stored values, normalised a batch at a time on the model's device, which holds the logits)."""
    was_training = model.training
    model.eval()
    split = data if isinstance(data, Split) else None
    x = data.x if split else data
    device = next(unwrap(model).parameters()).device
    outs = []
    for start in range(0, len(x), batch_size):
        chunk = x[start:start + batch_size]
        if split is not None:
            chunk = split.inputs(chunk.to(device, non_blocking=True))
        with policy.autocast():
            outs.append(model(policy.cast_input(chunk)).float())
    model.train(was_training)
    return torch.cat(outs)
