"""Sample-size plans for a verdict that did not decide: how many test examples (at the seeds that ran) or seeds (at
this test set) give ≥ 80% power to show it, if the true difference were the observed one or zero.

The power is that of the pipeline's own procedure (``stats.py``: the hull of the example-level interval and the
Student-t interval over seeds, judged on its one-sided bounds; ``decisions.py``) under the variance components the
data gave (``variance.py``): the difference is normal around the truth with the predicted variance; the
example-level half-width is the one expected at that design (Tango's score interval at the expected discordant
counts for accuracy, so a test set too small to rule out the margin even with no flip at all is never planned);
the seed-level half-width varies as the seeds' sample standard deviation does (a χ² with S − 1 degrees of freedom,
integrated over). ``scripts/verdict_simulation.py`` and ``tests/test_plan.py`` check plans against simulated
verdicts of the full procedure. Torch-free; no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ampbench.verdict.variance import Components

POWER = 0.8
MAX_SEEDS = 64
MAX_EXAMPLES = 10**7


@dataclass(frozen=True)
class Design:
    """What a power calculation needs of one paired comparison."""

    components: Components
    discordance: float | None  # accuracy: share of discordant pairs (None: a continuous difference such as loss)
    margin: float
    confidence: float  # the verdicts' (their one-sided bounds are at this level)
    higher_is_better: bool


def _power(d: Design, question: str, delta: float, seeds: int, examples: int) -> float:
    """``power`` as if at least one pair differed (or the difference is continuous)."""
    import numpy as np
    from scipy import stats as st

    total, example_part, one_seed = d.components.predicted(seeds, examples)
    low_h, high_h = _example_half_widths(d, delta, seeds, examples, example_part)
    q = d.confidence  # one-sided bounds at the verdicts' confidence
    if seeds > 1:  # the seed-level interval's half-width at the quantiles of its sample sd
        chi = st.chi2.ppf((np.arange(200) + 0.5) / 200, seeds - 1) / (seeds - 1)
        seed_h = st.t.ppf(q, seeds - 1) * np.sqrt(one_seed * chi / seeds)
    else:
        seed_h = np.zeros(1)
    lo, hi = np.maximum(low_h, seed_h), np.maximum(high_h, seed_h)  # the hull, per side
    sd = math.sqrt(total)
    if sd == 0:  # no variation at all: the estimate is the truth
        sd = 1e-300
    m = d.margin
    bad_side = lo if d.higher_is_better else hi  # accuracy must clear −margin from above; loss +margin from below
    if question == "not worse":
        z = (delta + m - bad_side) / sd if d.higher_is_better else (m - delta - bad_side) / sd
        return float(np.mean(st.norm.cdf(z)))
    p = st.norm.cdf((m - hi - delta) / sd) - st.norm.cdf((-m + lo - delta) / sd)
    return float(np.mean(np.maximum(p, 0.0)))


def power(d: Design, question: str, delta: float, seeds: int, examples: int) -> float:
    """P(the verdict is *equivalent* (``question`` "equivalent") or *not worse* ("not worse")) with ``seeds``
    seeds and ``examples`` test examples, if the true difference is ``delta``. Where flips are so rare that a run
    may see none, that run is judged on its test examples alone (``variance.Components.design_effect``): its share
    is counted apart, decided only if ``examples`` agreeing examples rule out the margin."""
    value = _power(d, question, delta, seeds, examples)
    if not d.discordance:
        return value
    p, deff = _expected_flips(d, delta, seeds, examples, d.components.predicted(seeds, examples)[1])
    none = (1 - p) ** (seeds * examples / deff)  # clusters of deff pairs flip together
    if none < 1e-9:
        return value
    bound = _example_half_widths(replace(d, discordance=0.0), 0.0, seeds, examples, 0.0)[0]
    return (1 - none) * value + none * float(bound <= d.margin)


def _example_half_widths(d: Design, delta: float, seeds: int, examples: int,
                         example_part: float) -> tuple[float, float]:
    """(below, above) the estimate: the example-level interval's ends at the verdicts' level, as expected at that
    design (Tango's at the expected discordant counts for accuracy; t for a continuous difference)."""
    from scipy import stats as st

    from ampbench.verdict.stats import tango_interval

    t = float(st.t.ppf(d.confidence, max(examples - 1, 1)))
    if d.discordance is None:
        h = t * math.sqrt(example_part)
        return h, h
    n = seeds * examples
    p, deff = _expected_flips(d, delta, seeds, examples, example_part)
    b, c = n * (p + delta) / 2 / deff, n * (p - delta) / 2 / deff
    low, high = tango_interval(b, c, n / deff, critical=t)
    return delta - low, high - delta


def _expected_flips(d: Design, delta: float, seeds: int, examples: int, example_part: float) -> tuple[float, float]:
    """(the share of discordant pairs, the design effect) expected at that design; with no flip expected the design
    effect is S, as ``variance.Components.design_effect`` takes it (the examples alone are the evidence)."""
    p = max(d.discordance, abs(delta))
    if p == 0:
        return 0.0, float(seeds)
    return p, max(1.0, example_part * seeds * examples / max(p - delta * delta, 1e-12))


@dataclass(frozen=True)
class Plan:
    """The smallest design with ≥ POWER: test examples at the seeds that ran, or seeds at this test set; None when
    none within reach (MAX_EXAMPLES, MAX_SEEDS), with why."""

    question: str  # "equivalent" | "not worse"
    delta: float  # the true difference assumed
    assumed: str  # "observed" | "zero"
    examples: int | None
    seeds: int | None
    power_now: float  # at the design that ran
    seeds_now: int
    examples_now: int
    why_not_examples: str = ""
    why_not_seeds: str = ""

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def plan(d: Design, question: str, delta: float, assumed: str) -> Plan:
    """The plan for ``question`` if the truth is ``delta``."""
    c = d.components
    s, n = c.seeds, c.examples
    now = power(d, question, delta, s, n)
    examples = _smallest(lambda k: power(d, question, delta, s, k) >= POWER, 2, MAX_EXAMPLES)
    why_examples = "" if examples else _why_not(d, question, delta, s, "examples")
    seeds = _smallest(lambda k: power(d, question, delta, k, n) >= POWER, max(s, 2), MAX_SEEDS)
    why_seeds = "" if seeds else _why_not(d, question, delta, n, "seeds")
    return Plan(question, delta, assumed, examples, seeds, now, s, n, why_examples, why_seeds)


def _smallest(ok, low: int, high: int) -> int | None:
    """The smallest k in [low, high] with ok(k), power rising with k: doubling, then bisection."""
    k = low
    while not ok(k):
        if k >= high:
            return None
        k = min(2 * k, high)
    lo = max(low, k // 2)
    while lo < k:
        mid = (lo + k) // 2
        if ok(mid):
            k = mid
        else:
            lo = mid + 1
    return k


def _why_not(d: Design, question: str, delta: float, fixed: int, varied: str) -> str:
    if question == "equivalent" and abs(delta) >= d.margin:
        return "the difference assumed is itself on or past the margin"
    if varied == "examples" and d.components.seed > 0:
        return (f"the seeds' own variation (sd {math.sqrt(d.components.seed):.2g} per seed) does not shrink with "
                "test examples")
    if varied == "seeds" and d.discordance == 0:
        return "no prediction differed: seeds add no evidence, only test examples do"
    if varied == "seeds":
        return f"not within {MAX_SEEDS} seeds"
    return f"not within {MAX_EXAMPLES:,} test examples"


def plans(d: Design, questions: list[str], observed: float) -> list[Plan]:
    """Plans for each undecided ``question``, at the observed difference and at zero (once when they coincide)."""
    out = []
    for question in questions:
        out.append(plan(d, question, observed, "observed"))
        if observed != 0:
            out.append(plan(d, question, 0.0, "zero"))
    return out
