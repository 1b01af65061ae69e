"""Paired statistics and verdicts against hand-computed values."""

import math

import pytest
import torch

from ampbench.errors import AmpbenchError
from ampbench.stages.evaluate import check_fingerprints
from ampbench.verdict.decisions import verdict
from ampbench.verdict.stats import expected_calibration_error, paired_ci

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
    assert why.startswith("the 95% CI [-0.48 pp, +4.48 pp] is ±2.48 pp wide, more than the margin ±0.50 pp")
    assert "separate a 2.00 pp effect" in why
    narrow = paired_ci([0.004, 0.005, 0.006])  # CI [+0.25, +0.75] pp straddles the +0.5 pp margin
    v, why = verdict(narrow, 0.005, True, " pp", 100)
    assert v == "inconclusive" and "straddles" in why


def test_single_seed_has_no_interval():
    s = paired_ci([0.003])
    assert s.ci_low is None and s.ci_high is None and s.std == 0.0
    v, why = verdict(s, 0.005, True, " pp", 100)
    assert v == "inconclusive" and "1 seed gives no confidence interval" in why


def test_the_reason_names_the_configured_confidence_level():
    v, why = verdict(paired_ci([0.001, -0.001, 0.0], confidence=0.9), 0.005, True, " pp", 100)
    assert v == "equivalent" and why.startswith("the 90% CI")


def test_the_margins_ends_count_as_inside():
    s = paired_ci([0.0, 0.0, 0.0])  # zero-width interval at 0: inside any margin, even 0
    assert verdict(s, 0.0)[0] == "equivalent"
    edge = paired_ci([0.004, 0.005, 0.006])  # CI ≈ [+0.25, +0.75] pp; margin exactly the upper end
    assert verdict(edge, edge.ci_high)[0] == "equivalent"


def test_a_non_finite_value_gives_an_invalid_verdict():
    s = paired_ci([math.nan, 0.01, 0.02])
    assert not s.finite and s.ci_low is None
    v, why = verdict(s, 0.005)
    assert v == "invalid" and "not finite" in why
    assert verdict(paired_ci([math.inf, 0.0, 0.0]), 0.005)[0] == "invalid"


def test_intervals_stay_inside_what_the_quantity_can_be():
    s = paired_ci([0.99, 1.0, 1.0], bounds=(0, 1))  # agreement: a share
    assert s.ci_high == 1.0 and 0 <= s.ci_low < s.mean
    assert paired_ci([0.0, 0.0, 1e-3], bounds=(0, None)).ci_low == 0.0  # KL is never negative


def test_identical_runs_are_equivalent():
    assert verdict(paired_ci([0.0, 0.0, 0.0]), 0.005)[0] == "equivalent"


def test_expected_calibration_error_by_hand():
    # Two samples in the (0.8, 0.8667] bin (confidence 0.8): one right, one wrong → |0.5 − 0.8| = 0.3.
    probs = torch.tensor([[0.8, 0.2], [0.8, 0.2]])
    assert expected_calibration_error(probs, torch.tensor([0, 1])) == pytest.approx(0.3)
    # Perfectly confident and right: 0.
    assert expected_calibration_error(torch.tensor([[1.0, 0.0]]), torch.tensor([0])) == pytest.approx(0.0)


def test_comparison_refuses_mixed_fingerprints():
    from conftest import arm_summary

    hw = {"device_name": "CPU: A", "device_type": "cpu", "torch_version": "2.14.1", "cpu_model": "A",
          "cpu_16bit_flags": "f16c"}
    ok = {"fp32": arm_summary("fp32", hardware=hw), "bf16": arm_summary("bf16", hardware=dict(hw))}
    check_fingerprints(ok)
    ok["bf16"] = arm_summary("bf16", hardware={**hw, "device_name": "NVIDIA H200"})
    with pytest.raises(AmpbenchError, match="refusing to compare bf16 with fp32.*device_name"):
        check_fingerprints(ok)


def test_an_arm_with_a_non_finite_loss_is_reported_invalid_not_a_crash(tmp_path):
    """The comparison, the report and JSON (NaN as null) for an arm whose test loss overflowed."""
    import json

    import numpy as np

    from ampbench.report.advice import recommendation
    from ampbench.report.context import RunContext
    from ampbench.report.markdown import markdown_report
    from ampbench.runtime.files import atomic_write_json
    from ampbench.tasks.classification import CLASSIFICATION
    from ampbench.verdict.comparison import ArmReport, Outcomes, paired_statistics
    from ampbench.verdict.decisions import one_sided_level
    from ampbench.verdict.metrics import summarise_seeds
    from ampbench.verdict.stats import Margins, SeedNoise
    from ampbench.verdict.tables import tables
    from conftest import arm_summary

    def seed_metrics(delta_loss: float) -> dict[str, float]:
        return {"test_accuracy": 0.9, "test_loss": 0.3 + delta_loss, "delta_accuracy_vs_fp32": 0.0,
                "delta_loss_vs_fp32": delta_loss, "agreement_vs_fp32": 1.0, "kl_vs_fp32": 0.0,
                "max_abs_logit_diff_vs_fp32": 0.0, "test_ece": 0.05, "delta_ece_vs_fp32": 0.0}

    noise, margins = SeedNoise(0.001, 0.01, 0.01, 100), Margins(0.005, 0.02, "set", "set")
    correct = np.ones((3, 100), dtype=bool)
    ref = Outcomes({"correct": correct, "loss": np.full((3, 100), 0.3)}, True)
    reports = []
    for arm, losses in (("fp32", [0.0, 0.0, 0.0]), ("fp16_pure", [0.01, math.nan, 0.02])):
        per_seed = {s: seed_metrics(d) for s, d in enumerate(losses)}
        report = ArmReport(arm_summary(arm), metrics=summarise_seeds(per_seed), per_seed=per_seed)
        mine = Outcomes({"correct": correct, "loss": np.stack([np.full(100, 0.3 + d) for d in losses])},
                        math.isfinite(sum(losses)))
        finite = mine.finite and ref.finite
        paired = [CLASSIFICATION.paired(mine.arrays, ref.arrays, level, finite)
                  for level in (0.95, one_sided_level(0.95))]
        report.stats = paired_statistics(per_seed, *paired, margins, noise, 0.95, CLASSIFICATION.deciding)
        reports.append(report)
    comparison, speed, details = tables(reports, noise, margins, CLASSIFICATION.deciding)
    assert comparison["fp16_pure"]["loss_verdict"] == "invalid"
    assert comparison["fp16_pure"]["verdict"] == "invalid"  # non-finite logits: its predictions mean nothing
    merged = {a: {**comparison[a], **speed[a]} for a in comparison}
    context = RunContext(model=reports[0].trained.model, margins=margins, noise=noise)
    text = markdown_report(reports, merged, context, recommendation(merged, context))
    assert "Loss: not worse? **invalid**: a value is not finite" in text and "equivalent? invalid: a value" in text
    path = tmp_path / "details.json"
    atomic_write_json(path, details)
    assert json.loads(path.read_text())["fp16_pure"]["delta_loss"] is None  # null, not the invalid JSON NaN
