"""The speed stage's numbers, torch-free: per arm the ratio to fp32 round by round, the median over rounds with an
order-statistic interval, *unstable* when that is wide, and which rounds disagreed — and the words for them.
``interleaved.py`` measures the rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ampbench.config.arms import BASELINE, TF32_REFERENCE

UNSTABLE_SPREAD = 0.2  # an interval wider than this share of its median (±10%) is called unstable
DISAGREE_SHARE = 0.1  # a round whose ratio is this far from the median is named as one that disagreed


@dataclass(frozen=True)
class Interval:
    """A median with a distribution-free interval from order statistics and the coverage it really has."""

    median: float
    low: float
    high: float
    coverage: float  # of the true median, under independent rounds

    @property
    def unstable(self) -> bool:
        return (self.high - self.low) > UNSTABLE_SPREAD * self.median


def median_interval(xs: list[float], confidence: float = 0.95) -> Interval | None:
    """The median of ``xs`` with the order-statistic interval [x(k), x(n−k+1)] that covers the true median with
    probability ≥ ``confidence`` (binomial, p = ½) — or, with too few values for that, the whole range and the
    coverage it has (5 values: 93.75%). None without values."""
    from scipy.stats import binom

    n = len(xs)
    if not n:
        return None
    ordered = sorted(xs)
    coverage = lambda k: 1 - 2 * float(binom.cdf(k - 1, n, 0.5))  # of [x(k), x(n−k+1)]  # noqa: E731
    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= confidence:
        k += 1
    return Interval(statistics.median(xs), ordered[k - 1], ordered[n - k], coverage(k))


def summarise(rounds: dict[str, list[float | None]]) -> dict[str, Any]:
    """Per arm: samples/s per round, their median, and the median over rounds of its ratio to fp32 (and tf32) of
    the same round with its interval; *unstable* with the rounds that disagreed. Torch-free."""
    arms: dict[str, Any] = {}
    for arm, values in rounds.items():
        kept = [v for v in values if v is not None]
        row: dict[str, Any] = {"rounds": values, "samples_per_s": statistics.median(kept) if kept else None}
        for ref in (BASELINE, TF32_REFERENCE):
            if ref == arm or ref not in rounds:
                continue
            # Round by round: both arms ran in it, back to back, under whatever load the machine had then.
            by_round = {r: a / b for r, (a, b) in enumerate(zip(values, rounds[ref], strict=True), 1) if a and b}
            iv = median_interval(list(by_round.values()))
            if iv is None:
                continue
            row[f"speedup_vs_{ref}"], row[f"speedup_vs_{ref}_ci"] = iv.median, [iv.low, iv.high]
            if ref == BASELINE:
                row.update({"ratios": list(by_round.values()), "coverage": iv.coverage, "unstable": iv.unstable,
                            "disagreeing_rounds": [r for r, x in by_round.items()
                                                   if abs(x / iv.median - 1) > DISAGREE_SHARE]})
        arms[arm] = row
    return {"arms": arms}


def rounds_text(row: dict[str, Any], shown: int = 8) -> str:
    """Which rounds disagreed with the median ratio by more than DISAGREE_SHARE, in words."""
    bad, n = row.get("disagreeing_rounds") or [], len(row.get("ratios") or [])
    listed = ", ".join(map(str, bad[:shown])) + (" …" if len(bad) > shown else "")
    share = f"{100 * DISAGREE_SHARE:.0f}%"
    return (f"rounds {listed} ({len(bad)} of {n}) differ from the median ratio by more than {share}" if bad
            else f"no round differs from the median ratio by more than {share}")
