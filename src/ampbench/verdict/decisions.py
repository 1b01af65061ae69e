"""Verdicts on paired differences (``stats.PairedSummary``): equivalence within a margin, non-inferiority (*not
worse*) from one-sided bounds, and the comparison with fp32's own seed-to-seed variation — each a label and the
reason in words.

Equivalence: ``equivalent`` when the whole interval sits inside ±margin (its ends included), ``worse``/``better``
when it sits wholly outside, ``inconclusive`` otherwise, ``invalid`` when a value is not finite; the pipeline
judges it on the one-sided bounds (two one-sided tests). Non-inferiority
asks the tutorial's question ("confirm nothing degraded"): ``not worse`` when the one-sided bound on the bad side
clears the margin, so a better arm passes it.
"""

from __future__ import annotations

from ampbench.verdict.stats import PairedSummary


def verdict(s: PairedSummary, margin: float, higher_is_better: bool = True, unit: str = "",
            scale: float = 1.0, digits: int = 2, one_sided: bool = False) -> tuple[str, str]:
    """(verdict, reason) for paired differences ``s`` against an equivalence margin (same units as s).

    ``one_sided``: ``s`` was computed at ``one_sided_level(confidence)``, so its ends are one-sided bounds and the
    verdict is the two one-sided tests (TOST) at 1 − confidence each: *equivalent* when neither bound leaves the
    margin — the usual equivalence test, whose false-*equivalent* rate on the margin is at most 1 − confidence.
    ``scale``, ``unit`` and ``digits`` only format the reason (e.g. scale=100, unit=" pp" for accuracy fractions).
    """

    def f(x: float) -> str:
        return f"{x * scale:+.{digits}f}{unit}"

    m = f"±{margin * scale:.{digits}f}{unit}"
    if not s.finite:
        return "invalid", "a value is not finite (NaN or inf), so there is no difference to judge"
    if s.ci_low is None:
        return "inconclusive", (f"1 seed gives no confidence interval (difference {f(s.mean)}); "
                                "add seeds to train.seeds for a verdict")
    lo, hi = s.ci_low, s.ci_high
    if one_sided:
        what, lies, is_ = f"the one-sided {100 * (1 + s.confidence) / 2:g}% bounds [{f(lo)}, {f(hi)}]", "lie", "are"
    else:
        what, lies, is_ = f"the {100 * s.confidence:g}% CI [{f(lo)}, {f(hi)}]", "lies", "is"
    caveat = _one_seed(s)
    if -margin <= lo and hi <= margin:  # the margin's ends count as inside
        return "equivalent", f"{what} {lies} inside the margin {m}{caveat}"
    below, above = hi < -margin, lo > margin
    if below or above:
        good = above if higher_is_better else below
        return ("better" if good else "worse"), f"{what} {lies} wholly outside the margin {m}{caveat}"
    half = (hi - lo) / 2
    if half > margin:
        more = "seeds (train.seeds) or test examples" if s.pairs else "seeds (train.seeds)"
        return "inconclusive", (f"{what} {is_} ±{half * scale:.{digits}f}{unit} wide, more than the margin "
                                f"{m}: too little evidence to separate a {abs(s.mean) * scale:.{digits}f}{unit} "
                                f"effect from the margin; more {more} narrow it{caveat}")
    return "inconclusive", f"{what} straddle{'s' * (lies == 'lies')} the margin {m}{caveat}"


def one_sided_level(confidence: float) -> float:
    """The two-sided level whose ends are one-sided bounds at ``confidence`` (0.95 → 0.90: each end leaves 5%)."""
    return 2 * confidence - 1


def not_worse(s: PairedSummary, margin: float, higher_is_better: bool = True, unit: str = "", scale: float = 1.0,
              digits: int = 2) -> tuple[str, str]:
    """(verdict, reason) of the question the tutorial asks — did anything degrade? — for paired differences ``s``
    whose interval was computed at ``one_sided_level(confidence)``, so each end is a one-sided bound.

    ``not worse``: the bound on the bad side clears the margin (accuracy: lower bound ≥ −margin; loss: upper bound
    ≤ +margin; the margin's end included); ``worse``: even the bound on the good side is past it; ``inconclusive``
    otherwise; ``invalid`` when a value is not finite. Unlike equivalence, a better arm is not worse.
    """

    def f(x: float) -> str:
        return f"{x * scale:+.{digits}f}{unit}"

    if not s.finite:
        return "invalid", "a value is not finite (NaN or inf), so there is no difference to judge"
    if s.ci_low is None:
        return "inconclusive", (f"1 seed gives no confidence bound (difference {f(s.mean)}); add seeds to "
                                "train.seeds for a verdict")
    level = f"{100 * (1 + s.confidence) / 2:g}%"
    caveat = _one_seed(s)
    limit = -margin if higher_is_better else margin
    bad, good = (s.ci_low, s.ci_high) if higher_is_better else (s.ci_high, s.ci_low)
    side, other = ("lower", "upper") if higher_is_better else ("upper", "lower")
    cleared = bad >= limit if higher_is_better else bad <= limit
    if cleared:
        return "not worse", f"the one-sided {level} {side} bound {f(bad)} is within the margin {f(limit)}{caveat}"
    if (good < limit) if higher_is_better else (good > limit):
        return "worse", f"even the one-sided {level} {other} bound {f(good)} is past the margin {f(limit)}{caveat}"
    return "inconclusive", (f"the one-sided {level} {side} bound {f(bad)} is past the margin {f(limit)}: the data "
                            f"cannot rule out a degradation larger than the margin{caveat}")


def _one_seed(s: PairedSummary) -> str:
    return "; with 1 seed, the seed-to-seed variation was not measured (it is not in the interval)" if s.n == 1 else ""


def differs_from_zero(s: PairedSummary) -> bool:
    """True when the interval excludes 0: a difference this sample detects, whatever the margin says."""
    return s.finite and s.ci_low is not None and (s.ci_low > 0 or s.ci_high < 0)


def against_noise(s: PairedSummary, floor: float | None, unit: str = "", scale: float = 1.0,
                  digits: int = 2) -> tuple[str, str]:
    """(label, text): is the paired difference ``s`` distinguishable from fp32's seed noise ``floor``?

    within: the whole interval lies inside ±floor (the precision changes less than the seed does); beyond: wholly
    outside (a real precision effect); not separable: neither; unknown: one seed or a non-finite value.
    """
    if floor is None or not s.finite or s.ci_low is None:
        return "unknown", "not compared with fp32's seed-to-seed variation, which needs at least 2 seeds"
    v, _ = verdict(s, floor)
    label = {"equivalent": "within", "better": "beyond", "worse": "beyond"}.get(v, "not separable")
    words = {"within": "smaller than", "beyond": "larger than", "not separable": "not distinguishable from"}[label]
    return label, f"{words} fp32's own seed-to-seed variation (±{floor * scale:.{digits}f}{unit})"
