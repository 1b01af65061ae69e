"""What would decide a verdict that did not: the sample-size plans (``verdict/plan.py``) as lines a user reruns —
the test examples or seeds that give 80% power, each with the ``dvc exp run -S`` settings that give them — and
the short form the report's first table shows.
"""

from __future__ import annotations

import math
from typing import Any

from ampbench.report.context import RunContext


def more_seeds(seeds: list[int]) -> list[int]:
    """Twice as many seeds as ran (at least 3), keeping those that ran: the t quantile and the standard error of
    the per-seed mean both shrink."""
    out, k = list(seeds), 0
    while len(out) < max(2 * len(seeds), 3):
        if k not in out:
            out.append(k)
        k += 1
    return out


def seeds_line(count: int, ran: list[int]) -> str:
    """The rerun with ``count`` seeds, keeping those that ran."""
    seeds, k = list(ran), 0
    while len(seeds) < count:
        if k not in seeds:
            seeds.append(k)
        k += 1
    return f".venv/bin/dvc exp run --temp -S 'train.seeds=[{','.join(map(str, seeds))}]'"


def examples_setting(needed: int, now: int, context: RunContext) -> tuple[str | None, str]:
    """The ``-S`` settings that give ``needed`` test examples (sequences, for a language model) where the
    evaluation had ``now``: a lifted prepare.max_test or a larger prepare.test_fraction; (None, why) when the data
    set cannot give that many, or ("", "") when it is not known how its test split was made."""
    prep, test = context.prepare, context.test
    size, available, source = test.size, test.available, test.source
    if not (size and available and source and now):
        return None, ""
    uncapped = now * available / size  # what the test split holds without prepare.max_test's cut
    if needed <= uncapped:
        return f"-S prepare.max_test={math.ceil(needed * size / now)}", ""
    if source == "publisher":
        return None, f"the data set's own test split has {int(uncapped):,}"
    fraction = math.ceil(100 * prep["test_fraction"] * needed / uncapped) / 100
    if fraction >= 1 - prep["val_fraction"]:
        return None, f"the whole data set holds about {round(uncapped / prep['test_fraction']):,}"
    if fraction >= 0.5:  # prepare.test_fraction's bound: at least half the data stays for training and validation
        return None, f"that is {fraction:.0%} of the data set, and prepare.test_fraction stays below 50%"
    if fraction + prep["val_fraction"] > 0.8:
        return None, f"{needed:,} would leave less than a fifth of the data set to train on"
    capped = prep.get("max_test") is not None and available > size
    return f"-S prepare.test_fraction={fraction:g}" + (" -S prepare.max_test=null" if capped else ""), ""


def plan_lines(arm: str, plans: list[dict[str, Any]], context: RunContext) -> list[str]:
    """One line per plan (``verdict/plan.py``): the test examples or seeds that give 80% power to decide, each with the
    rerun that runs it."""
    by_loss = context.by_loss
    unit = "test sequences" if by_loss else "test examples"
    lines = []
    for p in plans:
        s, n = p["seeds_now"], p["examples_now"]
        delta = f"{p['delta']:+.4f} nats" if by_loss else f"{100 * p['delta']:+.2f} pp"
        at = f"if the true difference is the observed {delta}" if p["assumed"] == "observed" else \
            "if the arms did not differ at all"
        options = []
        if p["examples"] is None:
            options.append(f"no number of {unit} at these {s} seed{'s' * (s != 1)} ({p['why_not_examples']})")
        elif p["examples"] <= n:
            options.append(f"the {n:,} {unit} that ran should already give it (this result was the unlucky 1 in "
                           f"{1 / max(1 - p['power_now'], 1e-9):.0f})")
        else:
            setting, why = examples_setting(p["examples"], n, context)
            how = f": `.venv/bin/dvc exp run --temp {setting}`" if setting else (f", but {why}" if why else "")
            options.append(f"{p['examples']:,} {unit} at these {s} seed{'s' * (s != 1)}{how}")
        if p["seeds"] is None:
            options.append(f"no number of seeds ({p['why_not_seeds']})")
        else:
            options.append(f"{p['seeds']} seeds at these {n:,} {unit}: `{seeds_line(p['seeds'], context.seeds)}`")
        caveat = "; planned from 1 seed, which cannot tell seed from example variation" if s == 1 else ""
        lines.append(f"{arm}, *{p['question']}* with 80% power {at} (power now {p['power_now']:.0%}): "
                     f"{'; or '.join(options)}{caveat}")
    return lines


def short_plan(plans: list[dict[str, Any]], by_loss: bool) -> str:
    """The first plan in a few words, for a table cell: the question, and the test examples or seeds it needs."""
    p = plans[0]
    unit = "test sequences" if by_loss else "test examples"
    options = []
    if p["examples"] is not None and p["examples"] > p["examples_now"]:
        options.append(f"{p['examples']:,} {unit}")
    if p["seeds"] is not None:
        options.append(f"{p['seeds']} seeds")
    return (f"*{p['question']}* needs {' or '.join(options)}" if options
            else f"*{p['question']}*: see the plans in Details")
