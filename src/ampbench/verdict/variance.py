"""Variance components of paired differences over seeds × test examples: what the verdict intervals (``stats.py``)
take their example-level variance from, and what the sample-size plans (``plan.py``) predict other designs with.

The model is two-way random effects with one value per cell: d[s, i] = Δ + u_s + v_i + w_si, with u the seed's
effect (how this seed's arm differs from its fp32 beyond its examples), v the example's (an example that flips in
every seed) and w the rest. The mean squares of seeds, examples and residual estimate σ_u², σ_v² and σ_w² by the
method of moments (each truncated at zero). The variance of the mean, σ_u²/S + σ_v²/N + σ_w²/(S·N), has two parts
the data measure with very different precision: the examples' (σ_v²/N + σ_w²/(S·N), estimated by MS_example/(S·N)
on N − 1 degrees of freedom) and the seeds' (on S − 1). The intervals treat them apart (``stats.py`` says why).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Components:
    """Mean squares of an S × N table of paired differences (seeds × examples) and what follows from them."""

    seeds: int
    examples: int
    ms_seed: float  # N · Σ_s (seed mean − grand mean)² / (S − 1); 0 with one seed
    ms_example: float  # S · Σ_i (example mean − grand mean)² / (N − 1)
    ms_residual: float  # what is left, / ((S − 1)(N − 1)); with one seed the per-example variance (= ms_example)
    iid: float  # the variance of the mean were every cell independent: Σ (d − mean)² / (n (n − 1))

    @property
    def seed(self) -> float:
        """σ_u²: the seed-to-seed variance beyond example sampling (0 with one seed: not measured)."""
        return max(0.0, (self.ms_seed - self.ms_residual) / self.examples) if self.seeds > 1 else 0.0

    @property
    def example(self) -> float:
        """σ_v²: the variance of examples' effects shared by every seed (0 with one seed: not separable)."""
        return max(0.0, (self.ms_example - self.ms_residual) / self.seeds) if self.seeds > 1 else 0.0

    @property
    def residual(self) -> float:
        """σ_w²: the variance of a single paired difference beyond the seed and example effects."""
        return self.ms_residual

    @property
    def example_variance(self) -> float:
        """The examples' part of the variance of the mean, MS_example / (S·N): exact when the seeds have no
        effect of their own; its degrees of freedom are N − 1."""
        return self.ms_example / (self.seeds * self.examples)

    @property
    def design_effect(self) -> float:
        """How many times the independent-cells variance the examples' part is (an example that flips in every
        seed is one piece of evidence, not S); never below 1. With no variation at all (no pair differs) nothing
        measures whether the seeds would vary together, so it is the largest it can be, S: the examples, not the
        seed × example cells, are the independent evidence."""
        return max(1.0, self.example_variance / self.iid) if self.iid > 0 else float(self.seeds)

    def predicted(self, seeds: int, examples: int) -> tuple[float, float, float]:
        """(variance of the mean, its examples' part, the variance of one seed's mean) with ``seeds`` seeds and
        ``examples`` test examples, from these components. From one seed the shares of σ_u², σ_v² and σ_w² are
        unknown: all of the per-example variance is taken as σ_w² (it shrinks with seeds and examples alike)."""
        u, v, w = (0.0, 0.0, self.ms_example) if self.seeds == 1 else (self.seed, self.example, self.residual)
        return (u / seeds + v / examples + w / (seeds * examples), v / examples + w / (seeds * examples),
                u + (v + w) / examples)

    def to_dict(self) -> dict:
        return {**asdict(self), "seed_component": self.seed, "example_component": self.example,
                "residual_component": self.residual}

    @classmethod
    def from_dict(cls, d: dict) -> Components:
        return cls(*(d[k] for k in ("seeds", "examples", "ms_seed", "ms_example", "ms_residual", "iid")))


def components(d) -> Components:
    """``Components`` of ``d`` (array-like, seeds × examples; finite)."""
    import numpy as np

    d = np.asarray(d, dtype=np.float64)
    s, n = d.shape
    grand = float(d.mean())
    total = float(((d - grand) ** 2).sum())
    seed_ss = n * float(((d.mean(axis=1) - grand) ** 2).sum())
    example_ss = s * float(((d.mean(axis=0) - grand) ** 2).sum())
    iid = total / (s * n * (s * n - 1)) if s * n > 1 else 0.0
    ms_example = example_ss / (n - 1) if n > 1 else 0.0
    if s == 1:
        return Components(1, n, 0.0, ms_example, ms_example, iid)
    residual_ss = max(0.0, total - seed_ss - example_ss)
    ms_residual = residual_ss / ((s - 1) * (n - 1)) if n > 1 else 0.0
    return Components(s, n, seed_ss / (s - 1), ms_example, ms_residual, iid)
