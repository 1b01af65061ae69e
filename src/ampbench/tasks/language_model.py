"""The language-model task (``train.task: language_model``): next-token prediction over byte-level text.

Data: the prepared token streams (``prepare.dataset: text``, ``data/text.py``), cut into non-overlapping sequences of
``train.block_size`` tokens, each with its next tokens as targets. Model contract: ``build(vocab_size,
block_size, **train.model_args)`` returns a module mapping (N, T) token ids to (N, T, vocab_size) logits, or to an
object whose ``.logits`` are (a Hugging Face causal LM). Loss: cross-entropy per token, in nats. Accuracy: the
share of next tokens whose argmax is right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ampbench.data.splits import Prepared, Split
from ampbench.data.text import sequences
from ampbench.errors import DataError
from ampbench.precision.policy import PrecisionPolicy
from ampbench.tasks.contract import SeedEvaluation, Task

DEFAULT_BLOCK_SIZE = 64  # train.block_size when null (nanoGPT's character-level CPU recipe)


@dataclass(frozen=True)
class TokenIds:
    """Stored tokens (uint8) as the model's input: int64 ids (what embeddings take)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.long()


class LanguageModel(Task):
    """Next-token prediction: (N, T) token ids → (N, T, vocab) logits; cross-entropy per token."""

    name = "language_model"
    deciding = "loss"  # the verdict is the loss's: nats per token
    accuracy_label = "next-token accuracy"
    loss_label = "loss per token"

    def __init__(self, block_size: int | None = None):
        self.block_size = block_size or DEFAULT_BLOCK_SIZE

    def view(self, data: Prepared) -> Prepared:
        """Each split's token stream as (sequences, next tokens); a split too short for one sequence stops here."""
        if data.meta.get("kind") == "inputs" and data.train.y.ndim == 2:  # a datamodule's sequences, as they are
            return Prepared(data.train, data.val, data.test, {**data.meta, "block_size": data.train.y.shape[1]})
        if data.meta.get("kind") != "tokens":
            raise DataError(f"train.task: language_model trains on text (prepare.dataset: text); the prepared data "
                            f"is {data.meta.get('dataset')!r} images")
        short = {name: len(getattr(data, name)) for name in ("train", "val", "test")
                 if len(getattr(data, name)) < self.block_size + 1}
        if short:
            raise DataError(f"train.block_size: {self.block_size} tokens (+1 for the last target) is longer than "
                            f"the {', '.join(f'{k} split ({v} tokens)' for k, v in short.items())}; lower it or "
                            "give prepare.raw_dir more text")
        cut = {name: self.view_split(getattr(data, name).x) for name in ("train", "val", "test")}
        return Prepared(cut["train"], cut["val"], cut["test"], {**data.meta, "block_size": self.block_size})

    def view_split(self, tokens: torch.Tensor) -> Split:
        """A token stream as a split of sequences (x) and their next tokens (y), both views of ``tokens``."""
        return Split(*sequences(tokens, self.block_size), TokenIds())

    def model_args(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {"vocab_size": meta["vocab_size"], "block_size": self.block_size}

    def output_error(self, out: Any, x: torch.Tensor, args: dict[str, Any]) -> tuple[str, str] | None:
        logits = self.logits(out)
        if not isinstance(logits, torch.Tensor):
            return f"a {type(out).__name__}", "logits are needed: a tensor, or an object with .logits"
        want = (*x.shape, args["vocab_size"])
        # a larger vocabulary than the data uses is fine (a datamodule's tokens need not use every id)
        if tuple(logits.shape[:-1]) != want[:-1] or logits.shape[-1] < want[-1] or not logits.is_floating_point():
            return (f"{logits.dtype} of shape {tuple(logits.shape)}", f"expected logits of shape {want} (sequences "
                    f"× tokens × the data's {args['vocab_size']}-symbol vocabulary)")
        return None

    def logits(self, out: Any) -> torch.Tensor:
        return out if isinstance(out, torch.Tensor) else getattr(out, "logits", out)

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten().long())

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (logits.argmax(dim=-1) == y).sum(), y.numel()

    @torch.no_grad()
    def validate(self, model: nn.Module, split: Split, policy: PrecisionPolicy,
                 batch_size: int) -> tuple[float, float]:
        """(loss per token, next-token accuracy), a batch of sequences at a time (no (N, T, vocab) tensor)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        loss = torch.zeros((), device=device, dtype=torch.float64)
        right = torch.zeros((), device=device, dtype=torch.int64)
        for _, x, y in _batches(split, batch_size, model):
            with policy.autocast():
                logits = self.logits(model(policy.cast_input(x))).float()
            loss += F.cross_entropy(logits.flatten(0, 1), y.flatten().long(), reduction="sum").double()
            right += (logits.argmax(dim=-1) == y).sum()
        model.train(was_training)
        units = max(split.y.numel(), 1)
        return (loss / units).item(), right.item() / units

    @torch.no_grad()
    def evaluate(self, model: nn.Module, ref_model: nn.Module, policy: PrecisionPolicy, strict: PrecisionPolicy,
                 test: Split, batch_size: int, calibration_bins: int) -> SeedEvaluation:
        """Streamed a batch of sequences at a time (no (N, T, vocab) tensor is kept): the arm in its precision
        against the baseline's model, then the arm's weights in strict fp32. Per sequence: the mean loss and the
        share of next tokens right (sequences are the clusters of the paired statistics)."""
        policy.apply_backend_flags()
        own_model = policy.prepare_model(model).eval()
        acc = _Accumulator(len(test), test.y.shape[1])
        for start, x, y in _batches(test, batch_size, own_model):
            policy.apply_backend_flags()
            with policy.autocast():
                own = self.logits(own_model(policy.cast_input(x))).float()
            if ref_model is model:
                ref = own
            else:
                strict.apply_backend_flags()
                ref = self.logits(ref_model.eval()(x)).float()
            acc.add(start, own, ref, y)
        strict.apply_backend_flags()
        return acc.result(*self.validate(model.float(), test, strict, batch_size))  # its weights in strict fp32

    def paired(self, arm: dict, ref: dict, confidence: float, finite: bool):
        from ampbench.verdict.stats import paired_mean

        return (paired_mean(arm["accuracy"] - ref["accuracy"], confidence, (-1, 1), finite=finite),
                paired_mean(arm["loss"] - ref["loss"], confidence, finite=finite))


def _batches(split: Split, batch_size: int, model: nn.Module):
    """(first index, model inputs, next tokens) of each batch of sequences, on the model's device."""
    device = next(model.parameters()).device
    for start in range(0, len(split), batch_size):
        yield (start, split.inputs(split.x[start:start + batch_size].to(device)),
               split.y[start:start + batch_size].to(device))


class _Accumulator:
    """Per-sequence outcomes and the sums behind one seed's metrics, filled a batch at a time."""

    def __init__(self, n: int, t: int):
        self.units = n * t
        self.loss = np.zeros(n)  # per sequence: mean loss per token, nats
        self.accuracy = np.zeros(n)  # per sequence: share of next tokens right
        self.ref_loss = self.ref_right = self.agree = self.kl = 0.0
        self.max_diff, self.finite = 0.0, True
        self.predictions: list[torch.Tensor] = []

    def add(self, start: int, own: torch.Tensor, ref: torch.Tensor, y: torch.Tensor) -> None:
        """One batch: logits (B, T, V) of the arm and of the baseline, next tokens (B, T)."""
        target = y.long()
        losses = F.cross_entropy(own.flatten(0, 1), target.flatten(), reduction="none").view_as(target)
        pred = own.argmax(dim=-1)
        end = start + len(y)
        self.loss[start:end] = losses.double().mean(dim=1).cpu().numpy()
        self.accuracy[start:end] = (pred == target).double().mean(dim=1).cpu().numpy()
        self.ref_loss += F.cross_entropy(ref.flatten(0, 1), target.flatten(), reduction="sum").item()
        self.ref_right += (ref.argmax(dim=-1) == target).sum().item()
        self.agree += (pred == ref.argmax(dim=-1)).sum().item()
        log_ref, log_own = F.log_softmax(ref, dim=-1), F.log_softmax(own, dim=-1)
        self.kl += F.kl_div(log_own.flatten(0, 1), log_ref.flatten(0, 1), log_target=True, reduction="sum").item()
        self.max_diff = max(self.max_diff, (own - ref).abs().max().item())
        self.finite = self.finite and bool(torch.isfinite(own).all())
        self.predictions.append(pred.to(torch.uint8 if own.shape[-1] <= 256 else torch.int32).cpu())

    def result(self, loss_f32: float, accuracy_f32: float) -> SeedEvaluation:
        """The seed's metrics (the keys of ``verdict.metrics.arm_seed_metrics`` but ECE: per token), outcomes and
        predictions; ``loss_f32`` and ``accuracy_f32``: the arm's weights in strict fp32."""
        n = self.units
        test_loss, test_acc = float(self.loss.mean()), float(self.accuracy.mean())  # every sequence has T tokens
        ref_loss, ref_acc = self.ref_loss / n, self.ref_right / n
        metrics = {"test_accuracy": test_acc, "test_loss": test_loss, "test_accuracy_fp32eval": accuracy_f32,
                   "test_loss_fp32eval": loss_f32, "delta_accuracy_vs_fp32": test_acc - ref_acc,
                   "delta_loss_vs_fp32": test_loss - ref_loss, "agreement_vs_fp32": self.agree / n,
                   "kl_vs_fp32": max(self.kl / n, 0.0), "max_abs_logit_diff_vs_fp32": self.max_diff}
        return SeedEvaluation(metrics, {"accuracy": self.accuracy, "loss": self.loss}, self.finite,
                              torch.cat(self.predictions))
