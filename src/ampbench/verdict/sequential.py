"""Seeds until decided: a group-sequential design over the verdicts' hull/TOST bounds.

A fixed design trains every seed before it looks. A sequential one looks after each added seed, from
``min_seeds`` to ``max_seeds``, and stops once every arm's deciding verdicts are decided. Looking many times and
stopping at the first look that decides would call a difference on the margin *not worse* far more often than
5% if every look used the fixed design's bounds. So each look uses a stricter nominal level, from an alpha-spending
function (Lan & DeMets 1983): ``alpha(t)`` is the error allowed to have been spent by information fraction
``t = seeds / max_seeds``, and look k's critical value is set so that the chance of a first crossing there, under
the margin, is ``alpha(t_k) − alpha(t_{k−1})``. The chances come from the canonical joint distribution of
sequential statistics (Brownian motion at times t_k; Jennison & Turnbull 2000, ch. 19), integrated numerically on
a grid, so these nominal levels are exact for a normal statistic (the examples' interval); the seeds' Student-t
interval has levels of its own (below). ``scripts/verdict_simulation.py`` checks the whole procedure's false
decisions, coverage, power and expected seeds.

- ``obrien_fleming``: ``2 − 2Φ(z_{1−α/2} / √t)``: almost nothing at early looks, nearly the full alpha at the
  last, so a run that goes to ``max_seeds`` loses little power against a fixed design.
- ``pocock``: ``α · ln(1 + (e − 1) t)``: evenly spread; earlier stops, a stricter last look.

The intervals at every look are repeated confidence bounds: they hold at all looks at once, so the verdict of
the look at which an arm decided stays valid whatever happens at later looks. The nominal levels are exact for a
normal statistic, so they are what the examples' interval uses. The Student-t interval over seeds is not such a
statistic: its variance estimate has few degrees of freedom and is shared from look to look, and at the nominal
levels it crossed in 5.4–5.9% at 5%. Its levels are calibrated for the t statistic itself (``t_levels``): under
normal per-seed differences on the margin, the joint law of the looks' t statistics does not depend on the seeds'
variance, so levels found on simulated paths of it are exact whatever that variance is, up to the simulation's
error (stated there). The hull takes each interval at its own level. No torch, files or MLflow here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from ampbench.verdict.stats import Confidence

SPENDING = ("obrien_fleming", "pocock")
UNTIL = ("not_worse", "equivalent")  # which of the deciding metric's verdicts must be decided before stopping
UNDECIDED = ("inconclusive",)


def spent(spending: str, alpha: float, t: float) -> float:
    """Cumulative one-sided error allowed by information fraction ``t`` (0 < t ≤ 1; ``alpha`` at t = 1)."""
    from scipy import stats as st

    if spending == "obrien_fleming":
        return float(2 * st.norm.sf(st.norm.isf(alpha / 2) / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"spending {spending!r}: one of {', '.join(SPENDING)}")


@lru_cache(maxsize=64)
def nominal_levels(fractions: tuple[float, ...], increments: tuple[float, ...]) -> tuple[float, ...]:
    """One-sided nominal level of each look (1 − Φ(c_k)) such that a standard sequential statistic
    (Z_k = W(t_k)/√t_k, W Brownian motion) first exceeds c_k at look k with chance ``increments[k]``.

    The density of W on the continuation region is carried from look to look on a grid and convolved with the
    normal increment (trapezoid rule, 1,201 points): the levels agree with a 4,001-point grid to 1e-5 of their size.
    """
    import numpy as np
    from scipy import optimize
    from scipy import stats as st

    levels: list[float] = []
    grid = weights = density = None  # W on the continuation region of the previous look
    previous = 0.0
    for t, inc in zip(fractions, increments, strict=True):
        if inc <= 0:
            raise ValueError("every look needs some error to spend (an increasing spending function)")
        if grid is None:
            c = float(st.norm.isf(inc))
        else:
            sd = math.sqrt(t - previous)

            mass = weights * density  # of W at the previous look, on its continuation region

            def crossing(c_: float, t: float = t, sd: float = sd, inc: float = inc, grid=grid, mass=mass) -> float:
                return float(np.sum(mass * st.norm.sf((c_ * math.sqrt(t) - grid) / sd))) - inc

            c = float(optimize.brentq(crossing, -10.0, 40.0, xtol=1e-10))
        levels.append(float(st.norm.sf(c)))
        upper = c * math.sqrt(t)
        new_grid = np.linspace(min(-10.0, upper - 1.0), upper, 1201)
        new_weights = np.full(new_grid.size, new_grid[1] - new_grid[0])
        new_weights[[0, -1]] /= 2
        if grid is None:
            density = st.norm.pdf(new_grid, scale=math.sqrt(t))
        else:
            sd = math.sqrt(t - previous)
            kernel = st.norm.pdf((new_grid[:, None] - grid[None, :]) / sd) / sd
            density = kernel @ (weights * density)
        grid, weights, previous = new_grid, new_weights, t
    return tuple(levels)


T_PATHS = 400_000  # paths of the t statistic per design: one binomial sd of a 5% total is 0.034 points
T_SEED = 20261207  # fixed: the levels of a design are the same in every run, on every machine


@lru_cache(maxsize=64)
def t_levels(counts: tuple[int, ...], increments: tuple[float, ...]) -> tuple[float, ...]:
    """One-sided level of each look's Student-t interval over seeds, ``t.sf(c_k, n_k − 1)``, such that the t
    statistic of normal per-seed differences centred on the margin, T_k = √n_k · mean_k / s_k over the first n_k =
    ``counts[k]`` seeds, first exceeds c_k at look k with chance ``increments[k]``.

    T is a ratio in which the seeds' scale cancels, so the law of (T_1, …, T_K), and with it the levels, is the
    same whatever the seeds' variance; it is not that of a normal statistic, as the looks share their seeds and
    their variance estimates. The first look's c_1 is Student's t quantile. The later ones come from ``T_PATHS``
    seeded paths: c_k is the value that exactly ``increments[k] · T_PATHS`` of the paths not stopped before
    exceed. Their total chance of a crossing, under the true law, is then within about ±0.034 points of 5% (one
    binomial sd), far below the 0.4–0.9 points the normal levels are off by here."""
    import numpy as np
    from scipy import stats as st

    if any(b <= a for a, b in zip(counts, counts[1:], strict=False)) or counts[0] < 2:
        raise ValueError(f"looks at increasing seed counts from 2, got {counts}")
    rng = np.random.default_rng(T_SEED)
    total = np.zeros(T_PATHS)
    squares = np.zeros(T_PATHS)
    alive = np.ones(T_PATHS, dtype=bool)
    levels: list[float] = []
    n = 0
    for count, inc in zip(counts, increments, strict=True):
        if inc <= 0:
            raise ValueError("every look needs some error to spend (an increasing spending function)")
        while n < count:  # one seed at a time: memory stays at a few columns whatever max_seeds is
            x = rng.standard_normal(T_PATHS)
            total += x
            squares += x * x
            n += 1
        mean = total / n
        t = mean / np.sqrt(np.maximum(squares - n * mean * mean, 0.0) / (n - 1) / n)
        crossing = int(round(inc * T_PATHS))
        if not levels:  # the first look alone: T_1 is Student's t, its quantile exact
            c = float(st.t.isf(inc, count - 1))
        elif crossing < 1:  # less than one path's worth of error at this look: it spends none
            levels.append(0.0)
            continue
        else:
            top = -np.partition(-t[alive], (crossing - 1, crossing))  # the crossing-th and next largest in place
            c = float((top[crossing - 1] + top[crossing]) / 2)  # exactly ``crossing`` paths above it
        alive &= t <= c
        levels.append(float(st.t.sf(c, count - 1)))
    return tuple(levels)


@dataclass(frozen=True)
class Look:
    """One look of a design: how many seeds, and the two confidence levels its intervals are computed at."""

    index: int  # 1-based
    seeds: int
    decide_confidence: float  # two-sided level whose ends are this look's one-sided decision bounds
    report_confidence: float  # two-sided level of the interval the report shows at this look
    # The same two for the Student-t interval over seeds (``t_levels``); the two above are the examples' interval's.
    seed_decide_confidence: float
    seed_report_confidence: float

    def levels(self) -> tuple[Confidence, Confidence]:
        """(report, decide) confidence, each with the level of its interval over seeds."""
        return (Confidence(self.report_confidence, self.seed_report_confidence),
                Confidence(self.decide_confidence, self.seed_decide_confidence))


@dataclass(frozen=True)
class Design:
    """A look after every added seed from ``min_seeds`` to ``max_seeds``; ``confidence`` as in the fixed design
    (0.95: one-sided decisions at 5% in all, the reported interval 95% in all); ``until``: the verdicts that must
    be decided before stopping."""

    min_seeds: int
    max_seeds: int
    spending: str = "pocock"
    confidence: float = 0.95
    until: str = "not_worse"

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence between 0.5 and 1, got {self.confidence}")
        if not 2 <= self.min_seeds <= self.max_seeds:
            raise ValueError(f"need 2 ≤ min_seeds ≤ max_seeds, got {self.min_seeds} and {self.max_seeds}")
        if self.spending not in SPENDING or self.until not in UNTIL:
            raise ValueError(f"spending one of {SPENDING}, until one of {UNTIL}")

    @property
    def seed_counts(self) -> list[int]:
        return list(range(self.min_seeds, self.max_seeds + 1))

    def looks(self) -> list[Look]:
        """Every planned look, with the levels the spending function gives it."""
        counts = self.seed_counts
        fractions = tuple(s / self.max_seeds for s in counts)
        alpha = 1 - self.confidence  # one-sided error of the decisions; the report's interval spends half a side

        def increments(a: float) -> tuple[float, ...]:
            cumulative = [spent(self.spending, a, t) for t in fractions]
            return tuple(round(x - y, 15) for x, y in zip(cumulative, [0.0] + cumulative[:-1], strict=True))

        decide, report = increments(alpha), increments(alpha / 2)
        rows = zip(counts, nominal_levels(fractions, decide), nominal_levels(fractions, report),
                   t_levels(tuple(counts), decide), t_levels(tuple(counts), report), strict=True)
        return [Look(i + 1, s, 1 - 2 * d, 1 - 2 * r, 1 - 2 * td, 1 - 2 * tr)
                for i, (s, d, r, td, tr) in enumerate(rows)]

    def look(self, seeds: int) -> Look:
        """The look at ``seeds`` seeds (ValueError outside the design)."""
        for lk in self.looks():
            if lk.seeds == seeds:
                return lk
        raise ValueError(f"{seeds} seeds is not a look of a design from {self.min_seeds} to {self.max_seeds}")

    def decided(self, not_worse: str, equivalence: str) -> bool:
        """Whether an arm's deciding verdicts at a look settle it (``until``: not worse alone, or equivalence too).
        ``invalid`` (a value not finite) settles it too: more seeds do not make an overflowing arm's values finite."""
        needed = [not_worse] + ([equivalence] if self.until == "equivalent" else [])
        return all(v not in UNDECIDED for v in needed)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    """Where a sequential comparison stands after the looks so far: per arm the look that decided it (None: not
    yet), whether the procedure stops, and why, in words."""

    look: Look  # the latest look (the seeds that ran)
    planned: int  # looks in the design
    decided_at: dict[str, int | None]  # arm → seeds at its deciding look
    stopped: bool
    reason: str

    def to_dict(self, design: Design) -> dict:
        return {"design": design.to_dict(), "look": self.look.index, "looks": self.planned,
                "seeds": self.look.seeds, "stopped": self.stopped, "reason": self.reason,
                "decided_at_seeds": self.decided_at,
                "levels": [{"seeds": lk.seeds, "one_sided_level": round((1 - lk.decide_confidence) / 2, 8),
                            "report_confidence": round(lk.report_confidence, 8),
                            "seeds_one_sided_level": round((1 - lk.seed_decide_confidence) / 2, 8),
                            "seeds_report_confidence": round(lk.seed_report_confidence, 8)}
                           for lk in design.looks()]}


def outcome(design: Design, seeds: int, decided_at: dict[str, int | None]) -> Outcome:
    """The stop decision after the look at ``seeds`` seeds, given the look at which each arm decided."""
    look, looks = design.look(seeds), design.looks()
    open_ = sorted(arm for arm, at in decided_at.items() if at is None)
    where = f"look {look.index} of {len(looks)} ({seeds} seeds)"
    if not decided_at:
        return Outcome(look, len(looks), decided_at, True, f"{where}: no arm besides the baseline to decide")
    if not open_:
        last = max((at for at in decided_at.values() if at is not None), default=seeds)
        n = design.max_seeds - last
        early = f"; stopped {n} seed{'s' * (n != 1)} before the maximum of {design.max_seeds}" if n else ""
        past = (f" (every arm had decided at {last} seeds: the seeds after are not in the verdicts)"
                if last < seeds else "")
        return Outcome(look, len(looks), decided_at, True, f"{where}: every arm decided{past}{early}")
    if seeds >= design.max_seeds:
        return Outcome(look, len(looks), decided_at, True,
                       f"{where}: the maximum of {design.max_seeds} seeds reached; undecided: {', '.join(open_)}")
    return Outcome(look, len(looks), decided_at, False,
                   f"{where}: undecided: {', '.join(open_)}; the next look adds a seed ({seeds + 1} of at most "
                   f"{design.max_seeds})")


@dataclass(frozen=True)
class Looks:
    """A sequential comparison as the evaluate stage reports it: the design and where it stands."""

    design: Design
    outcome: Outcome

    def to_dict(self) -> dict:
        """details.json's ``sequential``."""
        return self.outcome.to_dict(self.design)

    def tags(self) -> dict[str, str]:
        """The MLflow parent run's tags: which look, whether it stopped and why, and the group every look of one
        design shares (``sequential.group``, set by the caller from the params without the seeds)."""
        o = self.outcome
        return {"sequential.look": f"{o.look.index} of {o.planned}", "sequential.seeds": str(o.look.seeds),
                "sequential.stopped": str(o.stopped).lower(), "sequential.reason": o.reason,
                # the one-sided levels this look's decisions used: the examples' interval and the seeds' t interval
                "sequential.level_examples": f"{(1 - o.look.decide_confidence) / 2:.6f}",
                "sequential.level_seeds": f"{(1 - o.look.seed_decide_confidence) / 2:.6f}"}
