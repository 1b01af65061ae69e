"""How much power any valid interval or test can have with few seeds: the bound behind docs/verdict.md's choice.

With S seeds, the paired differences' mean is normal around the truth with variance v0·(1 + r), where v0 is what
example sampling gives (measured precisely, on N − 1 degrees of freedom) and r the seeds' own effect relative to it
(unknown). What the data say about r is F = MS_seed / MS_residual ~ (1 + r)·χ²(S−1)/(S−1). An interval is then
estimate ± h(F)·√v0 for some h; it is valid when its one-sided bound covers the truth at 95% *whatever r is*. This
script measures, for the hull the pipeline uses (max of the example-level z and the t over seeds) and the
Satterthwaite combination of the variance components, the worst one-sided coverage over r, the power of the
equivalence test (two one-sided tests at 5%) when the arms agree (a true difference of 0, at r = 0 and r = 1), and
how often a real loss of twice the margin is called *worse* when the seeds differ (r = 1, r = 4), at a margin of
``--margin-se`` example-level standard errors (3.87: 3 seeds × 10,000 examples at 5% discordance, 0.5 pp margin).

It then bounds every rule at once, by linear programming over rules that may even be randomised (F cut into 242
bins, each bin's h or acceptance region chosen from a grid): the most power at r = 0 that *any* valid interval
(one-sided coverage ≥ 95% at every r) can have, and that *any* equivalence test can have whose false *equivalent*
rate on the margin is ≤ 5% at every r (not even an interval behind it). Both optima get their power by giving up
when the seeds disagree — h of tens of SE once F passes about 2.3 —, and they are optimal for this one margin:
the bound on what a rule could do, not one to report. Last, two-regime intervals (a narrower quantile while the
seeds agree with example sampling, a wider one when they do not), each made valid at every r: the one with the
most power at this margin, and the one that gains most over the hull at its worst of several margins — what a
reasonable rule could add to the hull, and what reaching the target at one margin costs at the others.

    .venv/bin/python scripts/verdict_frontier.py [--seeds 3] [--margin-se 3.87]
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import optimize, sparse
from scipy import stats as st

RS = np.concatenate([[0], np.logspace(-2, 3, 60)])  # the seed effects every rule must cover
EDGES = np.concatenate([[0], np.logspace(-4, 4, 241), [np.inf]])  # F's bins for the linear programs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds S (the seeds' information: S − 1 df)")
    ap.add_argument("--margin-se", type=float, default=3.87, help="the margin in example-level standard errors")
    args = ap.parse_args(argv)
    k, m = args.seeds - 1, args.margin_se
    e = st.chi2.ppf((np.arange(3000) + 0.5) / 3000, k) / k  # quantiles of χ²(k)/k
    z, t = st.norm.ppf(0.95), st.t.ppf(0.95, k)

    def worst_bound(h) -> float:  # the one-sided coverage at the worst r
        return min(float(np.mean(st.norm.cdf(h((1 + r) * e) / np.sqrt(1 + r)))) for r in RS)

    def power(h, r: float = 0.0, margin: float = m) -> float:  # P(both one-sided bounds inside ±margin), Δ = 0
        x = (margin - h((1 + r) * e)) / np.sqrt(1 + r)
        return float(np.mean(np.where(x > 0, 2 * st.norm.cdf(x) - 1, 0)))

    def worse(h, r: float) -> float:  # P(the upper bound below −m) at a true difference of −2m, seed effect r
        return float(np.mean(st.norm.cdf((m - h((1 + r) * e)) / np.sqrt(1 + r))))

    candidates = {
        "hull: max(z, t·√F) (the pipeline's)": lambda f: np.maximum(z, t * np.sqrt(f)),
        "Satterthwaite (components, truncated)": lambda f: np.where(f <= 1, z, t * np.sqrt(f)),
    }
    print(f"S = {args.seeds}, margin = {m} SE. Worst one-sided coverage over the seed effect r; *equivalent* at "
          "Δ = 0, r = 0 and 1; *worse* at Δ = −2·margin, r = 1 and 4")
    interval, h_best = interval_bound(k, m)
    candidates["the best valid interval (its h, per bin)"] = lambda f: h_best[np.searchsorted(EDGES, f) - 1]
    for name, h in candidates.items():  # the best interval is the rule the linear program found (or better)
        print(f"  {name:40s} {100 * worst_bound(h):5.1f}%   {100 * power(h):5.1f}% {100 * power(h, 1.0):5.1f}%"
              f"   {100 * worse(h, 1.0):5.1f}% {100 * worse(h, 4.0):5.1f}%")
    print(f"  {'the most any valid equivalence test can':40s} {'—':>5s}    {100 * equivalence_test_bound(k, m):5.1f}%"
          f"  (the linear programs' bounds: interval {100 * interval:.1f}%)")
    print("  that interval's h, in SE, against F:", ", ".join(
        f"{f:g}: {h_best[np.searchsorted(EDGES, f) - 1]:.1f}" for f in (0.1, 0.5, 1, 1.5, 2, 2.5, 3, 5)))
    margins = (2.5, m, 5.0, 6.0)
    print(f"Two-regime intervals, h = max(z, c·√F) while F ≤ F1, then c2·t·√F (c2 the smallest valid): *equivalent* "
          f"at Δ = 0, r = 0, margins {', '.join(f'{x:g}' for x in margins)} SE")
    hull = [power(candidates["hull: max(z, t·√F) (the pipeline's)"], 0.0, x) for x in margins]
    rules = []
    for f1 in (1.5, 2, 2.5, 3, 4, 6):
        for c in np.arange(1.7, 2.95, 0.1):
            h = _two_regime(z, t, f1, c, lambda h: worst_bound(h) >= 0.95)
            if h is not None:
                rules.append((f1, c, [power(h, 0.0, x) for x in margins]))
    for label, (f1, c, p) in (("the hull", (None, None, hull)),
                              ("the most at this margin", max(rules, key=lambda q: q[2][1])),
                              ("the most gained at the worst margin", max(rules, key=lambda q: min(
                                  a - b for a, b in zip(q[2], hull, strict=True))))):
        rule = "" if f1 is None else f" (F1 = {f1:g}, c = {c:.1f})"
        print(f"  {label + rule:52s} " + "  ".join(f"{100 * x:5.1f}%" for x in p))
    return 0


def _two_regime(z: float, t: float, f1: float, c: float, valid):
    """h = max(z, c·√F) up to F1 and c2·t·√F above it, c2 the smallest (bisection) for which ``valid(h)``."""
    def rule(c2):
        return lambda f: np.where(f <= f1, np.maximum(z, c * np.sqrt(f)), c2 * t * np.sqrt(f))
    lo, hi = 0.5, 20.0
    if not valid(rule(hi)):
        return None
    for _ in range(25):
        lo, hi = (lo, (lo + hi) / 2) if valid(rule((lo + hi) / 2)) else ((lo + hi) / 2, hi)
    return rule(hi)


def _bins(k: int, r: float) -> np.ndarray:
    """P(F in each bin) at seed effect r."""
    return np.diff(st.chi2.cdf(EDGES * k / (1 + r), k))


def _best(k: int, gain: np.ndarray, constraint, sign: float, level: float) -> optimize.OptimizeResult:
    """Maximise the power at r = 0 (``gain`` per grid value) over a per-bin mixture of grid values, subject to
    sign·Σ P_r(bin)·constraint(r) ≤ sign·level at every r."""
    nb, ng = len(EDGES) - 1, len(gain)
    a = np.array([sign * (_bins(k, r)[:, None] * constraint(r)[None, :]).ravel() for r in RS])
    one_each = sparse.kron(sparse.eye(nb), np.ones((1, ng)))
    res = optimize.linprog(-(_bins(k, 0.0)[:, None] * gain[None, :]).ravel(), A_ub=a,
                           b_ub=np.full(len(RS), sign * level), A_eq=one_each, b_eq=np.ones(nb), bounds=(0, 1),
                           method="highs")
    if res.status != 0:
        raise RuntimeError(f"linear program: {res.message}")
    return res


def interval_bound(k: int, m: float) -> tuple[float, np.ndarray]:
    """(the highest power at r = 0 of an interval estimate ± h(F) whose one-sided bound covers at 95% at every r,
    the mean h per bin of the rule that reaches it)."""
    hs = np.concatenate([np.linspace(0, 8, 161), np.logspace(np.log10(8.2), np.log10(3000), 120)])
    res = _best(k, np.maximum(2 * st.norm.cdf(m - hs) - 1, 0),
                lambda r: st.norm.cdf(hs / np.sqrt(1 + r)), -1.0, 0.95)
    return -res.fun, (res.x.reshape(-1, len(hs)) * hs).sum(axis=1)


def equivalence_test_bound(k: int, m: float) -> float:
    """The highest power at r = 0 of any test that calls *equivalent* when |estimate| < g(F), its false
    *equivalent* rate at a true difference on the margin ≤ 5% at every r."""
    gs = np.linspace(0, m + 8, 161)
    res = _best(k, np.maximum(2 * st.norm.cdf(gs) - 1, 0),
                lambda r: st.norm.cdf((gs - m) / np.sqrt(1 + r)) - st.norm.cdf((-gs - m) / np.sqrt(1 + r)),
                1.0, 0.05)
    return -res.fun


if __name__ == "__main__":
    raise SystemExit(main())
