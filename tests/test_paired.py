"""Per-example paired statistics: Tango's score interval, cluster-robust variances, the constructed outcome
patterns of issue 13, coverage by simulation, the seed-noise floor and `auto` margins.

Independent computations: the restricted maximum likelihood is found numerically (scipy) instead of by Tango's
closed form, the interval by a grid search over the statistic, the cluster variances by numpy's variance of
seed and example means, and McNemar's statistic by its textbook formula.
"""

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as st

from ampbench.verdict.decisions import against_noise, differs_from_zero, not_worse, one_sided_level, verdict
from ampbench.verdict.stats import (
    SeedNoise,
    paired_accuracy,
    paired_ci,
    paired_mean,
    resolve_margins,
    tango_interval,
    tango_statistic,
)
from ampbench.verdict.variance import components

Z95 = st.norm.ppf(0.975)
T269 = st.t.ppf(0.975, 269)  # the examples' degrees of freedom of 270 test examples
MARGIN = 0.005  # 0.5 pp, the default


def numeric_score(delta: float, b: int, c: int, n: int) -> float:
    """Tango's statistic with the restricted MLE of p_c found by maximising the multinomial likelihood."""
    lo, hi = max(0.0, -delta), (1 - delta) / 2  # p_c ≥ 0, p_b = p_c + delta ≥ 0, p_b + p_c ≤ 1

    def nll(p_c: float) -> float:
        p_b, rest = p_c + delta, 1 - 2 * p_c - delta
        terms = [(b, p_b), (c, p_c), (n - b - c, rest)]
        return -sum(k * math.log(max(p, 1e-300)) for k, p in terms if k)

    p_c = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
    return (b - c - n * delta) / math.sqrt(n * (2 * p_c + delta * (1 - delta)))


def outcomes(seeds: int, examples: int, fp32_only: dict[int, list[int]] = None,
             arm_only: dict[int, list[int]] = None) -> tuple[np.ndarray, np.ndarray]:
    """(arm_correct, ref_correct): everything right in both, except the listed example indices per seed."""
    arm = np.ones((seeds, examples), dtype=bool)
    ref = np.ones((seeds, examples), dtype=bool)
    for s, idx in (fp32_only or {}).items():
        arm[s, idx] = False
    for s, idx in (arm_only or {}).items():
        ref[s, idx] = False
    return arm, ref


@pytest.mark.parametrize(("b", "c", "n"), [(5, 2, 100), (0, 1, 810), (3, 0, 270), (10, 30, 500)])
def test_tango_statistic_against_a_numerical_restricted_mle(b, c, n):
    for delta in (-0.05, -0.01, 0.0, 0.004, 0.02):
        assert tango_statistic(delta, b, c, n) == pytest.approx(numeric_score(delta, b, c, n), rel=1e-5, abs=1e-6)
    # At delta = 0 it is McNemar's statistic.
    assert tango_statistic(0.0, b, c, n) == pytest.approx((b - c) / math.sqrt(b + c))


@pytest.mark.parametrize(("b", "c", "n"), [(5, 2, 100), (0, 1, 810), (10, 30, 500), (40, 0, 60)])
def test_tango_interval_is_where_the_numerical_statistic_crosses_z(b, c, n):
    """Just inside each end the (numerically computed) statistic is within ±z, just outside it is not."""
    low, high = tango_interval(b, c, n)
    step = 1e-6
    assert abs(numeric_score(low + step, b, c, n)) <= Z95 < abs(numeric_score(low - step, b, c, n))
    assert abs(numeric_score(high - step, b, c, n)) <= Z95 < abs(numeric_score(high + step, b, c, n))
    for x in np.linspace(low, high, 7)[1:-1]:
        assert abs(numeric_score(x, b, c, n)) < Z95


def test_no_discordant_pair_still_gives_the_width_the_pairs_allow():
    low, high = tango_interval(0, 0, 810)
    assert high == pytest.approx(Z95**2 / (810 + Z95**2)) and low == pytest.approx(-high)


def test_variance_components_against_a_two_way_anova_by_hand():
    """Mean squares from numpy's variances of seed and example means and the residual table; the components and
    the variance of the mean at another design from their textbook formulas."""
    rng = np.random.default_rng(0)
    d = rng.integers(-1, 2, size=(4, 50)).astype(float) + rng.normal(0, 0.5, (4, 1))  # a seed effect on top
    v = components(d)
    s, n = d.shape
    resid = d - d.mean(axis=1, keepdims=True) - d.mean(axis=0, keepdims=True) + d.mean()
    ms_seed, ms_ex = n * np.var(d.mean(axis=1), ddof=1), s * np.var(d.mean(axis=0), ddof=1)
    ms_res = (resid**2).sum() / ((s - 1) * (n - 1))
    assert (v.ms_seed, v.ms_example, v.ms_residual) == pytest.approx((ms_seed, ms_ex, ms_res))
    assert v.iid == pytest.approx(np.var(d, ddof=1) / d.size)
    assert ms_seed > ms_res and v.seed == pytest.approx((ms_seed - ms_res) / n)
    assert v.example == max(0.0, (ms_ex - ms_res) / s) and v.example_variance == pytest.approx(ms_ex / (s * n))
    total, examples_part, one_seed = v.predicted(6, 80)
    assert total == pytest.approx(v.seed / 6 + v.example / 80 + v.residual / 480)
    assert examples_part == pytest.approx(v.example / 80 + v.residual / 480)
    assert one_seed == pytest.approx(v.seed + (v.example + v.residual) / 80)
    # The same examples in every seed: the examples' part alone, each example counted once.
    flat = components(np.tile(rng.integers(-1, 2, 50).astype(float), (4, 1)))
    assert flat.ms_seed == 0 and flat.seed == 0 and flat.example_variance == pytest.approx(flat.ms_example / 200)
    assert flat.design_effect == pytest.approx(4 * 199 / 196, rel=0.02)
    one = components(d[:1])
    assert (one.seed, one.example_variance) == (0.0, pytest.approx(np.var(d[0], ddof=1) / n))
    assert one.predicted(3, n)[0] == pytest.approx(np.var(d[0], ddof=1) / (3 * n))  # from one seed: all σ_w²


# The outcome patterns of issue 13, on the default data's shape: 3 seeds × 270 test images = 810 pairs.

def test_identical_outputs_get_the_width_of_their_test_examples():
    # No pair differs in any seed: nothing shows whether the seeds would flip the same examples, so the evidence is
    # 270 test examples, not 810 pairs (were 0.75% of examples to flip in every seed, 270 would show none 13% of
    # the time; ±0.48 pp, 810 pairs' width, called that "equivalent").
    s = paired_accuracy(*outcomes(3, 270))
    assert (s.mean, s.arm_right_fp32_wrong, s.fp32_right_arm_wrong, s.design_effect) == (0.0, 0, 0, 3.0)
    assert s.ci_high == pytest.approx(T269**2 / (270 + T269**2)) and s.ci_low == pytest.approx(-s.ci_high)  # ±1.42 pp
    assert verdict(s, MARGIN)[0] == "inconclusive" and verdict(s, 0.02)[0] == "equivalent"
    # One seed of the same test set: the same interval.
    one = paired_accuracy(*outcomes(1, 270))
    assert (one.ci_low, one.ci_high) == pytest.approx((s.ci_low, s.ci_high))


def test_identical_per_seed_values_never_give_a_zero_width_interval():
    # Per-seed differences 0, 0, 0 although seed 0 has one flip each way.
    zero = paired_accuracy(*outcomes(3, 270, fp32_only={0: [5]}, arm_only={0: [9]}))
    assert zero.std == 0 and zero.mean == 0 and zero.ci_high - zero.ci_low > 0.01
    assert verdict(zero, MARGIN)[0] == "inconclusive"  # 2 of 810 pairs cannot rule out a 0.5 pp effect
    assert verdict(zero, 0.01)[0] == "equivalent"  # but they do rule out 1 pp
    # One discordant pair (per-seed −1, 0, 0 images): the old t interval would be ±0.53 pp around −0.12.
    one = paired_accuracy(*outcomes(3, 270, fp32_only={0: [5]}))
    assert (one.fp32_right_arm_wrong, one.arm_right_fp32_wrong) == (1, 0) and one.ci_low < one.mean < 0 < one.ci_high


def test_a_steady_gain_of_two_images_per_seed_is_detected_but_not_called_better():
    """Per-seed +2, +2, +2 images: the old zero-width t interval called this "better"; 6 of 810 pairs show a
    real difference (it excludes 0) but cannot show it exceeds the 0.5 pp margin."""
    s = paired_accuracy(*outcomes(3, 270, arm_only={0: [1, 2], 1: [3, 4], 2: [5, 6]}))
    assert s.std == 0 and s.mean == pytest.approx(2 / 270)
    assert differs_from_zero(s) and s.ci_low < MARGIN < s.ci_high
    assert verdict(s, MARGIN)[0] == "inconclusive"


def test_a_systematic_loss_of_four_images_per_seed_is_worse():
    s = paired_accuracy(*outcomes(3, 270, fp32_only={0: [1, 2, 3, 4], 1: [5, 6, 7, 8], 2: [9, 10, 11, 12]}))
    assert s.design_effect == 1.0  # different images each seed: independent evidence
    assert verdict(s, MARGIN)[0] == "worse" and s.ci_high < -MARGIN


def test_the_same_images_flipping_in_every_seed_count_once():
    same = {s: [1, 2, 3, 4] for s in range(3)}
    s = paired_accuracy(*outcomes(3, 270, fp32_only=same))
    assert s.design_effect == pytest.approx(3, rel=0.01)  # 12 discordant pairs, but only 4 images
    low, high = tango_interval(0, 12 / s.design_effect, 810 / s.design_effect, critical=T269)
    assert (s.ci_low, s.ci_high) == pytest.approx((low, high))
    assert differs_from_zero(s) and verdict(s, MARGIN)[0] == "inconclusive"  # 4 images cannot prove > 0.5 pp


def test_seeds_that_disagree_widen_the_interval_to_the_seed_t_interval():
    # Per-seed +5, −5, 0 images: seed-to-seed variation far beyond what 10 flips per seed explain on examples.
    arm, ref = outcomes(3, 270, arm_only={0: [0, 1, 2, 3, 4]}, fp32_only={1: [5, 6, 7, 8, 9]})
    s = paired_accuracy(arm, ref)
    t = paired_ci([5 / 270, -5 / 270, 0.0])
    assert (s.ci_low, s.ci_high) == pytest.approx((t.ci_low, t.ci_high))
    assert verdict(s, MARGIN)[0] == "inconclusive"


def test_seeds_that_agree_as_example_sampling_predicts_add_no_width():
    """Flips spread evenly over the seeds (3 per seed, on different images): the seeds differ no more than
    example sampling explains, so the interval is the pooled score interval, at the examples' degrees of freedom."""
    arm, ref = outcomes(3, 270, fp32_only={0: [1, 2, 3], 1: [4, 5, 6], 2: [7, 8, 9]})
    s = paired_accuracy(arm, ref)
    assert s.design_effect == 1.0
    assert (s.ci_low, s.ci_high) == pytest.approx(tango_interval(0, 9, 810, critical=T269))


def test_non_finite_logits_give_no_interval():
    s = paired_accuracy(*outcomes(3, 270), finite=False)
    assert not s.finite and verdict(s, MARGIN)[0] == "invalid"


def _coverage(draw, true_delta: float, replicates: int = 300) -> tuple[float, float]:
    """(coverage of paired_accuracy, share of replicates where the per-seed t interval alone has zero width)
    over seeded replicates; paired_accuracy's interval must never have zero width."""
    rng = np.random.default_rng(1234)
    covered = zero_width = 0
    for _ in range(replicates):
        arm, ref = draw(rng)
        s = paired_accuracy(arm, ref)
        assert s.ci_high > s.ci_low
        covered += s.ci_low <= true_delta <= s.ci_high
        t = paired_ci(list((arm.astype(int) - ref.astype(int)).mean(axis=1)))
        zero_width += t.ci_high == t.ci_low
    return covered / replicates, zero_width / replicates


def test_coverage_when_flips_are_rare_and_independent():
    """The regime of the default run: each pair flips against the arm with p 0.3% and for it with p 0.1%."""

    def draw(rng):
        u = rng.random((3, 400))
        return ~(u < 0.003), ~((u >= 0.003) & (u < 0.004))  # arm wrong / fp32 wrong, never both

    ours, zero_width = _coverage(draw, 0.001 - 0.003)
    assert ours >= 0.93  # nominal 95%
    assert zero_width > 0.05  # why the per-seed t interval alone is the wrong model here: false certainty


def test_coverage_when_the_same_examples_flip_in_every_seed():
    """2% of the test examples are fragile: in every seed, each flips against the arm with probability 0.5."""

    def draw(rng):
        fragile = rng.random(300) < 0.02
        flips = fragile & (rng.random((3, 300)) < 0.5)
        return ~flips, np.ones((3, 300), dtype=bool)

    ours, _ = _coverage(draw, -0.02 * 0.5)
    assert ours >= 0.92


def test_loss_differences_use_examples_and_seeds():
    rng = np.random.default_rng(0)
    example_effect = rng.normal(0, 0.01, 200)
    d = example_effect + rng.normal(0, 0.001, (3, 200))  # the same examples shift in every seed
    s = paired_mean(d)
    half = st.t.ppf(0.975, 199) * math.sqrt(np.var(d.mean(axis=0), ddof=1) / 200)
    assert s.ci_high - s.mean == pytest.approx(half, rel=0.05)
    t = paired_ci(list(d.mean(axis=1)))
    assert t.ci_high - t.mean < half  # the per-seed t interval alone would miss the example sampling
    assert paired_mean(np.zeros((3, 10))).ci_high == 0  # identical outputs: a continuous difference of exactly 0
    assert not paired_mean(np.array([[0.0, math.inf]])).finite


def test_auto_margins_come_from_fp32_seed_noise():
    noise = SeedNoise(accuracy_sd=0.002, loss_sd=0.01, disagreement=0.01, test_examples=270)
    m = resolve_margins("auto", "auto", noise)
    assert m.accuracy == pytest.approx(1 / 270) and m.accuracy_rule == "auto"  # floored at one test example
    assert m.loss == 0.01 and m.loss_rule == "auto"
    big = resolve_margins("auto", 0.05, SeedNoise(0.008, 0.01, 0.02, 270))
    assert big.accuracy == 0.008 and (big.loss, big.loss_rule) == (0.05, "set")
    fixed = resolve_margins(0.5, 0.02, SeedNoise(None, None, None, 270))
    assert (fixed.accuracy, fixed.loss, fixed.accuracy_rule) == (0.005, 0.02, "set")
    with pytest.raises(ValueError, match="at least 2 seeds"):
        resolve_margins("auto", 0.02, SeedNoise(None, None, None, 270))


def test_the_difference_is_judged_against_seed_noise():
    s = paired_accuracy(*outcomes(3, 270, fp32_only={0: [1, 2, 3, 4], 1: [5, 6, 7, 8], 2: [9, 10, 11, 12]}))
    assert against_noise(s, 0.002)[0] == "beyond"
    label, text = against_noise(paired_accuracy(*outcomes(3, 270)), 0.02, " pp", 100)
    assert label == "within" and text == "smaller than fp32's own seed-to-seed variation (±2.00 pp)"
    assert against_noise(s, 0.01)[0] == "not separable"
    assert against_noise(s, None)[0] == "unknown"
    # Issue 29.4: the reason reads "the difference is <text>"; with one seed it once read "the difference is fp32's
    # seed-to-seed variation needs at least 2 seeds".
    text = against_noise(s, None)[1]
    assert f"the difference is {text}" == ("the difference is not compared with fp32's seed-to-seed variation, "
                                           "which needs at least 2 seeds")


def test_not_worse_reads_the_one_sided_bound_on_the_bad_side():
    """Accuracy: the lower bound decides (≥ −margin, the end included); loss: the upper bound (≤ +margin)."""
    from ampbench.verdict.stats import PairedSummary

    def s(lo, hi, n=3):
        return PairedSummary(n, (lo + hi) / 2, 0.01, lo, hi, confidence=one_sided_level(0.95))

    assert not_worse(s(-0.005, 0.09), MARGIN)[0] == "not worse"  # far better, still not worse
    assert not_worse(s(-0.0051, 0.001), MARGIN)[0] == "inconclusive"
    assert not_worse(s(-0.02, -0.006), MARGIN)[0] == "worse"
    assert not_worse(s(-0.09, 0.005), 0.005, higher_is_better=False)[0] == "not worse"  # loss: lower is better
    assert not_worse(s(0.006, 0.02), 0.005, higher_is_better=False)[0] == "worse"
    label, reason = not_worse(s(-0.004, 0.01), MARGIN, True, " pp", 100)
    assert reason == "the one-sided 95% lower bound -0.40 pp is within the margin -0.50 pp"
    assert "the seed-to-seed variation was not measured" in not_worse(s(-0.004, 0.01, n=1), MARGIN)[1]
    assert not_worse(PairedSummary(2, math.nan, math.nan, None, None, finite=False), MARGIN)[0] == "invalid"


@pytest.mark.parametrize("pattern", ["independent", "clustered"])
def test_one_sided_bounds_cover_at_their_level(pattern):
    """Issue 29.2: coverage of the one-sided bound (the interval at 2·0.95 − 1 = 90%, one end) by simulation:
    the true difference lies above the lower bound in ≥ ~95% of replicates, for accuracy and for loss."""
    rng = np.random.default_rng(29)
    level, hits_acc, hits_loss, reps = one_sided_level(0.95), 0, 0, 300
    for _ in range(reps):
        if pattern == "independent":
            u = rng.random((3, 400))
            arm, ref = ~(u < 0.006), ~((u >= 0.006) & (u < 0.008))
            true_acc = 0.002 - 0.006
        else:
            fragile = rng.random(300) < 0.04
            arm, ref = ~(fragile & (rng.random((3, 300)) < 0.5)), np.ones((3, 300), dtype=bool)
            true_acc = -0.04 * 0.5
        hits_acc += paired_accuracy(arm, ref, level).ci_low <= true_acc
        d = rng.normal(0.01, 0.05, arm.shape[1]) + rng.normal(0, 0.02, arm.shape)  # example + seed × example
        hits_loss += paired_mean(d - 0.0, level).ci_high >= 0.01
    assert hits_acc / reps >= 0.93 and hits_loss / reps >= 0.93
