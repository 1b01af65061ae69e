"""Paired statistics: per-example paired intervals, the seed-level t interval, seed noise and margins.

Each non-baseline arm is compared with the fp32 arm *of the same seed on the same test examples*. The paired
differences, seeds × test examples, vary for two reasons the data measure with very different precision
(``variance.py``): the test examples (N − 1 degrees of freedom) and the seeds (S − 1). The interval is the hull of
an example-level interval and the Student-t interval over the per-seed differences, so it covers both:

- examples: accuracy uses Tango's score interval on the pooled discordant counts (arm right where fp32 was wrong,
  and the reverse) deflated by the design effect (the examples' variance component, MS_example / (S·N), over the
  independent-pairs variance, ≥ 1: an example that flips in every seed counts once); it is never zero-width (with
  no discordant pair at all it keeps the width N agreeing examples allow: the design effect is then S). Loss uses
  a t interval on the same variance of the per-example loss differences.
- seeds: the t interval over the S per-seed differences, which covers a seed effect of any size.

The hull is what stays valid whatever the seeds' own effect: with S seeds it is estimated on S − 1 degrees of
freedom, and an interval that narrows when that estimate happens to be small undercovers when seeds really
differ (a Satterthwaite combination of the variance components covered 92.5% at worst with 3 seeds). What each
choice costs and gains, by simulation and by the bound no interval of this data can beat, is in docs/verdict.md
and ``scripts/verdict_simulation.py``.

``SeedNoise`` is fp32's own seed-to-seed variation, the floor a precision effect is judged against and the source
of ``auto`` margins. The verdicts on these intervals are in ``decisions.py``; the sample-size plans in ``plan.py``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


class Confidence(float):
    """A two-sided confidence level (the float: what the examples' interval uses) whose Student-t interval over
    seeds (``paired_ci``) uses its own level ``seeds``: a sequential design's look, where the two intervals' levels
    are calibrated each for its own statistic (``sequential.t_levels``). A plain float is both; a task's own
    ``paired`` that reads the float alone uses the examples' level for both."""

    seeds: float

    def __new__(cls, level: float, seeds: float | None = None):
        obj = super().__new__(cls, level)
        obj.seeds = float(level) if seeds is None else float(seeds)
        return obj


def seeds_level(confidence: float) -> float:
    """The level of the t interval over seeds at ``confidence`` (``Confidence.seeds``, else the level itself)."""
    return float(getattr(confidence, "seeds", confidence))


@dataclass(frozen=True)
class PairedSummary:
    """Paired differences (arm − fp32) of one metric: the mean over seeds (and examples) and its interval."""

    n: int  # seeds
    mean: float  # NaN when a value is not finite
    std: float  # sample std of the per-seed differences (n − 1); 0 with one seed
    ci_low: float | None  # None when no interval exists (one seed, no per-example data) or a value is not finite
    ci_high: float | None
    confidence: float = 0.95
    finite: bool = True  # False: some value is NaN or ±inf, and no statistic is meaningful
    # Per-example statistics (None for metrics compared per seed only):
    pairs: int | None = None  # paired test predictions: seeds × test examples
    arm_right_fp32_wrong: int | None = None  # discordant pairs in the arm's favour (accuracy only)
    fp32_right_arm_wrong: int | None = None  # and against it
    design_effect: float | None = None  # variance inflation for clustered pairs (≥ 1; 1 = independent pairs)
    components: dict | None = None  # ``variance.Components.to_dict()``: what the sample-size plans start from

    def to_dict(self) -> dict:
        return asdict(self)


def paired_ci(differences: list[float], confidence: float = 0.95,
              bounds: tuple[float | None, float | None] = (None, None)) -> PairedSummary:
    """Mean of the differences with a two-sided Student-t interval (df = n − 1), cut to ``bounds`` (the range the
    quantity can take, e.g. (0, 1) for a share), at ``seeds_level(confidence)``."""
    from scipy import stats as st

    confidence = seeds_level(confidence)
    n = len(differences)
    if n == 0:
        raise ValueError("no paired differences")
    if not all(math.isfinite(d) for d in differences):  # statistics.stdev raises on NaN (Python 3.11)
        return PairedSummary(n, math.nan, math.nan, None, None, confidence, finite=False)
    mean = statistics.fmean(differences)
    if n == 1:
        return PairedSummary(1, mean, 0.0, None, None, confidence)
    std = statistics.stdev(differences)
    t = float(st.t.ppf(0.5 + confidence / 2, df=n - 1))
    half = t * std / math.sqrt(n)
    return PairedSummary(n, mean, std, *_clip(mean - half, mean + half, bounds), confidence)


def _clip(low: float, high: float, bounds: tuple[float | None, float | None]) -> tuple[float, float]:
    lo, hi = bounds
    return (low if lo is None else max(low, lo)), (high if hi is None else min(high, hi))


def tango_statistic(delta: float, b: float, c: float, n: float) -> float:
    """Tango's (1998) score statistic for H0: p_b − p_c = delta in a paired 2×2 table with n pairs, b discordant
    pairs one way and c the other (non-integer counts allowed: effective counts). At delta = 0 it is McNemar's
    (b − c) / √(b + c)."""
    a_, b_ = 2 * n, -b - c + (2 * n - b + c) * delta
    c_ = -c * delta * (1 - delta)
    p_c = (-b_ + math.sqrt(max(b_ * b_ - 4 * a_ * c_, 0.0))) / (2 * a_)  # restricted MLE of p_c under H0
    var = n * (2 * p_c + delta * (1 - delta))
    num = b - c - n * delta
    if var <= 0:
        return math.copysign(math.inf, num) if num else 0.0
    return num / math.sqrt(var)


def tango_interval(b: float, c: float, n: float, confidence: float = 0.95,
                   critical: float | None = None) -> tuple[float, float]:
    """Tango's score interval for p_b − p_c (the paired difference of two proportions): every delta whose score
    statistic is within ±z (``critical`` when given: a t quantile for few degrees of freedom). Unlike a Wald
    interval it keeps its width when b and c are small or zero (b = c = 0 gives ±z² / (n + z²)), which is the
    usual case here: 16-bit arms rarely flip a prediction."""
    from scipy import optimize
    from scipy import stats as st

    z = float(st.norm.ppf(0.5 + confidence / 2)) if critical is None else critical
    est = (b - c) / n
    eps = 1e-12

    def end(target: float, a: float, bound: float) -> float:
        """Where the statistic (falling monotonically in delta, 0 at the estimate) crosses ``target`` between
        the estimate and ``bound``; the bound itself when it never does there (a large t quantile on few
        effective pairs)."""
        f = lambda x: tango_statistic(x, b, c, n) - target  # noqa: E731
        if abs(a - bound) <= eps or f(bound) * f(a) > 0:
            return float(round(bound))
        return optimize.brentq(f, min(a, bound), max(a, bound), xtol=1e-12)

    return end(z, est, -1 + eps), end(-z, est, 1 - eps)


def critical_value(confidence: float, df: float) -> float:
    """The two-sided quantile at ``confidence``: Student's t with ``df`` degrees of freedom (normal when inf)."""
    from scipy import stats as st

    q = 0.5 + confidence / 2
    return float(st.norm.ppf(q) if math.isinf(df) else st.t.ppf(q, df))


def _hull(low: float, high: float, per_seed: PairedSummary) -> tuple[float, float]:
    if per_seed.ci_low is None:
        return low, high
    return min(low, per_seed.ci_low), max(high, per_seed.ci_high)


def paired_accuracy(arm_correct, ref_correct, confidence: float = 0.95, finite: bool = True) -> PairedSummary:
    """Δaccuracy (arm − fp32) from per-example outcomes: boolean arrays, seeds × test examples, same examples in
    the same order. The hull of Tango's score interval on the pooled discordant counts deflated by the design
    effect (t quantile, N − 1 degrees of freedom) and the Student-t interval over the per-seed differences;
    ``finite=False`` (an arm's logits were not finite) gives no interval and an ``invalid`` verdict."""
    import numpy as np

    from ampbench.verdict.variance import components

    d = np.asarray(arm_correct, dtype=np.int8) - np.asarray(ref_correct, dtype=np.int8)
    s, n_ex = d.shape
    n = d.size
    b, c = int((d == 1).sum()), int((d == -1).sum())
    per_seed = paired_ci([float(x) for x in d.mean(axis=1)], confidence, (-1, 1))
    extra = {"pairs": n, "arm_right_fp32_wrong": b, "fp32_right_arm_wrong": c}
    if not finite:
        return PairedSummary(s, math.nan, math.nan, None, None, float(confidence), finite=False, **extra)
    comp = components(d)
    deff = comp.design_effect  # S with no discordant pair: S seeds of 270 agreeing examples are not 270·S pairs
    critical = critical_value(confidence, max(n_ex - 1, 1))
    low, high = _hull(*tango_interval(b / deff, c / deff, n / deff, confidence, critical), per_seed)
    return PairedSummary(s, (b - c) / n, per_seed.std, low, high, float(confidence), design_effect=deff,
                         components=comp.to_dict(), **extra)


def paired_mean(d, confidence: float = 0.95, bounds: tuple[float | None, float | None] = (None, None),
                finite: bool = True) -> PairedSummary:
    """Mean paired difference of a per-example quantity (e.g. the cross-entropy, arm − fp32; seeds × examples):
    the hull of a t interval (N − 1 degrees of freedom) on the examples' variance component and the Student-t
    interval over the per-seed means, cut to ``bounds``. A non-finite value, or ``finite=False`` (the logits behind
    it were not finite), gives no interval."""
    import numpy as np

    from ampbench.verdict.variance import components

    d = np.asarray(d, dtype=np.float64)
    s, n_ex = d.shape
    if not finite or not np.isfinite(d).all():
        return PairedSummary(s, math.nan, math.nan, None, None, float(confidence), finite=False, pairs=d.size)
    per_seed = paired_ci([float(x) for x in d.mean(axis=1)], confidence, bounds)
    comp = components(d)
    mean = float(d.mean())
    half = critical_value(confidence, max(n_ex - 1, 1)) * math.sqrt(comp.example_variance)
    low, high = _hull(*_clip(mean - half, mean + half, bounds), per_seed)
    return PairedSummary(s, mean, per_seed.std, low, high, float(confidence), pairs=d.size,
                         design_effect=comp.design_effect, components=comp.to_dict())


@dataclass(frozen=True)
class SeedNoise:
    """fp32's own seed-to-seed variation: how much the test metrics move when only the seed changes."""

    accuracy_sd: float | None  # sample std over seeds of fp32's test accuracy (fraction); None with one seed
    loss_sd: float | None  # the same for the test loss, nats
    disagreement: float | None  # mean share of test predictions on which two fp32 seeds differ
    test_examples: int

    @property
    def accuracy_floor(self) -> float | None:
        """The accuracy noise floor: the sd, but at least one test example (accuracy cannot resolve less)."""
        return None if self.accuracy_sd is None else max(self.accuracy_sd, 1 / self.test_examples)


@dataclass(frozen=True)
class Margins:
    """The equivalence margins in use (accuracy as a fraction, loss in nats) and how each was set."""

    accuracy: float
    loss: float
    accuracy_rule: str  # "set" | "auto"
    loss_rule: str


def resolve_margins(accuracy_pp: float | str, loss: float | str, noise: SeedNoise) -> Margins:
    """Numbers stay as they are; ``auto`` becomes fp32's seed-to-seed sd (accuracy: at least one test example).

    The rule: a precision effect smaller than what changing the seed alone does to fp32 makes no practical
    difference, so fp32's seed sd is the largest effect still called equivalent.
    """
    if "auto" in (accuracy_pp, loss) and noise.accuracy_sd is None:
        raise ValueError("margin auto needs fp32's seed-to-seed variation: train at least 2 seeds")
    acc = noise.accuracy_floor if accuracy_pp == "auto" else float(accuracy_pp) / 100
    los = noise.loss_sd if loss == "auto" else float(loss)
    return Margins(acc, los, "auto" if accuracy_pp == "auto" else "set", "auto" if loss == "auto" else "set")


def expected_calibration_error(probs, labels, bins: int = 15) -> float:
    """ECE: mean |accuracy − confidence| over equal-width confidence bins, weighted by bin size."""
    import torch

    conf, pred = probs.max(dim=1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, bins + 1, device=probs.device)
    ece = torch.zeros((), device=probs.device)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            ece += inside.float().mean() * (correct[inside].mean() - conf[inside].mean()).abs()
    return float(ece)
