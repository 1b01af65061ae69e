"""Per-arm metrics (accuracy, loss, agreement, KL, deltas vs the baseline) against hand-computed values."""

import math

import pytest
import torch

from ampbench.verdict.metrics import arm_seed_metrics, compare_to_reference, summarise_seeds


def test_identical_predictions():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    c = compare_to_reference(logits, logits.clone())
    assert c == {"agreement": 1.0, "kl": 0.0, "max_abs_logit_diff": 0.0}


def test_kl_and_agreement_by_hand():
    ref = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    arm = torch.log(torch.tensor([[0.25, 0.75], [0.9, 0.1]]))
    c = compare_to_reference(arm, ref)
    kl_first = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert c["kl"] == pytest.approx(kl_first / 2, rel=1e-5)  # mean over the two samples; the second has KL 0
    assert c["agreement"] == 0.5  # first sample's argmax flips (tie → class 0 vs class 1)
    assert c["max_abs_logit_diff"] == pytest.approx(math.log(2), rel=1e-5)  # |log .25 - log .5|


def test_deltas_are_arm_minus_fp32():
    y = torch.tensor([0, 1, 1, 0])
    ref = torch.tensor([[1.0, 0], [0, 1], [0, 1], [1, 0]])  # 4/4 right
    own = torch.tensor([[1.0, 0], [0, 1], [1, 0], [1, 0]])  # 3/4 right
    m = arm_seed_metrics(own, own, ref, y)
    assert m["test_accuracy"] == 0.75
    assert m["delta_accuracy_vs_fp32"] == pytest.approx(-0.25)
    assert m["agreement_vs_fp32"] == 0.75


def test_summarise_seeds_with_a_non_finite_value():
    s = summarise_seeds({0: {"loss": math.nan}, 1: {"loss": 0.5}})
    assert math.isnan(s["loss"]) and math.isnan(s["loss_std"])


def test_summarise_seeds():
    s = summarise_seeds({0: {"a": 1.0}, 1: {"a": 3.0}})
    assert s["a"] == 2.0 and s["a_std"] == pytest.approx(math.sqrt(2))
    assert summarise_seeds({0: {"a": 1.0}})["a_std"] == 0.0
