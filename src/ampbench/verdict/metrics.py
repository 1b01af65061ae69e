"""Evaluate arms against the fp32 baseline of the same seed: accuracy, loss, agreement, KL, logit differences.

Pure functions of logits and labels; the evaluate stage loads models and feeds them here.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from ampbench.verdict.stats import SeedNoise


def classification_metrics(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy and mean cross-entropy of float32 logits (N, classes) against labels (N,)."""
    return {
        "accuracy": (logits.argmax(dim=1) == y).float().mean().item(),
        "loss": F.cross_entropy(logits, y).item(),
    }


def example_outcomes(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per test example: (correct (bool), cross-entropy) of float32 logits, on the CPU — the paired inputs of
    the per-example statistics."""
    return (logits.argmax(dim=1) == y).cpu(), F.cross_entropy(logits.float(), y, reduction="none").cpu()


def compare_to_reference(logits: torch.Tensor, ref_logits: torch.Tensor) -> dict[str, float]:
    """How far an arm's predictions are from the reference's on the same inputs.

    agreement: share of samples with the same argmax; kl: mean KL(ref ‖ arm) of the softmax outputs, nats;
    max_abs_logit_diff: largest |logit difference| over all samples and classes.
    """
    log_p_ref = F.log_softmax(ref_logits.float(), dim=1)
    log_p_arm = F.log_softmax(logits.float(), dim=1)
    kl = F.kl_div(log_p_arm, log_p_ref, log_target=True, reduction="batchmean")
    return {
        "agreement": (logits.argmax(dim=1) == ref_logits.argmax(dim=1)).float().mean().item(),
        "kl": max(kl.item(), 0.0),  # tiny negative values are rounding
        "max_abs_logit_diff": (logits.float() - ref_logits.float()).abs().max().item(),
    }


def arm_seed_metrics(own: torch.Tensor, fp32eval: torch.Tensor, ref: torch.Tensor, y: torch.Tensor,
                     calibration_bins: int = 15) -> dict[str, float]:
    """All test metrics of one arm and seed.

    own: the arm's logits evaluated in its own precision; fp32eval: the same weights evaluated in strict fp32;
    ref: the fp32 arm's logits (same seed). Δ are arm − fp32, so a negative Δaccuracy means the arm is worse.
    """
    from ampbench.verdict.stats import expected_calibration_error

    m_own, m_f32, m_ref = (classification_metrics(t, y) for t in (own, fp32eval, ref))
    cmp = compare_to_reference(own, ref)
    ece, ece_ref = (expected_calibration_error(F.softmax(t, dim=1), y, calibration_bins) for t in (own, ref))
    return {
        "test_accuracy": m_own["accuracy"],
        "test_loss": m_own["loss"],
        "test_accuracy_fp32eval": m_f32["accuracy"],
        "test_loss_fp32eval": m_f32["loss"],
        "delta_accuracy_vs_fp32": m_own["accuracy"] - m_ref["accuracy"],
        "delta_loss_vs_fp32": m_own["loss"] - m_ref["loss"],
        "agreement_vs_fp32": cmp["agreement"],
        "kl_vs_fp32": cmp["kl"],
        "max_abs_logit_diff_vs_fp32": cmp["max_abs_logit_diff"],
        "test_ece": ece,
        "delta_ece_vs_fp32": ece - ece_ref,
    }


def seed_noise(per_seed: dict[int, dict[str, float]], predictions: dict[int, torch.Tensor]) -> SeedNoise:
    """fp32's seed-to-seed variation on the test split, from its metrics and its predictions (classes, or next
    tokens) per seed."""
    from itertools import combinations

    from ampbench.verdict.stats import SeedNoise

    seeds = sorted(per_seed)
    units = predictions[seeds[0]].numel()
    if len(seeds) < 2:
        return SeedNoise(None, None, None, units)
    disagreement = statistics.fmean((predictions[a] != predictions[b]).float().mean().item()
                                    for a, b in combinations(seeds, 2))
    sd = [statistics.stdev(per_seed[s][k] for s in seeds) if all(math.isfinite(per_seed[s][k]) for s in seeds)
          else math.nan for k in ("test_accuracy", "test_loss")]
    return SeedNoise(sd[0], sd[1], disagreement, units)


def summarise_seeds(per_seed: dict[int, dict[str, float]]) -> dict[str, float]:
    """Mean over seeds of every metric, plus ``<metric>_std`` (sample std; 0 with one seed; NaN when a value is
    not finite, where ``statistics.stdev`` would raise)."""
    keys = next(iter(per_seed.values())).keys()
    out: dict[str, float] = {}
    for key in keys:
        values = [m[key] for m in per_seed.values()]
        out[key] = statistics.fmean(values)
        if len(values) == 1:
            out[f"{key}_std"] = 0.0
        else:
            out[f"{key}_std"] = statistics.stdev(values) if all(map(math.isfinite, values)) else math.nan
    return out
