"""Image classification, the default task (``train.task: classification``): (N, C, H, W) images → (N, classes)
logits; cross-entropy; accuracy per image; the verdict is accuracy's. Subclass ``Classification`` and override what
differs (``examples/my_task.py`` changes only the loss).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ampbench.data.splits import Prepared, Split
from ampbench.errors import DataError
from ampbench.precision.policy import PrecisionPolicy
from ampbench.tasks.contract import SeedEvaluation, Task


class Classification(Task):
    """Image classification: (N, C, H, W) images → (N, classes) logits; cross-entropy; accuracy per image."""

    name = "classification"

    def view(self, data: Prepared) -> Prepared:
        if data.meta.get("kind") == "tokens":
            raise DataError("train.task: classification trains on images; the prepared data is text (set "
                            "train.task: language_model, or another prepare.dataset)")
        if data.train.y.ndim != 1:  # a datamodule's token sequences
            raise DataError("train.task: classification needs one class label per example; the prepared data's "
                            "targets are sequences (set train.task: language_model)")
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

    def validate(self, model: nn.Module, split: Split, policy: PrecisionPolicy,
                 batch_size: int) -> tuple[float, float]:
        logits = predict(model, split, policy, batch_size)
        y = split.y.to(logits.device)
        return F.cross_entropy(logits, y).item(), (logits.argmax(dim=1) == y).float().mean().item()

    def evaluate(self, model: nn.Module, ref_model: nn.Module, policy: PrecisionPolicy, strict: PrecisionPolicy,
                 test: Split, batch_size: int, calibration_bins: int) -> SeedEvaluation:
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
    device = next(model.parameters()).device
    outs = []
    for start in range(0, len(x), batch_size):
        chunk = x[start:start + batch_size]
        if split is not None:
            chunk = split.inputs(chunk.to(device, non_blocking=True))
        with policy.autocast():
            outs.append(model(policy.cast_input(chunk)).float())
    model.train(was_training)
    return torch.cat(outs)
