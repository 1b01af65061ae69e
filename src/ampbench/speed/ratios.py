"""The harness's numbers, torch-free: an arm's ratio to a reference round by round, the median over rounds with an
order-statistic interval, *unstable* when that is wide, which rounds disagreed, a goal's verdict from the interval
— and the words for them. The
speed stage's table (``summarise``, reports/interleaved.json) and the bench's ratios are both made here;
``harness.py`` measures the rounds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ampbench.config.arms import BASELINE, TF32_REFERENCE

UNSTABLE_SPREAD = 0.2  # an interval wider than this share of its median (±10%) is called unstable
DISAGREE_SHARE = 0.1  # a round whose ratio is this far from the median is named as one that disagreed
# The least coverage an interval needs before it may decide a goal: fewer values give only their range, which covers
# the median with 50% (2 values) to 87.5% (4): 5 values at least (93.75%).
DECIDE_COVERAGE = 0.9
WITHIN, ABOVE, UNDECIDED = "within", "above", "undecided"


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
    n = len(xs)
    if not n:
        return None
    ordered = sorted(xs)

    def coverage(k: int) -> float:  # of [x(k), x(n−k+1)]: 1 − 2·P(B(n, ½) ≤ k − 1), exact (no scipy on a GPU box)
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= confidence:
        k += 1
    return Interval(statistics.median(xs), ordered[k - 1], ordered[n - k], coverage(k))


@dataclass(frozen=True)
class Ratio:
    """One arm's samples/s over a reference's, round by round (both ran in it, back to back, under whatever load
    the machine had then): the median of the per-round ratios with its order-statistic interval."""

    interval: Interval
    by_round: dict[int, float]  # round (1-based) → ratio; rounds where either has no value are left out

    @property
    def disagreeing_rounds(self) -> list[int]:
        """The rounds whose ratio is more than DISAGREE_SHARE from the median."""
        return [r for r, x in self.by_round.items() if abs(x / self.interval.median - 1) > DISAGREE_SHARE]


def goal_verdict(interval: Interval | None, goal: float) -> str:
    """An upper goal's verdict from an interval: *within* when all of it is ≤ ``goal``, *above* when all of it is
    above, else *undecided* — also without an interval, or with one that covers less than DECIDE_COVERAGE."""
    if interval is None or interval.coverage < DECIDE_COVERAGE:
        return UNDECIDED
    if interval.high <= goal:
        return WITHIN
    return ABOVE if interval.low > goal else UNDECIDED


def verdict_text(verdict: str, interval: Interval | None, goal: str, n: int, unit: str = "round") -> str:
    """``goal_verdict``'s answer in words, with why an undecided one is undecided (``n``: the ``unit``s it had)."""
    units = f"{n} {unit}{'s' * (n != 1)}"
    if verdict != UNDECIDED:
        return f"{verdict} (over {units})"
    if interval is None:
        return f"undecided: no {unit} measured"
    if interval.coverage < DECIDE_COVERAGE:
        return f"undecided: {units}, too few for a {100 * DECIDE_COVERAGE:.0f}% interval (5 at least)"
    return f"undecided: the interval holds the goal ({goal}) after {units}"


def ratio(values: list[float | None], reference: list[float | None]) -> Ratio | None:
    """``values`` over ``reference`` round by round (the same rounds); None when no round has both."""
    by_round = {r: a / b for r, (a, b) in enumerate(zip(values, reference, strict=True), 1) if a and b}
    iv = median_interval(list(by_round.values()))
    return None if iv is None else Ratio(iv, by_round)


def median_value(values: list[float | None]) -> float | None:
    """The median of the rounds that have a value."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarise(rounds: dict[str, list[float | None]]) -> dict[str, Any]:
    """Per arm: samples/s per round, their median, and the ratio to fp32 (and tf32) round by round with its
    interval; *unstable* with the rounds that disagreed: the ``arms`` of reports/interleaved.json. Torch-free."""
    arms: dict[str, Any] = {}
    for arm, values in rounds.items():
        row: dict[str, Any] = {"rounds": values, "samples_per_s": median_value(values)}
        for ref, key in ((BASELINE, "speedup_vs_fp32"), (TF32_REFERENCE, "speedup_vs_tf32")):
            r = ratio(values, rounds[ref]) if ref != arm and ref in rounds else None
            if r is None:
                continue
            row[key], row[f"{key}_ci"] = r.interval.median, [r.interval.low, r.interval.high]
            if ref == BASELINE:
                row.update({"ratios": list(r.by_round.values()), "coverage": r.interval.coverage,
                            "unstable": r.interval.unstable, "disagreeing_rounds": r.disagreeing_rounds})
        arms[arm] = row
    return {"arms": arms}


def rounds_text(bad: list[int], n: int, shown: int = 8) -> str:
    """Which rounds (``bad``, of ``n``) disagreed with the median ratio by more than DISAGREE_SHARE, in words."""
    listed = ", ".join(map(str, bad[:shown])) + (" …" if len(bad) > shown else "")
    share = f"{100 * DISAGREE_SHARE:.0f}%"
    return (f"rounds {listed} ({len(bad)} of {n}) differ from the median ratio by more than {share}" if bad
            else f"no round differs from the median ratio by more than {share}")
