"""The search for the modules to keep in float32 (issue 52, ``verdict/search.py``) on judges whose truth is known:
one culprit, two modules needed together, a set that stops passing when more is kept (no monotonicity assumed), no
set that helps, a budget that runs out, a confirmation that fails; and a simulation of the whole procedure's false
*not worse* rate against the verdict's alpha, beside the rate of reporting the search's own verdicts."""

from __future__ import annotations

import random

import pytest

from ampbench.verdict.decisions import not_worse, one_sided_level
from ampbench.verdict.search import NOT_WORSE, Trial, default_budget, judged_in_looks, search, trial_design
from ampbench.verdict.stats import paired_ci

RANKING = [f"m{i}" for i in range(16)]  # most promising first
SEEDS, FRESH = (0, 1, 2), (3, 4, 5)


def scripted(passes):
    """A judge that passes exactly the sets ``passes(set)`` says, and records what it was asked."""
    asked = []

    def judge(modules, seeds):
        asked.append((modules, seeds))
        return Trial(modules, seeds, NOT_WORSE if passes(set(modules)) else "worse", -0.01, 0.01)
    return judge, asked


def test_one_culprit_is_found_alone_minimal_and_confirmed_on_fresh_seeds():
    judge, asked = scripted(lambda s: "m2" in s)
    answer = search(RANKING, judge, SEEDS, FRESH, default_budget(len(RANKING), 3, 3))
    assert answer.modules == ("m2",) and answer.minimal and answer.confirmed
    assert answer.stopped.startswith("minimal")
    # Growth 1, 2, 4; bisection 3; elimination of m3 and m1, then m0; then the confirmation, alone on FRESH.
    assert [len(m) for m, _ in asked[:4]] == [1, 2, 4, 3]
    assert asked[-1] == (("m2",), FRESH) and all(seeds == SEEDS for _, seeds in asked[:-1])
    assert answer.spent == 3 * len(asked) and answer.spent <= default_budget(len(RANKING), 3, 3)


def test_two_modules_needed_together_are_both_kept():
    judge, _ = scripted(lambda s: {"m1", "m4"} <= s)
    answer = search(RANKING, judge, SEEDS, FRESH, default_budget(len(RANKING), 3, 3))
    assert answer.modules == ("m1", "m4") and answer.minimal and answer.confirmed


def test_more_float32_is_not_assumed_better():
    """m3 is needed and m6 must stay in the arm's precision: the prefix of 8 fails after the prefix of 4 passed."""
    judge, _ = scripted(lambda s: "m3" in s and "m6" not in s)
    answer = search(RANKING, judge, SEEDS, FRESH, default_budget(len(RANKING), 3, 3))
    assert answer.modules == ("m3",) and answer.minimal and answer.confirmed


def test_no_set_helps_says_so_with_the_best_trial_and_no_confirmation():
    lows = {1: -0.09, 2: -0.05, 4: -0.02, 8: -0.03, 16: -0.04}  # keeping 4 came closest

    def judge(modules, seeds):
        return Trial(modules, seeds, "inconclusive", lows[len(modules)], 0.0)
    answer = search(RANKING, judge, SEEDS, FRESH, 100)
    assert answer.modules is None and answer.confirmation is None and not answer.confirmed
    assert answer.stopped == "no set helps: with all 16 candidate modules kept in float32 the arm is still inconclusive"
    assert answer.best.modules == tuple(RANKING[:4]) and len(answer.trials) == 5


def test_a_budget_that_runs_out_says_what_was_learnt():
    judge, _ = scripted(lambda s: "m9" in s)
    answer = search(RANKING, judge, SEEDS, FRESH, 3 * 3 + 3)  # three trials and the confirmation
    assert answer.modules is None and answer.stopped == ("the budget ran out while growing the set: the first 4 "
                                                         "ranked module(s) kept in float32 were not enough")
    assert [len(t.modules) for t in answer.trials] == [1, 2, 4] and answer.spent == 9
    judge, _ = scripted(lambda s: "m5" in s)
    answer = search(RANKING, judge, SEEDS, FRESH, 6 * 3 + 3)  # prefixes 1, 2, 4, 8, then bisection 6, 5
    assert answer.modules == tuple(RANKING[:6]) and not answer.minimal and answer.confirmed
    assert "budget ran out" in answer.stopped


def test_the_reported_verdict_is_the_confirmations():
    def judge(modules, seeds):  # passes on the search's seeds only: luck the fresh seeds do not repeat
        return Trial(modules, seeds, NOT_WORSE if seeds == SEEDS else "inconclusive")
    answer = search(RANKING, judge, SEEDS, FRESH, 100)
    assert answer.modules == ("m0",) and not answer.confirmed and answer.confirmation.verdict == "inconclusive"


@pytest.mark.parametrize("seeds, fresh, budget, match", [
    ((0, 1), (1, 2), 10, "disjoint"), ((0, 1), (), 10, "must be given"), ((0, 1), (2, 3), 3, "pays for no trial")])
def test_what_no_search_can_run_on_is_refused(seeds, fresh, budget, match):
    with pytest.raises(ValueError, match=match):
        search(RANKING, scripted(lambda s: True)[0], seeds, fresh, budget)


def test_the_procedures_false_not_worse_rate_stays_at_alpha():
    """Every set is exactly as bad as the margin allows not (the null hypothesis at its boundary, where a test's
    false rate is largest): per-seed differences drawn around −margin, judged by the pipeline's own not-worse
    verdict on the Student-t bound over seeds. Reporting the search's own verdict would call a set *not worse* far
    more often than alpha (it tries several); the confirmed verdict does so at most at alpha."""
    rng, margin, alpha, runs = random.Random(0), 0.01, 0.05, 3000

    def judge(modules, seeds):
        s = paired_ci([rng.gauss(-margin, 0.01) for _ in seeds], one_sided_level(1 - alpha))
        return Trial(modules, seeds, not_worse(s, margin)[0], s.ci_low, s.ci_high)
    searched = confirmed = 0
    for _ in range(runs):
        answer = search(RANKING, judge, SEEDS, FRESH, default_budget(len(RANKING), 3, 3))
        searched += answer.modules is not None
        confirmed += answer.confirmed
    def at_most_alpha(rate: float, n: int) -> bool:  # within three Monte Carlo standard errors
        return rate <= alpha + 3 * (alpha * (1 - alpha) / n) ** 0.5

    assert searched / runs > 3 * alpha, searched / runs  # the search's own verdicts: the inflation
    assert at_most_alpha(confirmed / runs, runs), confirmed / runs  # the procedure's false rate
    # and among the searches that reported a set: its confirmed verdict is still a test at alpha
    assert at_most_alpha(confirmed / searched, searched), confirmed / searched


def test_a_clear_trial_stops_at_its_first_look_and_the_budget_pays_for_the_seeds_used():
    """Looks after every seed from the third of five (``ampbench decide``'s design): a clear failure and a clear pass
    decide at three seeds, a close one goes on to all five; the budget is charged for the seeds each trial used."""
    design = trial_design(5, 3, "pocock", 0.95)
    assert [look.seeds for look in design.looks()] == [3, 4, 5]
    assert trial_design(2, 3, "pocock", 0.95) is None and trial_design(3, 3, "pocock", 0.95) is None

    def judge(modules, seeds):
        def at(now, look):
            close = modules == ("m0", "m1") and len(now) < 5  # undecided until the last look
            verdict = "inconclusive" if close else NOT_WORSE if "m1" in modules else "worse"
            return Trial(modules, now, verdict)
        return judged_in_looks(seeds, design, at)
    seeds, fresh = tuple(range(5)), tuple(range(5, 10))
    answer = search(RANKING, judge, seeds, fresh, 100)
    used = [(t.modules, len(t.seeds)) for t in answer.trials]
    assert used == [(("m0",), 3), (("m0", "m1"), 5), (("m1",), 3), (("m1",), 3)], used  # the last: the confirmation
    assert answer.spent == 14 and answer.confirmed and answer.modules == ("m1",)


def test_with_looks_the_procedures_false_not_worse_rate_stays_at_alpha():
    """The simulation above with every trial and the confirmation looking after each seed from the third of five,
    each look at its level of the design's t bound over seeds: stopping at the first look that passes does not
    raise the confirmed verdict's false rate above alpha."""
    rng, margin, alpha, runs = random.Random(1), 0.01, 0.05, 2000
    design = trial_design(5, 3, "pocock", 1 - alpha)

    def judge(modules, seeds):
        draws = [rng.gauss(-margin, 0.01) for _ in seeds]

        def at(now, look):
            s = paired_ci(draws[:len(now)], look.seed_decide_confidence)
            return Trial(modules, now, not_worse(s, margin)[0], s.ci_low, s.ci_high)
        return judged_in_looks(seeds, design, at)
    answers = [search(RANKING, judge, tuple(range(5)), tuple(range(5, 10)), default_budget(len(RANKING), 5, 5))
               for _ in range(runs)]
    confirmed, searched = sum(a.confirmed for a in answers), sum(a.modules is not None for a in answers)
    assert searched / runs > 3 * alpha, searched / runs  # the search's own verdicts still inflate

    def at_most_alpha(rate: float, n: int) -> bool:  # within three Monte Carlo standard errors
        return rate <= alpha + 3 * (alpha * (1 - alpha) / n) ** 0.5

    assert at_most_alpha(confirmed / runs, runs), confirmed / runs
    assert at_most_alpha(confirmed / searched, searched), confirmed / searched


def test_the_report_shows_this_runs_searches_in_full_and_points_at_the_others():
    from ampbench.report.fix import report_section

    def rec(arm, goal, identity, modules=("coords",), confirmed=True):
        return {"arm": arm, "goal": goal, "identity": identity, "opening": f"{arm}: worse against fp32",
                "ranking": ["| coords | Coordinates |"], "tried": ['trial 1: ["coords"] kept in float32: not worse'],
                "said": ["Adopt it:"], "modules": list(modules), "confirmed": confirmed, "record": f"{arm}.md"}

    assert report_section([], "run", []) == []
    lines = report_section([rec("bf16", NOT_WORSE, "run"), rec("fp16", "equivalent", "other")], "run", [])
    text = "\n".join(lines)
    assert lines[:4] == ["", "## Which part needs float32", "", "### `ampbench fix bf16`"], lines
    for part in ("#### Ranked\n\n| coords | Coordinates |", '#### Tried\n\n- trial 1: ["coords"]',
                 "#### Why it stopped, and the answer\n\nAdopt it:",
                 "The search's record: [fix/bf16.md](fix/bf16.md)."):
        assert part in text, (part, text)
    assert lines[-1] == ("`ampbench fix fp16 --until equivalent` ([fix/fp16.md](fix/fp16.md)) searched another run: "
                         "its data, code or train params differ from this run's. Run it again on this one."), lines
    adopted = report_section([rec("bf16", NOT_WORSE, "run")], "run", ["coords"])
    assert adopted[3].startswith('This run keeps ["coords"] in float32: the set it found and confirmed not worse '
                                 "than fp32 on this run without train.fp32_modules (`ampbench fix bf16`"), adopted
    unconfirmed = report_section([rec("bf16", NOT_WORSE, "run", confirmed=False)], "run", ["coords"])
    assert 'keeps ["coords"] in float32: the set it ended with, not confirmed on fresh seeds' in unconfirmed[3]
    other = report_section([rec("bf16", NOT_WORSE, "run", modules=("head",))], "run", ["coords"])
    assert 'keeps ["coords"] in float32: not the set it ended with' in other[3], other
