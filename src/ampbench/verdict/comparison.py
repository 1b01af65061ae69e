"""One arm against the baseline, typed: what the evaluation knows of an arm (``ArmReport``: its summary.json as the
train stage wrote it, its test metrics, paired statistics, speed, numerics and time to fp32's quality), its
per-example outcomes, and the paired statistics and verdicts of each metric (``PairedStatistics``, from
``stats.py`` and ``decisions.py``). ``tables.py`` turns them into the files. No torch, files or MLflow here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ampbench.config.records import ArmSpeed, ArmSummary
from ampbench.verdict.decisions import against_noise, differs_from_zero, not_worse, verdict
from ampbench.verdict.quality import ArmQuality
from ampbench.verdict.stats import Margins, PairedSummary, SeedNoise, paired_ci


@dataclass(frozen=True)
class Numerics:
    """An arm's numerics from its summary.json: FLOPs by dtype of one counted step, the GPU's dense peak for the
    dtype most FLOPs ran in (None on CPUs and unknown GPUs), the first non-finite module per seed, the activation
    table (closest to fp16's top first)."""

    flops: dict[str, Any] | None = None
    peak_tflops: float | None = None
    first_nonfinite: dict[str, dict[str, Any]] = field(default_factory=dict)
    activations: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, s: ArmSummary) -> Numerics:
        from ampbench.runtime.hardware import peak_tflops

        peak = peak_tflops(s.hardware.device_name, s.flops["dominant_dtype"]) if s.flops else None
        return cls(s.flops, peak, s.first_nonfinite, s.activations)


@dataclass(frozen=True)
class Verdicts:
    """One metric of an arm against the baseline: the paired interval (two-sided, at the confidence), the one-sided
    bound on its bad side (accuracy's lower, loss's upper), and what they decide, each with its reason."""

    interval: PairedSummary
    bound: float | None
    verdict: str  # equivalent | worse | better | inconclusive | invalid
    verdict_reason: str
    not_worse: str  # not worse | worse | inconclusive | invalid
    not_worse_reason: str
    vs_seed_noise: str  # how the difference compares with fp32's own seed-to-seed variation


@dataclass(frozen=True)
class PairedStatistics:
    """Both metrics' verdicts, which of them decides (``Task.deciding``), the per-seed intervals of agreement, KL
    and ECE, whether the deciding difference is distinguishable from zero, and its sample-size plans."""

    accuracy: Verdicts
    loss: Verdicts
    deciding: str  # accuracy | loss
    per_seed: dict[str, PairedSummary]  # agreement_vs_fp32, kl_vs_fp32, delta_ece_vs_fp32 (Student t over seeds)
    differs_from_fp32: bool  # the interval excludes 0
    plans: list[dict[str, Any]]  # plan.Plan.to_dict for each undecided verdict

    @property
    def decided(self) -> Verdicts:
        """The deciding metric's verdicts: the arm's."""
        return self.of(self.deciding)

    def of(self, metric: str) -> Verdicts:
        return {"accuracy": self.accuracy, "loss": self.loss}[metric]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # details.json's "statistics"


@dataclass
class ArmReport:
    """One precision arm as the evaluation saw it: its summary.json (``trained``), and once evaluated its test
    metrics (per seed, and means and std over seeds), histories, paired statistics, speed and numerics."""

    trained: ArmSummary
    metrics: dict[str, float] = field(default_factory=dict)  # means and std over seeds (metrics.summarise_seeds)
    per_seed: dict[int, dict[str, float]] = field(default_factory=dict)
    histories: dict[int, list[dict[str, float | None]]] = field(default_factory=dict)
    stats: PairedStatistics | None = None  # the baseline's are against itself
    speed: ArmSpeed | None = None  # the speed stage's row, with the arm's isolated peak memory
    numerics: Numerics = field(default_factory=Numerics)
    quality: ArmQuality | None = None  # time to fp32's quality (quality.arm_quality)
    evaluations: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # seed → validation losses

    @property
    def arm(self) -> str:
        return self.trained.arm

    @property
    def ablation(self) -> bool:
        return self.trained.ablation

    @property
    def status(self) -> str:
        """ok | skipped (the device cannot run it) | diverged (stopped by the guard)."""
        return "skipped" if self.trained.skipped else "diverged" if self.trained.diverged else "ok"

    @property
    def skipped_reason(self) -> str | None:
        """Why it has no result (None: it ran)."""
        t = self.trained
        return t.skipped or ("; ".join(f"seed {k}: {v}" for k, v in t.diverged.items()) if t.diverged else None)

    @property
    def ran(self) -> bool:
        return self.skipped_reason is None


@dataclass(frozen=True)
class Outcomes:
    """One arm's per-example test outcomes, seeds × examples (the same examples in the same order for every arm):
    what ``Task.evaluate`` gives per seed (e.g. correct and loss per image, or accuracy and loss per sequence)."""

    arrays: dict[str, np.ndarray]
    finite: bool  # every logit finite

    @classmethod
    def stack(cls, per_seed: dict) -> Outcomes:
        """From the ``tasks.contract.SeedEvaluation`` of each seed."""
        seeds = sorted(per_seed)
        keys = per_seed[seeds[0]].outcomes
        return cls({k: np.stack([per_seed[s].outcomes[k] for s in seeds]) for k in keys},
                   all(per_seed[s].finite for s in seeds))


def paired_statistics(per_seed: dict[int, dict[str, float]], two_sided: tuple[PairedSummary, PairedSummary],
                      one_sided: tuple[PairedSummary, PairedSummary], margins: Margins, noise: SeedNoise,
                      confidence: float, deciding: str) -> PairedStatistics:
    """Verdicts for one arm against the baseline of the same seeds, from the (accuracy, loss) intervals of its
    per-example outcomes (``Task.paired``) at ``confidence`` (``two_sided``) and at ``one_sided_level(confidence)``
    (``one_sided``: their ends are one-sided bounds, so equivalence is two one-sided tests and non-inferiority —
    "did anything degrade?" — one); agreement, KL and ECE from the per-seed values (Student t over seeds, cut to
    the range each can take)."""
    seeds = sorted(per_seed)
    bounds = {"delta_ece_vs_fp32": (-1, 1), "agreement_vs_fp32": (0, 1), "kl_vs_fp32": (0, None)}
    per_seed_ci = {key: paired_ci([per_seed[s][key] for s in seeds], confidence, bounds[key])
                   for key in bounds if key in per_seed[seeds[0]]}
    (acc, loss), (acc1, loss1) = two_sided, one_sided
    flips = (f"{acc.fp32_right_arm_wrong} of {acc.pairs} paired predictions right in fp32 only, "
             f"{acc.arm_right_fp32_wrong} right in the arm only; " if acc.fp32_right_arm_wrong is not None else "")
    accuracy = _verdicts(acc, acc1, margins.accuracy, True, noise.accuracy_floor, flips, unit=" pp", scale=100)
    loss_v = _verdicts(loss, loss1, margins.loss, False, noise.loss_sd, "", unit=" nats", digits=4)
    s, v = (loss, loss_v) if deciding == "loss" else (acc, accuracy)
    return PairedStatistics(accuracy, loss_v, deciding, per_seed_ci, differs_from_zero(s),
                            _plans(s, v, margins, confidence, deciding))


def _verdicts(s: PairedSummary, s1: PairedSummary, margin: float, higher_is_better: bool, floor: float | None,
              flips: str, **fmt: Any) -> Verdicts:
    """One metric's verdicts; ``flips``: the discordant pairs in words (accuracy), ``fmt``: how the reasons print
    the metric (unit, scale, digits)."""
    equivalent, why = verdict(s1, margin, higher_is_better, one_sided=True, **fmt)
    nw, nw_why = not_worse(s1, margin, higher_is_better, **fmt)
    noise, noise_text = against_noise(s, floor, **fmt)
    if s.finite:
        why += f" ({flips}the difference is {noise_text})"
    return Verdicts(s, s1.ci_low if higher_is_better else s1.ci_high, equivalent, why, nw, nw_why, noise)


def _plans(s: PairedSummary, v: Verdicts, margins: Margins, confidence: float, decided: str) -> list[dict[str, Any]]:
    """Sample-size plans (``plan.py``) for the deciding metric's verdicts that came out inconclusive."""
    from ampbench.verdict.plan import Design, plans
    from ampbench.verdict.variance import Components

    undecided = [q for q, label in (("not worse", v.not_worse), ("equivalent", v.verdict)) if label == "inconclusive"]
    if not undecided or not s.finite or s.components is None:
        return []
    discrete = decided == "accuracy" and s.fp32_right_arm_wrong is not None
    discordance = (s.arm_right_fp32_wrong + s.fp32_right_arm_wrong) / s.pairs if discrete else None
    margin = margins.accuracy if decided == "accuracy" else margins.loss
    design = Design(Components.from_dict(s.components), discordance, margin, confidence, decided == "accuracy")
    return [p.to_dict() for p in plans(design, undecided, s.mean)]
