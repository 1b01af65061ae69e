"""The verdict statistics by simulation: coverage of the 95% interval and of the one-sided 95% bound, the rate of
false *equivalent* and false *not worse* verdicts at a true difference on the margin, and the power to call an arm
*equivalent* when it is — for accuracy (paired right/wrong outcomes) and loss (continuous paired differences),
under three patterns of how the differences arise:

- independent: every (seed, example) pair flips on its own;
- same examples: an example that flips does so in every seed (the data's hard cases, not the seed);
- seed effect: each seed's arm differs from its fp32 by its own amount, u_s ~ N(0, τ²), on top of independent
  flips, with τ twice the standard error one seed's examples give (capped so no probability goes negative).

With one seed the seed effect cannot be measured: the coverage reported there is of that seed's own difference
(the verdicts say the seed variation is not in the interval). The docs' table (docs/verdict.md) comes from:

    .venv/bin/python scripts/verdict_simulation.py --reps 1000 --markdown

tests/test_verdict_simulation.py runs a few cells of it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ampbench.verdict.decisions import not_worse, one_sided_level, verdict  # noqa: E402
from ampbench.verdict.stats import paired_accuracy, paired_mean  # noqa: E402

SCENARIOS = ("independent", "same examples", "seed effect")
MARGIN_ACCURACY = 0.005  # the default margins: 0.5 pp and 0.02 nats
MARGIN_LOSS = 0.02
LOSS_SD = 0.1  # sd of one paired loss difference, nats (heavy-tailed: Student t with 4 df)


def seed_sd(discordance: float, examples: int, delta: float) -> float:
    """τ of the seed-effect scenario: twice one seed's standard error, capped at a third of the room the
    probabilities leave (p_b, p_c ≥ 0 for 3 sd either way)."""
    return min(2 * math.sqrt(discordance / examples), (discordance - abs(delta)) / 3)


def draw_accuracy(rng: np.random.Generator, scenario: str, seeds: int, examples: int, discordance: float,
                  delta: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(arm_correct, ref_correct, the difference the interval should cover): seeds × examples outcomes whose
    discordant share is ``discordance`` and mean difference (arm − fp32) ``delta``; pairs that agree are right
    in both."""
    p_b = np.full(seeds, (discordance + delta) / 2)  # arm right, fp32 wrong
    p_c = np.full(seeds, (discordance - delta) / 2)
    target = delta
    if scenario == "seed effect":
        u = rng.normal(0, seed_sd(discordance, examples, delta), seeds)
        p_b, p_c = np.clip(p_b + u / 2, 0, discordance), np.clip(p_c - u / 2, 0, discordance)
        if seeds == 1:
            target = float(p_b[0] - p_c[0])
    rows = 1 if scenario == "same examples" else seeds
    x = rng.random((rows, examples))
    d = (x < p_b[:rows, None]).astype(np.int8) - ((x >= p_b[:rows, None]) & (x < (p_b + p_c)[:rows, None]))
    d = np.broadcast_to(d, (seeds, examples))
    return d >= 0, d <= 0, target


def draw_loss(rng: np.random.Generator, scenario: str, seeds: int, examples: int,
              delta: float) -> tuple[np.ndarray, float]:
    """(paired loss differences seeds × examples, the difference to cover): heavy-tailed per-example noise of sd
    LOSS_SD; shared by every seed (same examples) or with a seed effect of twice one seed's standard error."""
    scale = LOSS_SD / math.sqrt(2)  # Student t with 4 df has variance 2
    target = delta
    if scenario == "same examples":
        d = np.broadcast_to(scale * rng.standard_t(4, examples), (seeds, examples)) + delta
        d = d + 0.1 * scale * rng.standard_t(4, (seeds, examples))  # a little of their own
    else:
        d = delta + scale * rng.standard_t(4, (seeds, examples))
        if scenario == "seed effect":
            u = rng.normal(0, 2 * LOSS_SD / math.sqrt(examples), seeds)
            d = d + u[:, None]
            if seeds == 1:
                target = delta + float(u[0])
    return d, target


def cell(kind: str, scenario: str, seeds: int, examples: int, discordance: float | None, delta: float,
         reps: int, seed: int = 0) -> dict:
    """One cell of the table: shares of ``reps`` replicates whose 95% interval covers the truth, whose one-sided
    95% bound (the bad side's) does, and whose verdicts are *equivalent* and *not worse*."""
    rng = np.random.default_rng(seed)
    margin = MARGIN_ACCURACY if kind == "accuracy" else MARGIN_LOSS
    higher = kind == "accuracy"
    covered = bound = equivalent = not_worse_ = 0
    for _ in range(reps):
        if kind == "accuracy":
            arm, ref, target = draw_accuracy(rng, scenario, seeds, examples, discordance, delta)
            two, one = paired_accuracy(arm, ref), paired_accuracy(arm, ref, one_sided_level(0.95))
        else:
            d, target = draw_loss(rng, scenario, seeds, examples, delta)
            two, one = paired_mean(d), paired_mean(d, one_sided_level(0.95))
        covered += two.ci_low <= target <= two.ci_high
        bound += (one.ci_low <= target) if higher else (one.ci_high >= target)
        equivalent += verdict(one, margin, higher, one_sided=True)[0] == "equivalent"  # as comparison.py judges
        not_worse_ += not_worse(one, margin, higher)[0] == "not worse"
    return {"kind": kind, "scenario": scenario, "seeds": seeds, "examples": examples, "discordance": discordance,
            "delta": delta, "reps": reps, "coverage": covered / reps, "bound_coverage": bound / reps,
            "equivalent": equivalent / reps, "not_worse": not_worse_ / reps}


def table(reps: int, seeds=(1, 3, 5), examples=(270, 2000, 10000), discordances=(0.002, 0.01, 0.05)) -> list[dict]:
    """Every cell: accuracy at Δ = 0 and, where the discordance allows it, Δ = −margin (on the margin, the bad
    side); loss at Δ = 0 and Δ = +margin."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = []
    for scenario in SCENARIOS:
        for s in seeds:
            for n in examples:
                for p in discordances:
                    for delta in (0.0, -MARGIN_ACCURACY):
                        if abs(delta) < p:  # a difference needs discordant pairs to carry it
                            jobs.append(("accuracy", scenario, s, n, p, delta, reps))
                for delta in (0.0, MARGIN_LOSS):
                    jobs.append(("loss", scenario, s, n, None, delta, reps))
    with ProcessPoolExecutor() as pool:
        return list(pool.map(_run, [(i, job) for i, job in enumerate(jobs)]))


def _run(args) -> dict:
    i, job = args
    return cell(*job, seed=i)


def markdown(rows: list[dict]) -> str:
    """The table for the docs: one line per cell."""
    out = ["| metric | pattern | seeds | examples | discordance | true Δ | 95% CI covers | one-sided bound covers | "
           "equivalent | not worse |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unit = (lambda x: f"{100 * x:+.1f} pp") if r["kind"] == "accuracy" else (lambda x: f"{x:+.2f} nats")
        p = f"{100 * r['discordance']:.1f}%" if r["discordance"] is not None else "—"
        out.append(f"| {r['kind']} | {r['scenario']} | {r['seeds']} | {r['examples']:,} | {p} | {unit(r['delta'])} "
                   f"| {100 * r['coverage']:.1f}% | {100 * r['bound_coverage']:.1f}% | {100 * r['equivalent']:.1f}% "
                   f"| {100 * r['not_worse']:.1f}% |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000, help="replicates per cell")
    ap.add_argument("--markdown", action="store_true", help="print the docs' table instead of JSON")
    args = ap.parse_args(argv)
    rows = table(args.reps)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
