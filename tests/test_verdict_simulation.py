"""The verdict statistics by simulation (issue 26), a few cells of scripts/verdict_simulation.py's table: the 95%
interval covers the true difference, the one-sided bound keeps false *equivalent* / *not worse* verdicts on the
margin at ≤ 5%, under each pattern of how flips arise, and the power the docs' table reports; and the same of the
sequential procedure (issue 39, ``verdict/sequential.py``): its errors on the margin, the coverage of the interval it
reports, its power against the fixed 5-seed design and the seeds it saves. 300 replicates a cell: a coverage of 95%
shows as 92.5–97.5% about 19 times in 20, so the bounds below leave room for that."""

import sys

import numpy as np
import pytest
from scipy import stats as st

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from verdict_frontier import least_mean_seeds, play  # noqa: E402
from verdict_simulation import MARGIN_ACCURACY, MARGIN_LOSS, cell, sequential_cell  # noqa: E402

from ampbench.verdict.sequential import Design  # noqa: E402


@pytest.mark.parametrize(("scenario", "seeds", "examples", "discordance"), [
    ("independent", 3, 2000, 0.01), ("same examples", 3, 2000, 0.01), ("seed effect", 3, 2000, 0.01),
    ("seed effect", 5, 270, 0.05), ("independent", 1, 270, 0.002), ("seed effect", 1, 2000, 0.05),
])
def test_accuracy_intervals_cover_and_false_verdicts_stay_rare(scenario, seeds, examples, discordance):
    at_zero = cell("accuracy", scenario, seeds, examples, discordance, 0.0, reps=300)
    assert at_zero["coverage"] >= 0.92 and at_zero["bound_coverage"] >= 0.92, at_zero
    if discordance > MARGIN_ACCURACY:  # a difference on the margin needs that many discordant pairs
        on_margin = cell("accuracy", scenario, seeds, examples, discordance, -MARGIN_ACCURACY, reps=300)
        assert on_margin["coverage"] >= 0.92, on_margin
        if seeds == 1 and scenario == "seed effect":  # one seed's difference is not the arms': its verdicts say so
            assert on_margin["not_worse"] > 0.1, on_margin
        else:
            assert on_margin["equivalent"] <= 0.075 and on_margin["not_worse"] <= 0.075, on_margin


def test_no_flip_in_any_seed_is_the_evidence_of_the_examples_alone():
    # The same 0.75% of 270 examples against the arm (0.25% for it) in every seed: a run with no flip at all (7% of
    # them) counted S × 270 agreeing pairs as independent and missed the truth (coverage 92%, equivalent 6–7%).
    on_margin = cell("accuracy", "same examples", 3, 270, 0.01, -MARGIN_ACCURACY, reps=300)
    assert on_margin["coverage"] >= 0.95 and on_margin["equivalent"] <= 0.02, on_margin


@pytest.mark.parametrize("scenario", ["independent", "same examples", "seed effect"])
def test_loss_intervals_cover_and_false_verdicts_stay_rare(scenario):
    at_zero = cell("loss", scenario, 3, 2000, None, 0.0, reps=300)
    on_margin = cell("loss", scenario, 3, 2000, None, MARGIN_LOSS, reps=300)
    assert at_zero["coverage"] >= 0.92 and on_margin["coverage"] >= 0.92, (at_zero, on_margin)
    assert on_margin["equivalent"] <= 0.075 and on_margin["not_worse"] <= 0.075, on_margin


def test_the_power_to_call_agreeing_arms_equivalent():
    """The issue's target design, 3 seeds × 10,000 examples at 5% discordance: about 65% (no interval that stays
    valid whatever the seeds' own effect reaches more than 77.5% there: docs/verdict-simulation.md); 5 seeds:
    above 95%."""
    three = cell("accuracy", "independent", 3, 10000, 0.05, 0.0, reps=300)
    five = cell("accuracy", "independent", 5, 10000, 0.05, 0.0, reps=300)
    assert 0.55 <= three["equivalent"] <= 0.75 and five["equivalent"] >= 0.95, (three, five)


@pytest.mark.parametrize(("kind", "scenario", "design", "reps"), [
    ("accuracy", "independent", Design(3, 6, "pocock"), 300),
    ("accuracy", "same examples", Design(3, 6, "pocock"), 300),
    ("accuracy", "seed effect", Design(3, 8, "pocock"), 300),
    # The docs' highest (5.7% in 1,000 replicates; 5.3% in 8,000): a little above 5%, as the fixed design is where
    # the seeds carry the variance, so 300 replicates would put 7.5% only two standard errors away.
    ("loss", "seed effect", Design(3, 10, "obrien_fleming"), 1000),
    ("loss", "independent", Design(3, 8, "pocock", until="equivalent"), 300),
])
def test_the_sequential_procedure_keeps_false_verdicts_on_the_margin_rare(kind, scenario, design, reps):
    """Looking after every seed and stopping at the first decision, at the spending function's levels: a difference
    on the margin is called *not worse* or *equivalent* at most 5% of the time (≤ 7.5% in 300 replicates), the
    interval reported at the stopping look covers it, and such runs mostly go on to the maximum of seeds."""
    margin = -MARGIN_ACCURACY if kind == "accuracy" else MARGIN_LOSS
    r = sequential_cell(kind, scenario, design, 2000, 0.01 if kind == "accuracy" else None, margin, reps=reps)
    assert r["not_worse"] <= 0.075 and r["equivalent"] <= 0.075, r
    assert r["coverage"] >= 0.92, r
    assert r["mean_seeds"] >= design.max_seeds - 1, r


def test_the_sequential_procedure_saves_seeds_at_no_loss_of_power_when_the_arms_agree():
    """Issue 39's cell, 10,000 examples at 5% discordance and Δ = 0: Design(3, 6, 'pocock') calls *not worse* as
    often as the fixed 5 seeds (99% both; 0.03 is about three standard errors of the difference at 300 replicates)
    on about 3.6 seeds, most runs stopping at the first look; waiting for *equivalent* too (3 to 8 seeds) calls it
    as often as the fixed design does, on about 4.2."""
    fixed = cell("accuracy", "independent", 5, 10000, 0.05, 0.0, reps=300)
    short = sequential_cell("accuracy", "independent", Design(3, 6, "pocock"), 10000, 0.05, 0.0, reps=300)
    assert short["not_worse"] >= fixed["not_worse"] - 0.03, (short, fixed)
    assert 3 < short["mean_seeds"] < 4, short  # the fixed design's 5, less a fifth at least
    assert 0.5 <= short["stopped_at"][3] <= 0.75, short
    assert short["coverage"] >= 0.95, short
    both = sequential_cell("accuracy", "independent", Design(3, 8, "pocock", until="equivalent"), 10000, 0.05, 0.0,
                           reps=300)
    assert both["equivalent"] >= fixed["equivalent"] - 0.03 and both["not_worse"] >= fixed["not_worse"] - 0.03, (
        both, fixed)
    assert both["mean_seeds"] < 4.6, both


def test_the_least_mean_seeds_bound_is_attained_by_its_rule_and_beaten_by_no_valid_design():
    """scripts/verdict_frontier.py's bound behind "no valid design reaches 60%" (a coarse grid, 2 to 6 seeds): the
    rule at the dual's optimum (deterministic where the exact optimum mixes two choices, so within 0.03 seeds of
    it) trains, simulated, the seeds the bound says, calls *not worse* at Δ = 0 as often as
    asked and on the margin at most 5% at each seed effect it was held to (0.6% is about three standard errors at
    20,000 runs); and a design valid by construction (the t test over seeds at 1% at every look, exact whatever the
    seed effect, Bonferroni over 5 looks) trains more than the bound at its own power."""
    m1, effects = 3.87 / np.sqrt(3), np.array([0, 0.3, 1, 3, 5, 10, 100.0])
    bound, seen, rule = least_mean_seeds(m1, 2, max_seeds=6, power=0.95, rs=effects, step=0.1, nodes=30)
    assert 2.5 < bound < 6 and seen[-1] == pytest.approx(bound, abs=0.03), (bound, seen)
    seeds, called = play(rule, 0.0, 0.0, reps=20_000)
    assert seeds == pytest.approx(bound, abs=0.05) and called >= 0.94, (seeds, called)
    for r in effects:
        assert play(rule, -m1, r, reps=20_000)[1] <= 0.056, r
    rng = np.random.default_rng(11)
    d = rng.standard_normal((20_000, 6))
    stop = np.full(len(d), 6)
    called_t = np.zeros(len(d), bool)
    for k in range(6, 1, -1):  # the first look that calls it wins: walk back from the last
        x = d[:, :k]
        t = (x.mean(axis=1) + m1) / (x.std(axis=1, ddof=1) / np.sqrt(k))
        calls = t > st.t.isf(0.01, k - 1)
        stop, called_t = np.where(calls, k, stop), called_t | calls
    power = float(called_t.mean())
    assert power > 0.5, power
    floor, _, _ = least_mean_seeds(m1, 2, max_seeds=6, power=power - 0.01, rs=effects, step=0.1, nodes=30)
    assert stop.mean() >= floor, (stop.mean(), floor, power)
