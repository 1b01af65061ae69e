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

``--sequential`` bounds designs that add seeds until the verdict decides (issue 39's goal: at Δ = 0, on average at
most 60% of the fixed 5 seeds). Whatever the spending and the rule, the runs that have called *not worse* by S seeds
form a test on S seeds' data whose false *not worse* rate on the margin is at most the procedure's 5%; so that share
is at most p*(S), the most power at r = 0 of any valid test on S seeds (a linear program over every decision region
in the estimate and F, randomised ones too; and over thresholds, est ≥ −margin + h(F), the monotone rules). A design
whose first look is at S0 seeds trains on average at least S0 + Σ (1 − p*(S)) over its looks S0 … max − 1 (a run
stopped by a *worse* verdict at Δ = 0 is a false one, 0.0% in every design simulated). The bound takes each look's
best test on its own; no design reaches all at once. The sharper bound takes all looks at once: the Lagrangian
dual of "least mean seeds at Δ = 0, subject to false *not worse* ≤ 5% on the margin at every r and *not worse* at
Δ = 0 at least as often as the fixed 5 seeds", each multiplier setting solved over every stopping rule by backward
induction on a grid of (mean, spread), the multipliers by L-BFGS; the rule at the optimum attains it (checked by
simulating it). It also builds the best design this family allows with a
first look at 2 seeds: the linear program's most powerful rule at that look, the hull at one nominal level at the
later looks, that level set by simulation so that the false *not worse* rate on the margin stays ≤ 5% at each seed
effect of a grid, and reports its mean seeds and power at Δ = 0.

    .venv/bin/python scripts/verdict_frontier.py [--seeds 3] [--margin-se 3.87]
    .venv/bin/python scripts/verdict_frontier.py --sequential    # about 7 minutes
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import optimize, sparse
from scipy import stats as st

RS = np.concatenate([[0], np.logspace(-2, 3, 60)])  # the seed effects every rule must cover
FIXED_POWER = 0.991  # the fixed 5 seeds' *not worse* at Δ = 0, 10,000 × 5% (docs/verdict-simulation.md)
EDGES = np.concatenate([[0], np.logspace(-4, 4, 241), [np.inf]])  # F's bins for the linear programs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds S (the seeds' information: S − 1 df)")
    ap.add_argument("--margin-se", type=float, default=3.87, help="the margin in example-level standard errors")
    ap.add_argument("--sequential", action="store_true",
                    help="bound the mean seeds of any valid seeds-until-decided design instead (the margin per "
                         "seed: --margin-se / √--seeds)")
    args = ap.parse_args(argv)
    if args.sequential:
        return sequential_report(args.margin_se / np.sqrt(args.seeds))
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


def not_worse_bound(seeds: int, m: float, alpha: float = 0.05, *, monotone: bool = False,
                    step: float = 0.05) -> tuple[float, np.ndarray]:
    """(the most power at Δ = 0, r = 0 of a *not worse* test on ``seeds`` seeds whose false *not worse* rate at a
    true difference on the margin ``m`` (in the S-seed design's SE) is ≤ ``alpha`` at every r, the per-bin mixture
    that reaches it). ``monotone``: thresholds est ≥ −m + h(F); otherwise any region of (est, F), in est bins of
    ``step`` SE over ±6 (outside, a decision costs false ones and gains nothing at Δ = 0)."""
    k = seeds - 1
    if monotone:
        cells = np.concatenate([np.linspace(-3, 8, 221), np.logspace(np.log10(8.2), np.log10(3000), 120)])
        gain, null = st.norm.cdf(m - cells), (lambda r: st.norm.sf(cells / np.sqrt(1 + r)))
    else:
        xe = np.arange(-6, 6 + step / 2, step)
        gain, null = np.diff(st.norm.cdf(xe)), (lambda r: np.diff(st.norm.cdf((xe + m) / np.sqrt(1 + r))))
    fbins = (lambda r: np.ones(1)) if k == 0 else (lambda r: _bins(k, r))  # one seed: nothing measures r
    nb = len(fbins(0.0))
    a = np.array([(fbins(r)[:, None] * null(r)[None, :]).ravel() for r in RS])
    eq = dict(A_eq=sparse.kron(sparse.eye(nb), np.ones((1, len(gain)))), b_eq=np.ones(nb)) if monotone else {}
    res = optimize.linprog(-(fbins(0.0)[:, None] * gain[None, :]).ravel(), A_ub=a, b_ub=np.full(len(RS), alpha),
                           bounds=(0, 1), method="highs", **eq)
    if res.status != 0:
        raise RuntimeError(f"linear program: {res.message}")
    return -res.fun, np.clip(res.x.reshape(nb, len(gain)), 0, None)


def _walk(first: int, max_seeds: int, step: float, nodes: int, reach: float = 3.5) -> dict:
    """The states of the normal model after each seed, as a grid in (mean, √SS) of the per-seed differences, and
    the matrices that carry a function of the next seed's state back to this one's: its expectation at Δ = 0,
    r = 0 (Gauss–Hermite over the next seed, bilinear interpolation between grid points)."""
    mg, sg = np.arange(-reach, reach + step / 2, step), np.arange(0, 2 * reach + step / 2, step)
    grid = np.meshgrid(mg, sg, indexing="ij")
    mean, ss, n = grid[0].ravel(), grid[1].ravel() ** 2, grid[0].size
    xs, ws = np.polynomial.hermite_e.hermegauss(nodes)
    ws = ws / ws.sum()

    def spread(m2, s2, w):  # rows of (state, weight) pairs of the bilinear interpolation at (m2, √s2)
        fi = np.clip((m2 + reach) / step, 0, len(mg) - 1 - 1e-9)
        fj = np.clip(np.sqrt(s2) / step, 0, len(sg) - 1 - 1e-9)
        i, j, a, b = fi.astype(int), fj.astype(int), fi % 1, fj % 1
        return [((i + di) * len(sg) + j + dj, w * wa * wb) for di, wa in ((0, 1 - a), (1, a))
                for dj, wb in ((0, 1 - b), (1, b))]

    carry = {}
    for k in range(1, max_seeds):
        parts = [q for x, w in zip(xs, ws, strict=True)
                 for q in spread((k * mean + x) / (k + 1), ss + k / (k + 1) * (x - mean) ** 2, w)]
        rows = np.tile(np.arange(n), len(parts))
        carry[k] = sparse.csr_matrix((np.concatenate([v for _, v in parts]),
                                      (rows, np.concatenate([c for c, _ in parts]))), shape=(n, n))
    start = np.zeros(n)  # one seed: mean = x, SS = 0
    for c, v in spread(xs, np.zeros_like(xs), ws):
        np.add.at(start, c, v)
    return dict(mean=mean, ss=ss, carry=carry, start=start, first=first, max=max_seeds, reach=reach)


def _lagrangian(walk: dict, m1: float, rs: np.ndarray, lam: np.ndarray, mu: float, power: float,
                alpha: float) -> tuple[float, np.ndarray, np.ndarray, dict]:
    """(the least Lagrangian E0[seeds] + Σ λ_r (P_r(not worse) − α) + μ (power − P0(not worse)) over every stopping
    rule, its gradient in (λ, μ), the best rule's [P_r(not worse) for r in rs, P0(not worse), E0[seeds]], and that
    rule: per look, per grid state, 0 call *not worse*, 1 stop without it, 2 add a seed).

    By backward induction: at each look a run may call *not worse* (cost Σ λ_r LR_r − μ, LR_r the likelihood
    ratio of the margin at seed effect r against Δ = 0, r = 0), stop with anything else (0) or add a seed (1 + the
    next look's expected cost). The likelihood ratios depend on the data only through (mean, SS), and the seeds
    are independent, so the best rule over every history is one of these states."""
    mean, ss, first, last = walk["mean"], walk["ss"], walk["first"], walk["max"]
    with np.errstate(divide="ignore"):
        log_lam = np.log(lam)
    rule = {}
    cost = track = None  # track: per state, E0[LR_r · 1(not worse later)] for each r, P0(not worse later), E0[seeds]
    for k in range(last, 0, -1):
        onward = None if k == last else walk["carry"][k]
        if k < first:
            cost, track = onward @ cost, (onward @ track.T).T
            continue
        log_lr = np.array([-k / 2 * np.log1p(r) - (k * (mean + m1) ** 2 + ss) / (2 * (1 + r))
                           + (k * mean ** 2 + ss) / 2 for r in rs])
        call = np.exp(np.minimum(np.logaddexp.reduce(log_lam[:, None] + log_lr, axis=0), 700)) - mu
        called = np.vstack([np.exp(np.minimum(log_lr, 700)), np.ones_like(mean), np.full_like(mean, k)])
        quit_ = np.vstack([np.zeros((len(rs) + 1, mean.size)), np.full_like(mean, k)])
        if onward is None:  # the last look: adding a seed is no choice
            go_on, go_track = np.full_like(mean, np.inf), quit_
        else:
            go_on, go_track = 1 + onward @ cost, (onward @ track.T).T
        best = np.argmin(np.vstack([call, np.zeros_like(mean), go_on]), axis=0)
        cost, rule[k] = np.choose(best, [call, np.zeros_like(mean), go_on]), best
        track = np.where(best == 0, called, np.where(best == 1, quit_, go_track))
    seen = track @ walk["start"]
    value = walk["start"] @ cost + first - float(lam.sum()) * alpha + mu * power
    return value, np.concatenate([seen[:-2] - alpha, [power - seen[-2]]]), seen, rule


def least_mean_seeds(m1: float, first: int, max_seeds: int = 10, power: float = FIXED_POWER, alpha: float = 0.05,
                     rs: np.ndarray = RS, step: float = 0.05,
                     nodes: int = 40) -> tuple[float, np.ndarray, dict]:
    """(a lower bound on the mean seeds at Δ = 0, r = 0 of every design that looks after each seed from ``first``
    to ``max_seeds``, calls *not worse* there in at least ``power`` of runs and on the margin in at most
    ``alpha`` at every seed effect in ``rs``; [P_r(not worse)…, P0(not worse), mean seeds] of the stopping rule
    that attains the bound; that rule, per look a choice per grid state, for ``play``).

    The Lagrangian dual: for any multipliers λ ≥ 0, μ ≥ 0, the least Lagrangian over every rule is below every
    valid design's mean seeds (weak duality), so its maximum (L-BFGS over the multipliers) is the bound. The rule
    that attains it is valid and as powerful as asked, within the grid's error, when the bound is tight."""
    walk = _walk(first, max_seeds, step, nodes)

    def negative(x):
        value, grad, _, _ = _lagrangian(walk, m1, rs, x[:-1], x[-1], power, alpha)
        return -value, -grad

    x = optimize.minimize(negative, np.full(len(rs) + 1, 0.5), jac=True, method="L-BFGS-B",
                          bounds=[(0, None)] * (len(rs) + 1)).x
    value, _, seen, rule = _lagrangian(walk, m1, rs, x[:-1], x[-1], power, alpha)
    return value, seen, dict(rule, step=step, reach=walk["reach"], first=first, max=max_seeds)


def play(rule: dict, delta: float, r: float, reps: int = 100_000, seed: int = 5) -> tuple[float, float]:
    """(mean seeds, share called *not worse*) of ``least_mean_seeds``' rule on simulated runs: per-seed
    differences N(Δ, 1 + r), each look deciding as the grid point nearest to its (mean, √SS)."""
    rng, step, reach = np.random.default_rng(seed), rule["step"], rule["reach"]
    cols = int(round(2 * reach / step)) + 1
    d = delta + rng.standard_normal((reps, rule["max"])) * np.sqrt(1 + r)
    seeds, called, open_ = np.full(reps, rule["max"]), np.zeros(reps, bool), np.ones(reps, bool)
    for k in range(rule["first"], rule["max"] + 1):
        x = d[:, :k]
        i = np.clip(np.rint((x.mean(axis=1) + reach) / step), 0, cols - 1).astype(int)
        j = np.clip(np.rint(np.sqrt(((x - x.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)) / step), 0, cols - 1)
        choice = rule[k][i * cols + j.astype(int)]
        ends = open_ & (choice < 2)
        seeds[ends], called, open_ = k, called | (ends & (choice == 0)), open_ & ~ends
    return float(seeds.mean()), float(called.mean())


def gated_design(m1: float, first_level: float, delta: float, r: float, later_level: float, rule: np.ndarray,
                 looks: tuple[int, ...] = (2, 3, 4, 5, 6), reps: int = 100_000, seed: int = 3) -> tuple[float, float]:
    """(mean seeds, share called *not worse*) of a design whose first look uses ``rule`` (a monotone
    ``not_worse_bound`` mixture for that look's seeds at ``first_level``) and whose later looks use the hull at
    ``later_level``, in the normal model: per-seed differences N(Δ, 1 + r) in one seed's example SE, margin ``m1``."""
    rng = np.random.default_rng(seed)
    hs = np.concatenate([np.linspace(-3, 8, 221), np.logspace(np.log10(8.2), np.log10(3000), 120)])
    d = delta + rng.standard_normal((reps, max(looks))) * np.sqrt(1 + r)
    n, called, done = np.full(reps, max(looks)), np.zeros(reps, bool), np.zeros(reps, bool)
    cum = rule.cumsum(axis=1) / rule.sum(axis=1, keepdims=True)
    for s in looks:
        x = d[:, :s]
        est, f, m = x.mean(axis=1) * np.sqrt(s), x.var(axis=1, ddof=1), m1 * np.sqrt(s)
        if s == looks[0]:  # the randomised rule: a threshold drawn from the bin's mixture
            u = rng.random(reps)[:, None]
            h = hs[np.minimum((cum[np.searchsorted(EDGES, f) - 1] < u).sum(axis=1), len(hs) - 1)]
        else:
            h = np.maximum(st.norm.isf(later_level), st.t.isf(later_level, s - 1) * np.sqrt(f))
        new = ~done & ((est + m >= h) | (est + m <= -h))
        n[new], called, done = s, called | (new & (est + m >= h)), done | new
    return float(n.mean()), float(called.mean())


def sequential_report(m1: float, max_seeds: int = 10, fixed: int = 5) -> int:
    """Print p*(S) for 1 … max_seeds seeds, the floor on mean seeds per first look, and the gated 2-seed designs."""
    print(f"Margin {m1:.3f} SE of one seed's examples. The most power at Δ = 0 of any valid *not worse* test "
          "(false *not worse* on the margin ≤ 5% at every seed effect r), any region / thresholds:")
    best = {}
    for s in range(1, max_seeds + 1):
        best[s], _ = not_worse_bound(s, m1 * np.sqrt(s))
        mono, _ = not_worse_bound(s, m1 * np.sqrt(s), monotone=True)
        print(f"  {s:2d} seeds: {100 * best[s]:5.1f}% / {100 * mono:5.1f}%")
    print(f"The least mean seeds of any valid design looking after every seed up to {max_seeds} "
          f"(against the fixed {fixed}):")
    for first in (1, 2, 3):
        floor = first + sum(1 - best[s] for s in range(first, max_seeds))
        print(f"  first look at {first}: {floor:.2f} seeds ({100 * floor / fixed:.0f}%)")
    print("The same, all looks at once (the Lagrangian dual over every stopping rule; stops without *not worse* "
          "allowed), *not worse* at Δ = 0 in at least the power asked; the rule that attains it, by 100,000 "
          "simulated runs:")
    for first, power in ((1, FIXED_POWER), (2, FIXED_POWER), (3, FIXED_POWER), (2, 0.95), (2, 0.90)):
        bound, seen, rule = least_mean_seeds(m1, first, max_seeds, power)
        mean, called = play(rule, 0.0, 0.0)
        worst = max(play(rule, -m1, r)[1] for r in (0, 1, 3, 5, 10, 100))
        print(f"  first look at {first}, power ≥ {100 * power:.1f}%: {bound:.2f} seeds ({100 * bound / fixed:.0f}%); "
              f"its rule {mean:.2f} seeds, *not worse* {100 * called:.1f}%, on the margin at most "
              f"{100 * worst:.1f}% (r in 0, 1, 3, 5, 10, 100)")
    print("Designs 2–6: the best rule at 2 seeds, then the hull at the level that keeps false *not worse* ≤ 5% "
          "at r in 0, 0.3, 1, 3, 10, 100 (60,000 replicates each); at Δ = 0, r = 0 (200,000):")
    for first_level in (0.015, 0.025, 0.035):
        p, rule = not_worse_bound(2, m1 * np.sqrt(2), first_level, monotone=True)
        lo, hi = 1e-4, 0.05
        for _ in range(12):  # bisection on a log scale: the largest later level that stays valid on the grid
            mid = float(np.sqrt(lo * hi))
            worst = max(gated_design(m1, first_level, -m1, r, mid, rule, reps=60_000)[1]
                        for r in (0, 0.3, 1, 3, 10, 100))
            lo, hi = (mid, hi) if worst <= 0.05 else (lo, mid)
        mean, called = gated_design(m1, first_level, 0.0, 0.0, lo, rule, reps=200_000)
        print(f"  first look at {100 * first_level:.1f}% (decides {100 * p:.1f}%), later looks at {100 * lo:.2f}%: "
              f"{mean:.2f} seeds ({100 * mean / fixed:.0f}%), *not worse* {100 * called:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
