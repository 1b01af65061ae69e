"""The group-sequential design (verdict/sequential.py): the alpha-spending functions, the nominal levels they give
each look (against the published Lan–DeMets critical values and against an independent Monte Carlo of Brownian
paths), the design's checks, when an arm counts as decided, and the stop decision's reasons. Fast: no training,
no verdict statistics (tests/test_verdict_simulation.py runs the whole procedure on simulated data)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from ampbench.verdict.sequential import Design, Look, Looks, nominal_levels, outcome, spent


def _critical_values(spending: str, looks: int, alpha: float) -> list[float]:
    fractions = tuple(k / looks for k in range(1, looks + 1))
    cumulative = [spent(spending, alpha, t) for t in fractions]
    increments = tuple(b - a for a, b in zip([0.0] + cumulative[:-1], cumulative, strict=True))
    return [float(st.norm.isf(level)) for level in nominal_levels(fractions, increments)]


@pytest.mark.parametrize(("spending", "published"), [
    ("obrien_fleming", [4.877, 3.357, 2.680, 2.290, 2.031]),  # Lan & DeMets' O'Brien–Fleming-type spending
    ("pocock", [2.438, 2.427, 2.410, 2.397, 2.386]),  # and their Pocock-type: α·ln(1 + (e − 1)t)
])
def test_critical_values_of_five_equally_spaced_looks_are_the_published_ones(spending, published):
    """5 equally spaced looks at one-sided α = 0.025 (Jennison & Turnbull 2000, table 7.6; the gsDesign/ldbounds
    values)."""
    assert _critical_values(spending, 5, 0.025) == pytest.approx(published, abs=0.002)


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
@pytest.mark.parametrize("alpha", [0.025, 0.05])
def test_spending_functions_reach_alpha_at_the_end_and_grow_on_the_way(spending, alpha):
    assert spent(spending, alpha, 1.0) == pytest.approx(alpha, rel=1e-12)
    values = [spent(spending, alpha, k / 20) for k in range(1, 21)]
    assert all(b > a > 0 for a, b in zip(values[:-1], values[1:], strict=True))


def test_the_two_spending_functions_spread_alpha_differently():
    # O'Brien–Fleming spends next to nothing at a fifth of the information, 2 − 2Φ(z_0.9875 / √0.2) = 5.4e-7;
    # Pocock-type spends 0.025·ln(1 + (e − 1)/5) = 0.00738 there.
    assert spent("obrien_fleming", 0.025, 0.2) == pytest.approx(5.39e-7, rel=0.01)
    assert spent("pocock", 0.025, 0.2) == pytest.approx(0.025 * math.log(1 + (math.e - 1) / 5), rel=1e-12)
    assert spent("pocock", 0.025, 0.2) == pytest.approx(0.007385, abs=1e-6)
    with pytest.raises(ValueError, match="spending 'linear'"):
        spent("linear", 0.025, 0.5)


def test_a_single_look_is_the_fixed_level():
    assert nominal_levels((1.0,), (0.05,)) == pytest.approx((0.05,), rel=1e-12)
    with pytest.raises(ValueError, match="some error to spend"):
        nominal_levels((0.5, 1.0), (0.05, 0.0))


def _first_crossings(fractions: list[float], levels: list[float], paths: int = 200_000,
                     seed: int = 20261204) -> np.ndarray:
    """Monte Carlo, independent of the grid integration: the share of Brownian paths whose standardised value
    Z_k = W(t_k)/√t_k first exceeds Φ⁻¹(1 − level_k) at look k (one entry per look)."""
    rng = np.random.default_rng(seed)
    t = np.asarray(fractions)
    steps = rng.standard_normal((paths, t.size)) * np.sqrt(np.diff(t, prepend=0.0))
    z = np.cumsum(steps, axis=1) / np.sqrt(t)
    crossed = z > st.norm.isf(np.asarray(levels))
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    return np.array([(first == k).mean() for k in range(t.size)])


@pytest.mark.parametrize(("which", "alpha"), [("decide", 0.05), ("report", 0.025)])
def test_the_looks_levels_spend_exactly_alpha_on_brownian_paths(which, alpha):
    """Design(3, 8, 'pocock'): looks at 3..8 seeds, t = 3/8..1. The decision bounds (one-sided 5% in all) and the
    reported interval's ends (2.5% a side) are crossed, under the margin, with the chance each look was given:
    200,000 paths, a standard error of 0.0005 on the total."""
    design = Design(3, 8, "pocock")
    looks = design.looks()
    fractions = [lk.seeds / 8 for lk in looks]
    confidence = [lk.decide_confidence if which == "decide" else lk.report_confidence for lk in looks]
    levels = [(1 - c) / 2 for c in confidence]
    first = _first_crossings(fractions, levels)
    assert first.sum() == pytest.approx(alpha, abs=0.004)
    cumulative = [spent("pocock", alpha, t) for t in fractions]
    planned = np.diff(cumulative, prepend=0.0)
    assert first == pytest.approx(planned, abs=0.0015)
    # the fixed design's level at every look would cross far more often: what the spending is for
    assert _first_crossings(fractions, [alpha] * len(fractions), paths=50_000).sum() > 2 * alpha


def _t_interval_alone(design: Design, levels: list[float], paths: int = 200_000, seed: int = 7) -> tuple[float, float]:
    """The Student-t interval over seeds alone, looked at after every seed of ``design`` with one-sided ``levels``,
    on normal per-seed differences whose mean lies on the margin (−1, accuracy's side; sd 0.25, so the far end of
    the equivalence test is inside): (false *not worse*, false *equivalent*), each at the look that decided it
    (not worse: the lower bound clears −1, worse: the upper one is below it; with ``until equivalent`` the
    equivalence verdict must be decided too), or at the last look. Paths independent of the levels' own."""
    rng = np.random.default_rng(seed)
    d = rng.normal(-1.0, 0.25, size=(paths, design.max_seeds))
    open_ = np.ones(paths, dtype=bool)
    false_nw = np.zeros(paths, dtype=bool)
    false_eq = np.zeros(paths, dtype=bool)
    for lk, level in zip(design.looks(), levels, strict=True):
        x = d[:, :lk.seeds]
        half = st.t.isf(level, lk.seeds - 1) * x.std(axis=1, ddof=1) / math.sqrt(lk.seeds)
        lo, hi = x.mean(axis=1) - half, x.mean(axis=1) + half
        nw, worse = lo >= -1, hi < -1
        eq = nw & (hi <= 1)
        decided = (nw | worse) & ((eq | worse | (lo > 1)) if design.until == "equivalent" else True)
        stop = open_ & (decided | (lk.seeds == design.max_seeds))
        false_nw |= stop & nw
        false_eq |= stop & eq
        open_ &= ~stop
    return float(false_nw.mean()), float(false_eq.mean())


T_DESIGNS = [Design(3, 6, "pocock"), Design(3, 8, "pocock"), Design(3, 10, "obrien_fleming"), Design(2, 6, "pocock"),
             Design(3, 8, "pocock", until="equivalent")]


@pytest.mark.parametrize("design", T_DESIGNS, ids=lambda d: f"{d.min_seeds}-{d.max_seeds}-{d.spending}-{d.until}")
def test_the_seeds_levels_make_the_t_interval_exact_and_the_normal_ones_do_not(design):
    """Where the seeds carry the variance, the verdict is the t interval's: at the looks' seeds levels its false
    *not worse* and *equivalent* on the margin are 5% within simulation error (200,000 paths: sd 0.05 points, and
    the levels' own 400,000: 0.03), whatever the seeds' sd; at the normal levels (those of the examples' interval)
    they are 5.4–5.9%. (The seeds' sd cancels in t: any other gives the same verdicts on the same draws.)"""
    looks = design.looks()
    seeds_levels = [(1 - lk.seed_decide_confidence) / 2 for lk in looks]
    false_nw, false_eq = _t_interval_alone(design, seeds_levels)
    assert false_nw == pytest.approx(0.05, abs=0.0025)
    assert false_eq == pytest.approx(0.05, abs=0.0025)
    normal_nw, _ = _t_interval_alone(design, [(1 - lk.decide_confidence) / 2 for lk in looks])
    assert normal_nw > 0.05 + 0.0025, normal_nw
    # the first look is alone: Student's t quantile itself, where the two levels agree; later looks are stricter
    assert seeds_levels[0] == pytest.approx((1 - looks[0].decide_confidence) / 2, rel=1e-9)
    assert all(s < (1 - lk.decide_confidence) / 2 for s, lk in zip(seeds_levels[1:], looks[1:], strict=True))


def test_a_look_says_the_levels_of_both_intervals_in_details_and_tags():
    """What `ampbench decide` shows: details.json's ``sequential.levels`` (every look, both intervals) and the
    parent run's tags (this look's one-sided levels), the same numbers the verdicts used."""
    design = Design(3, 8, "pocock")
    looks = Looks(design, outcome(design, 5, {"bf16": None}))
    row = looks.to_dict()["levels"][2]
    lk = design.look(5)
    assert row["seeds"] == 5 and row["one_sided_level"] == pytest.approx((1 - lk.decide_confidence) / 2)
    assert row["seeds_one_sided_level"] == pytest.approx((1 - lk.seed_decide_confidence) / 2)
    assert row["seeds_one_sided_level"] < row["one_sided_level"]
    tags = looks.tags()
    assert float(tags["sequential.level_examples"]) == pytest.approx(row["one_sided_level"], abs=1e-6)
    assert float(tags["sequential.level_seeds"]) == pytest.approx(row["seeds_one_sided_level"], abs=1e-6)
    report, decide = lk.levels()  # what evaluate hands the task: each interval's level in one value
    assert float(decide) == lk.decide_confidence and decide.seeds == lk.seed_decide_confidence
    assert float(report) == lk.report_confidence and report.seeds == lk.seed_report_confidence


@pytest.mark.parametrize("design", [Design(3, 6, "pocock"), Design(3, 8, "pocock"), Design(3, 10, "obrien_fleming"),
                                    Design(2, 5, "obrien_fleming"), Design(4, 4, "pocock")])
def test_every_look_is_stricter_than_the_fixed_design(design):
    looks = design.looks()
    assert [lk.seeds for lk in looks] == list(range(design.min_seeds, design.max_seeds + 1))
    assert [lk.index for lk in looks] == list(range(1, len(looks) + 1))
    for lk in looks:
        # fixed: decisions on one-sided 95% bounds (the 90% interval's ends), the reported interval 95%
        if len(looks) == 1:  # one look spends everything there: the fixed design itself
            assert lk.decide_confidence == pytest.approx(0.90, abs=1e-9)
            assert lk.report_confidence == pytest.approx(0.95, abs=1e-9)
        else:
            assert 0.90 < lk.decide_confidence < 1 and 0.95 < lk.report_confidence < 1, lk
            assert lk.report_confidence > lk.decide_confidence
    assert design.look(design.max_seeds) == looks[-1]


def test_the_levels_of_one_design():
    """Design(3, 6, 'pocock') spends α·ln(1 + (e − 1)/2) = 3.10% one-sided at its first look (nothing was spent
    before it); its later looks are each near 2%."""
    one_sided = [(1 - lk.decide_confidence) / 2 for lk in Design(3, 6, "pocock").looks()]
    assert one_sided[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2), rel=1e-6)
    assert one_sided == pytest.approx([0.03101, 0.02022, 0.01943, 0.01953], abs=2e-5)
    # O'Brien–Fleming keeps its first looks very strict and its last near the fixed 5%
    of = [(1 - lk.decide_confidence) / 2 for lk in Design(3, 10, "obrien_fleming").looks()]
    assert of[0] < 0.001 and of == sorted(of) and 0.03 < of[-1] < 0.05


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_seeds": 1, "max_seeds": 5}, "need 2 ≤ min_seeds ≤ max_seeds, got 1 and 5"),
    ({"min_seeds": 6, "max_seeds": 5}, "need 2 ≤ min_seeds ≤ max_seeds, got 6 and 5"),
    ({"min_seeds": 3, "max_seeds": 5, "spending": "linear"}, "spending one of"),
    ({"min_seeds": 3, "max_seeds": 5, "until": "better"}, "until one of"),
])
def test_a_design_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Design(**kwargs)


def test_a_seed_count_outside_the_looks_is_no_look():
    design = Design(3, 6, "pocock")
    assert design.look(4).index == 2 and design.look(4).seeds == 4
    for seeds in (2, 7):
        with pytest.raises(ValueError, match=f"{seeds} seeds is not a look of a design from 3 to 6"):
            design.look(seeds)


def test_decided_needs_not_worse_alone_or_equivalence_too():
    nw, eq = Design(3, 8, "pocock"), Design(3, 8, "pocock", until="equivalent")
    assert nw.decided("not worse", "inconclusive") and nw.decided("worse", "worse")
    assert not nw.decided("inconclusive", "equivalent")
    assert not eq.decided("not worse", "inconclusive")
    assert eq.decided("not worse", "equivalent") and eq.decided("not worse", "better")
    assert eq.decided("worse", "worse") and not eq.decided("inconclusive", "inconclusive")


def _levels(design: Design, seeds: int) -> tuple[float, float, float, float]:
    lk = design.looks()[seeds - design.min_seeds]
    return lk.decide_confidence, lk.report_confidence, lk.seed_decide_confidence, lk.seed_report_confidence


def test_outcome_stops_when_every_arm_decided():
    design = Design(3, 6, "pocock")
    o = outcome(design, 4, {"fp16": 3, "bf16": 4})
    assert o.stopped and o.look == Look(2, 4, *_levels(design, 4)) and o.planned == 4
    assert o.reason.startswith("look 2 of 4 (4 seeds): every arm decided")
    assert "stopped 2 seeds before the maximum" in o.reason and "had decided" not in o.reason
    # every arm had decided at an earlier look: the later seeds are not in its verdicts
    late = outcome(design, 5, {"fp16": 3, "bf16": 3})
    assert late.stopped and "every arm had decided at 3 seeds" in late.reason
    assert "stopped 3 seeds before the maximum" in late.reason
    # deciding at the last look is no early stop
    last = outcome(design, 6, {"fp16": 6})
    assert last.stopped and "every arm decided" in last.reason and "before the maximum" not in last.reason


def test_outcome_stops_at_the_maximum_and_names_the_undecided_arms():
    o = outcome(Design(3, 6, "pocock"), 6, {"tf32": None, "fp16": 4, "bf16": None})
    assert o.stopped and o.look.index == 4
    assert o.reason.startswith("look 4 of 4 (6 seeds): the maximum of 6 seeds reached")
    assert o.reason.endswith("undecided: bf16, tf32")  # sorted; the decided fp16 is not named
    d = o.to_dict(Design(3, 6, "pocock"))
    assert d["stopped"] is True and d["seeds"] == 6 and d["looks"] == 4
    assert [lv["seeds"] for lv in d["levels"]] == [3, 4, 5, 6]
    assert d["levels"][0]["one_sided_level"] == pytest.approx(0.03101, abs=2e-5)


def test_outcome_continues_while_an_arm_is_undecided():
    o = outcome(Design(3, 6, "pocock"), 4, {"fp16": 3, "bf16": None})
    assert not o.stopped and o.decided_at == {"fp16": 3, "bf16": None}
    assert o.reason.startswith("look 2 of 4 (4 seeds): undecided: bf16;")
    assert "5 of" in o.reason and "6" in o.reason.split("5 of", 1)[1]  # the next look's seed, of the maximum
    assert "fp16" not in o.reason


def test_nothing_to_decide_stops_and_says_so():
    o = outcome(Design(3, 6), 3, {})
    assert o.stopped and o.reason == "look 1 of 4 (3 seeds): no arm besides the baseline to decide"
    with pytest.raises(ValueError, match="confidence"):
        Design(3, 6, confidence=1.0)


def test_an_undecided_arm_at_a_look_that_goes_on_is_pointed_to_the_next_look():
    from ampbench.report.advice import Recommendation, what_would_decide
    from ampbench.report.context import RunContext
    from ampbench.verdict.sequential import Looks

    design = Design(3, 6)
    going_on = RunContext(looks=Looks(design, outcome(design, 4, {"bf16": None, "fp16": 3})))
    rec = Recommendation(best=None, verdict="", reasons={}, more="", notes="", code="")
    cell = what_would_decide("bf16", {"decided_at_seeds": None, "plans": [{"kind": "seeds"}]}, rec, going_on)
    assert cell == "undecided at 4 seeds; the next look adds one (5 of at most 6): `ampbench decide` goes on"
    assert "next look" not in what_would_decide("fp16", {"decided_at_seeds": 3}, rec, going_on)
    stopped = RunContext(looks=Looks(design, outcome(design, 6, {"bf16": None})))
    assert "next look" not in what_would_decide("bf16", {"decided_at_seeds": None}, rec, stopped)
