"""Paired statistics over seeds: mean, std, Student-t confidence interval and an equivalence verdict.

Each non-baseline arm is compared with the fp32 arm *of the same seed*; the verdict uses those paired
differences. ``equivalent`` when the whole CI sits inside ±margin (its ends included), ``worse``/``better`` when it
sits wholly outside, ``inconclusive`` otherwise, ``invalid`` when a value is not finite — always with the reason
in words.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PairedSummary:
    """Summary of paired differences (arm − fp32) of one metric over seeds."""

    n: int
    mean: float  # NaN when a value is not finite
    std: float  # sample std (n − 1); 0 with one seed
    ci_low: float | None  # None with fewer than 2 seeds (no interval exists) or a non-finite value
    ci_high: float | None
    confidence: float = 0.95
    finite: bool = True  # False: some seed's value is NaN or ±inf, and no statistic is meaningful

    def to_dict(self) -> dict:
        return asdict(self)


def paired_ci(differences: list[float], confidence: float = 0.95,
              bounds: tuple[float | None, float | None] = (None, None)) -> PairedSummary:
    """Mean of the differences with a two-sided Student-t interval (df = n − 1), cut to ``bounds`` (the range the
    quantity can take, e.g. (0, 1) for a share)."""
    from scipy import stats as st

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
    low, high = bounds
    return PairedSummary(n, mean, std, mean - half if low is None else max(mean - half, low),
                         mean + half if high is None else min(mean + half, high), confidence)


def verdict(s: PairedSummary, margin: float, higher_is_better: bool = True, unit: str = "",
            scale: float = 1.0) -> tuple[str, str]:
    """(verdict, reason) for paired differences ``s`` against an equivalence margin (same units as s).

    ``scale`` and ``unit`` only format the reason (e.g. scale=100, unit=" pp" for accuracy fractions).
    """

    def f(x: float) -> str:
        return f"{x * scale:+.2f}{unit}"

    m = f"±{margin * scale:.2f}{unit}"
    if not s.finite:
        return "invalid", "a seed's value is not finite (NaN or inf), so there is no difference to judge"
    if s.ci_low is None:
        return "inconclusive", (f"1 seed gives no confidence interval (difference {f(s.mean)}); "
                                "add seeds to train.seeds for a verdict")
    lo, hi = s.ci_low, s.ci_high
    level = f"{100 * s.confidence:g}%"
    ci = f"CI [{f(lo)}, {f(hi)}]"
    if -margin <= lo and hi <= margin:  # the margin's ends count as inside
        return "equivalent", f"the {level} {ci} lies inside the margin {m}"
    below, above = hi < -margin, lo > margin
    if below or above:
        good = above if higher_is_better else below
        return ("better" if good else "worse"), f"the {level} {ci} lies wholly outside the margin {m}"
    half = (hi - lo) / 2
    if half > margin:
        return "inconclusive", (f"{s.n} seeds are too few to separate a {abs(s.mean) * scale:.2f}{unit} effect "
                                f"from ±{margin * scale:.2f}{unit}; the CI is ±{half * scale:.2f}{unit} ({ci})")
    return "inconclusive", f"the {level} {ci} straddles the margin {m}"


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
