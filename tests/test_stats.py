"""Paired statistics and verdicts against hand-computed values."""

import math

import pytest
import torch

from ampbench.errors import AmpbenchError
from ampbench.evaluate_stage import check_fingerprints
from ampbench.stats import expected_calibration_error, paired_ci, verdict

T_975_DF2 = 4.302652729911275  # Student t quantile, 97.5%, 2 degrees of freedom (tables)
T_975_DF4 = 2.7764451051977987


def test_t_interval_by_hand():
    s = paired_ci([0.01, 0.02, 0.03])
    half = T_975_DF2 * 0.01 / math.sqrt(3)
    assert (s.n, s.mean, s.std) == (3, pytest.approx(0.02), pytest.approx(0.01))
    assert s.ci_low == pytest.approx(0.02 - half) and s.ci_high == pytest.approx(0.02 + half)
    s5 = paired_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s5.ci_high - s5.mean == pytest.approx(T_975_DF4 * math.sqrt(2.5) / math.sqrt(5))


def test_equivalent_when_the_whole_interval_is_inside_the_margin():
    s = paired_ci([0.001, -0.001, 0.0])  # ±0.25 pp CI
    v, why = verdict(s, 0.005, True, " pp", 100)
    assert v == "equivalent" and "inside the margin ±0.50 pp" in why


def test_worse_and_better():
    worse = paired_ci([-0.02, -0.021, -0.019])  # about −2 pp ± 0.25
    assert verdict(worse, 0.005)[0] == "worse"
    assert verdict(paired_ci([0.02, 0.021, 0.019]), 0.005)[0] == "better"
    # For a loss, lower is better: a positive difference is worse.
    assert verdict(paired_ci([0.2, 0.21, 0.19]), 0.02, higher_is_better=False)[0] == "worse"


def test_inconclusive_with_reason_in_words():
    s = paired_ci([0.01, 0.02, 0.03])  # mean 2 pp, CI ±2.48 pp: crosses both 0 and the margin
    v, why = verdict(s, 0.005, True, " pp", 100)
    assert v == "inconclusive"
    assert why.startswith("3 seeds are too few to separate a 2.00 pp effect") and "the CI is ±2.48 pp" in why
    narrow = paired_ci([0.004, 0.005, 0.006])  # CI [+0.25, +0.75] pp straddles the +0.5 pp margin
    v, why = verdict(narrow, 0.005, True, " pp", 100)
    assert v == "inconclusive" and "straddles" in why


def test_single_seed_has_no_interval():
    s = paired_ci([0.003])
    assert s.ci_low is None and s.ci_high is None and s.std == 0.0
    v, why = verdict(s, 0.005, True, " pp", 100)
    assert v == "inconclusive" and "1 seed gives no confidence interval" in why


def test_identical_runs_are_equivalent():
    assert verdict(paired_ci([0.0, 0.0, 0.0]), 0.005)[0] == "equivalent"


def test_expected_calibration_error_by_hand():
    # Two samples in the (0.8, 0.8667] bin (confidence 0.8): one right, one wrong → |0.5 − 0.8| = 0.3.
    probs = torch.tensor([[0.8, 0.2], [0.8, 0.2]])
    assert expected_calibration_error(probs, torch.tensor([0, 1])) == pytest.approx(0.3)
    # Perfectly confident and right: 0.
    assert expected_calibration_error(torch.tensor([[1.0, 0.0]]), torch.tensor([0])) == pytest.approx(0.0)


def test_comparison_refuses_mixed_fingerprints():
    hw = {"device_name": "CPU: A", "torch_version": "2.14.1", "cpu_model": "A", "cpu_16bit_flags": "f16c"}
    ok = {"fp32": {"skipped": None, "hardware": hw}, "bf16": {"skipped": None, "hardware": dict(hw)}}
    check_fingerprints(ok)
    ok["bf16"]["hardware"]["device_name"] = "NVIDIA H200"
    with pytest.raises(AmpbenchError, match="refusing to compare bf16 with fp32.*device_name"):
        check_fingerprints(ok)
