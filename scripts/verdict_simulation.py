"""The verdict statistics by simulation: coverage of the 95% interval and of the one-sided 95% bound, the rate of
false *equivalent* and false *not worse* verdicts at a true difference on the margin, and the power to call an arm
*equivalent* when it is — for accuracy (paired right/wrong outcomes) and loss (continuous paired differences),
under three patterns of how the differences arise:

- independent: every (seed, example) pair flips on its own;
- same examples: an example that flips does so in every seed (the data's hard cases, not the seed);
- seed effect: each seed's arm differs from its fp32 by its own amount, u_s ~ N(0, τ²), on top of independent
  flips, with τ twice the standard error one seed's examples give (capped so no probability goes negative).

With one seed the seed effect cannot be measured: the coverage reported there is of that seed's own difference
(the verdicts say the seed variation is not in the interval). The docs' tables (docs/verdict-simulation.md) come
from:

    .venv/bin/python scripts/verdict_simulation.py --reps 4000 --markdown               # the fixed designs
    .venv/bin/python scripts/verdict_simulation.py --sequential --reps 1000 --markdown  # seeds until decided

The second runs the sequential procedure (``verdict/sequential.py``) over a few designs, beside the fixed 5-seed
design on the same scenarios (``--save FILE`` also writes its rows, with each look's share of stops, as JSON).
tests/test_verdict_simulation.py runs a few cells of each.
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
from ampbench.verdict.sequential import Design  # noqa: E402
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


def sequential_cell(kind: str, scenario: str, design: Design, examples: int, discordance: float | None,
                    delta: float, reps: int, seed: int = 0) -> dict:
    """One cell of the sequential procedure (``verdict/sequential.py``): each replicate draws ``design.max_seeds``
    seeds and looks after each from ``min_seeds``, at the look's levels (each interval of the hull at its own),
    stopping at the first look at which the deciding verdicts are decided (or at the maximum). Shares of
    replicates whose reported interval (at the stopping look) covers the truth, whose verdicts are *not worse*,
    *equivalent* and *worse*; the mean and the quartiles of the seeds they trained, and the share that stopped at
    each look (``stopped_at``: seeds → share)."""
    rng = np.random.default_rng(seed)
    margin = MARGIN_ACCURACY if kind == "accuracy" else MARGIN_LOSS
    higher = kind == "accuracy"
    looks = design.looks()
    covered = equivalent = not_worse_ = worse = 0
    used = []
    for _ in range(reps):
        if kind == "accuracy":
            arm, ref, target = draw_accuracy(rng, scenario, design.max_seeds, examples, discordance, delta)
            stats = lambda s, level, arm=arm, ref=ref: paired_accuracy(arm[:s], ref[:s], level)  # noqa: E731
        else:
            d, target = draw_loss(rng, scenario, design.max_seeds, examples, delta)
            stats = lambda s, level, d=d: paired_mean(d[:s], level)  # noqa: E731
        for lk in looks:
            report, decide = lk.levels()  # each interval of the hull at its own level
            one = stats(lk.seeds, decide)
            nw = not_worse(one, margin, higher)[0]
            eq = verdict(one, margin, higher, one_sided=True)[0]
            if design.decided(nw, eq):
                break
        two = stats(lk.seeds, report)
        covered += two.ci_low <= target <= two.ci_high
        equivalent += eq == "equivalent"
        not_worse_ += nw == "not worse"
        worse += nw == "worse"
        used.append(lk.seeds)
    q1, median, q3 = (float(x) for x in np.percentile(used, [25, 50, 75]))
    return {"kind": kind, "scenario": scenario, "design": design.to_dict(), "examples": examples,
            "discordance": discordance, "delta": delta, "reps": reps, "coverage": covered / reps,
            "equivalent": equivalent / reps, "not_worse": not_worse_ / reps, "worse": worse / reps,
            "mean_seeds": float(np.mean(used)), "seeds_quartiles": (q1, median, q3),
            "stopped_at": {s: used.count(s) / reps for s in design.seed_counts}}


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


# The sequential designs the docs compare: Pocock-type spending with a short and a longer reach, O'Brien–Fleming's with
# the longest, and one that also waits for the equivalence verdict.
SEQUENTIAL_DESIGNS = (Design(3, 6, "pocock"), Design(3, 8, "pocock"), Design(3, 10, "obrien_fleming"),
                      Design(3, 8, "pocock", until="equivalent"))
SEQUENTIAL_ACCURACY = ((10000, 0.05), (2000, 0.01))  # (test examples, discordance)
SEQUENTIAL_LOSS_EXAMPLES = 2000
FIXED_SEEDS = 5  # the fixed design the sequential one is judged against: the default run's seeds


def sequential_settings() -> list[tuple]:
    """The data settings of the sequential table, (kind, scenario, examples, discordance, Δ): accuracy at Δ = 0,
    −margin/2 and −margin (the bad side), loss at 0, +margin/2 and +margin."""
    out = []
    for scenario in SCENARIOS:
        for n, p in SEQUENTIAL_ACCURACY:
            for delta in (0.0, -MARGIN_ACCURACY / 2, -MARGIN_ACCURACY):
                out.append(("accuracy", scenario, n, p, delta))
    for scenario in SCENARIOS:
        for delta in (0.0, MARGIN_LOSS / 2, MARGIN_LOSS):
            out.append(("loss", scenario, SEQUENTIAL_LOSS_EXAMPLES, None, delta))
    return out


def sequential_table(reps: int, designs=SEQUENTIAL_DESIGNS) -> list[dict]:
    """Every sequential cell (each design × each setting of ``sequential_settings``), each row with the fixed
    ``FIXED_SEEDS``-seed design's ``cell()`` of the same setting beside it (``fixed``: its own replicates of the
    same scenario, not the same draws)."""
    from concurrent.futures import ProcessPoolExecutor

    settings = sequential_settings()
    fixed_jobs = [(i, ("fixed", (kind, scenario, FIXED_SEEDS, n, p, delta, reps)))
                  for i, (kind, scenario, n, p, delta) in enumerate(settings)]
    seq_jobs = [(len(settings) + j * len(settings) + i, ("sequential", (kind, scenario, design, n, p, delta, reps)))
                for j, design in enumerate(designs) for i, (kind, scenario, n, p, delta) in enumerate(settings)]
    with ProcessPoolExecutor() as pool:
        fixed = list(pool.map(_run_any, fixed_jobs))
        seq = list(pool.map(_run_any, seq_jobs))
    rows = []
    for i in range(len(settings)):  # one block per setting: a row per design, each with the setting's fixed cell
        for j in range(len(designs)):
            row = dict(seq[j * len(settings) + i])
            row["fixed"] = fixed[i]
            row["seeds_vs_fixed"] = row["mean_seeds"] / FIXED_SEEDS
            rows.append(row)
    return rows


def _run_any(args) -> dict:
    i, (what, job) = args
    return cell(*job, seed=i) if what == "fixed" else sequential_cell(*job, seed=i)


def design_label(design: dict) -> str:
    """``3–8, Pocock`` and the like; ``, until equivalent`` when the equivalence verdict must be decided too."""
    name = {"pocock": "Pocock", "obrien_fleming": "O'Brien–Fleming"}[design["spending"]]
    until = ", until equivalent" if design["until"] == "equivalent" else ""
    return f"{design['min_seeds']}–{design['max_seeds']}, {name}{until}"


def sequential_markdown(rows: list[dict]) -> str:
    """The sequential table for the docs: one line per design and setting."""
    out = ["| metric | pattern | examples | discordance | true Δ | design | reported interval covers | not worse | "
           "equivalent | worse | mean seeds (quartiles) | fixed 5 seeds: not worse / equivalent | seeds vs fixed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unit = (lambda x: f"{100 * x:+.2f} pp") if r["kind"] == "accuracy" else (lambda x: f"{x:+.3f} nats")
        p = f"{100 * r['discordance']:.1f}%" if r["discordance"] is not None else "—"
        q = ", ".join(f"{x:g}" for x in r["seeds_quartiles"])
        f = r["fixed"]
        out.append(f"| {r['kind']} | {r['scenario']} | {r['examples']:,} | {p} | {unit(r['delta'])} "
                   f"| {design_label(r['design'])} | {100 * r['coverage']:.1f}% | {100 * r['not_worse']:.1f}% "
                   f"| {100 * r['equivalent']:.1f}% | {100 * r['worse']:.1f}% "
                   f"| {r['mean_seeds']:.2f} ({q}) "
                   f"| {100 * f['not_worse']:.1f}% / {100 * f['equivalent']:.1f}% | {100 * r['seeds_vs_fixed']:.0f}% |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000, help="replicates per cell")
    ap.add_argument("--markdown", action="store_true", help="print the docs' table instead of JSON")
    ap.add_argument("--sequential", action="store_true",
                    help="the sequential procedure (seeds until decided) beside the fixed 5-seed design")
    ap.add_argument("--save", metavar="FILE", help="with --sequential: also write the rows as JSON to FILE (every "
                    "look's share of stops is there, not in the markdown)")
    args = ap.parse_args(argv)
    if args.sequential:
        rows = sequential_table(args.reps)
        if args.save:
            Path(args.save).write_text(json.dumps(rows, indent=1))
        print(sequential_markdown(rows) if args.markdown else json.dumps(rows, indent=1))
        return 0
    rows = table(args.reps)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
