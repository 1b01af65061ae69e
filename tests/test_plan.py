"""Sample-size plans (issue 26): the power formula against simulated verdicts of the full procedure, the plans it
gives, and the -S lines that run them."""

import sys
from dataclasses import replace

import numpy as np
import pytest

from ampbench.report.context import HeldOut, RunContext
from ampbench.report.plans import examples_setting, plan_lines
from ampbench.verdict.decisions import not_worse, one_sided_level, verdict
from ampbench.verdict.plan import Design, plan, plans, power
from ampbench.verdict.stats import paired_accuracy
from ampbench.verdict.variance import Components
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from verdict_simulation import draw_accuracy  # noqa: E402

MARGIN = 0.005


def true_components(seeds: int, examples: int, discordance: float, seed_sd: float = 0.0) -> Components:
    """The expected mean squares of independent flips (variance ``discordance`` per pair) plus a seed effect."""
    w = discordance
    return Components(seeds, examples, w + examples * seed_sd**2, w, w, w / (seeds * examples))


def simulated(scenario: str, seeds: int, examples: int, p: float, question: str, reps: int = 400) -> float:
    """The share of simulated runs whose verdict (the pipeline's own: ``verdict.comparison.paired_statistics``) is the
    question's answer, at a true difference of 0."""
    rng, hits = np.random.default_rng(26), 0
    for _ in range(reps):
        arm, ref, _ = draw_accuracy(rng, scenario, seeds, examples, p, 0.0)
        s = paired_accuracy(arm, ref, one_sided_level(0.95))
        hits += (verdict(s, MARGIN, one_sided=True)[0] == "equivalent" if question == "equivalent"
                 else not_worse(s, MARGIN)[0] == "not worse")
    return hits / reps


@pytest.mark.parametrize(("scenario", "seeds", "examples", "p", "question"), [
    ("independent", 3, 10000, 0.05, "equivalent"),  # the target design: ~65%
    ("independent", 5, 449, 0.003, "equivalent"),  # the default run's shape
    ("independent", 5, 449, 0.0005, "equivalent"),  # a third of the runs see no flip: judged on 449 examples alone
    ("independent", 3, 2000, 0.01, "not worse"),
    ("seed effect", 5, 2000, 0.01, "equivalent"),
])
def test_the_power_formula_agrees_with_simulated_verdicts(scenario, seeds, examples, p, question):
    from verdict_simulation import seed_sd

    sd = seed_sd(p, examples, 0.0) if scenario == "seed effect" else 0.0
    design = Design(true_components(seeds, examples, p, sd), p, MARGIN, 0.95, True)
    predicted = power(design, question, 0.0, seeds, examples)
    assert predicted == pytest.approx(simulated(scenario, seeds, examples, p, question), abs=0.08)


def test_a_plan_is_the_smallest_design_with_80_percent_power_and_it_delivers_it():
    design = Design(true_components(3, 2000, 0.01), 0.01, MARGIN, 0.95, True)
    p = plan(design, "equivalent", 0.0, "zero")
    assert p.power_now < 0.8 and p.seeds is not None and p.examples is not None
    assert power(design, "equivalent", 0.0, 3, p.examples) >= 0.8 > power(design, "equivalent", 0.0, 3, p.examples - 1)
    assert power(design, "equivalent", 0.0, p.seeds, 2000) >= 0.8 > power(design, "equivalent", 0.0, p.seeds - 1, 2000)
    assert simulated("independent", p.seeds, 2000, 0.01, "equivalent") >= 0.74  # simulation is the judge
    assert simulated("independent", 3, p.examples, 0.01, "equivalent") >= 0.74


def test_what_no_design_can_reach_is_said_with_why():
    seedy = Design(true_components(3, 2000, 0.01, seed_sd=0.01), 0.01, MARGIN, 0.95, True)
    p = plan(seedy, "equivalent", 0.0, "zero")
    assert p.examples is None and "does not shrink with test examples" in p.why_not_examples
    past = plan(Design(true_components(3, 2000, 0.01), 0.01, MARGIN, 0.95, True), "equivalent", -0.006, "observed")
    assert p.seeds is not None and past.examples is None and past.seeds is None
    assert past.why_not_seeds == "the difference assumed is itself on or past the margin"
    assert [q.assumed for q in plans(Design(true_components(3, 2000, 0.01), 0.01, MARGIN, 0.95, True),
                                     ["not worse"], -0.001)] == ["observed", "zero"]


def test_with_no_prediction_differing_only_more_test_examples_are_planned():
    # 5 seeds × 449 images, every prediction the same: the one-sided bound is the images' rule of three (0.60 pp).
    identical = np.ones((5, 449), dtype=bool)
    s = paired_accuracy(identical, identical, one_sided_level(0.95))
    assert verdict(s, MARGIN, one_sided=True)[0] == "inconclusive"
    p = plan(Design(Components.from_dict(s.components), 0.0, MARGIN, 0.95, True), "equivalent", 0.0, "observed")
    assert p.examples == 541 and p.seeds is None
    context = replace(CONTEXT, seeds=[0, 1, 2, 3, 4])
    [line] = plan_lines("tf32", [p.to_dict()], context)
    assert line == ("tf32, *equivalent* with 80% power if the true difference is the observed +0.00 pp (power now 0%): "
                    "541 test examples at these 5 seeds: `.venv/bin/dvc exp run --temp -S prepare.test_fraction=0.31`"
                    "; or no number of seeds (no prediction differed: seeds add no evidence, only test examples do)")
    more = np.ones((5, 541), dtype=bool)
    assert verdict(paired_accuracy(more, more, one_sided_level(0.95)), MARGIN, one_sided=True)[0] == "equivalent"


CONTEXT = RunContext(prepare={"test_fraction": 0.25, "val_fraction": 0.1, "max_test": None},
                     test=HeldOut(449, "test_fraction", 449), seeds=[0, 1, 2])


def test_the_examples_line_is_the_setting_that_gives_that_many():
    assert examples_setting(700, 449, CONTEXT) == ("-S prepare.test_fraction=0.39", "")
    setting, why = examples_setting(1000, 449, CONTEXT)
    assert setting is None and "stays below 50%" in why
    setting, why = examples_setting(2000, 449, CONTEXT)
    assert setting is None and why == "the whole data set holds about 1,796"
    capped = replace(CONTEXT, prepare={**CONTEXT.prepare, "max_test": 200}, test=HeldOut(200, "test_fraction", 449))
    assert examples_setting(300, 200, capped) == ("-S prepare.max_test=300", "")
    assert examples_setting(600, 200, capped) == ("-S prepare.test_fraction=0.34 -S prepare.max_test=null", "")
    official = replace(CONTEXT, test=HeldOut(10000, "publisher", 10000))
    assert examples_setting(20000, 10000, official) == (None, "the data set's own test split has 10,000")
    assert examples_setting(500, 449, replace(CONTEXT, test=HeldOut())) == (None, "")  # prepared before it was recorded


def test_plan_lines_name_the_rerun():
    design = Design(true_components(3, 449, 0.01), 0.01, MARGIN, 0.95, True)
    [line] = plan_lines("bf16", [plan(design, "not worse", 0.0, "zero").to_dict()], CONTEXT)
    assert line.startswith("bf16, *not worse* with 80% power if the arms did not differ at all (power now ")
    assert "seeds at these 449 test examples: `.venv/bin/dvc exp run --temp -S 'train.seeds=[0,1,2," in line
