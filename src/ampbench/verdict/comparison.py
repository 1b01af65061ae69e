"""One arm against the baseline: its per-example outcomes, the paired statistics and verdicts (``stats.py``), and
the tables the evaluate stage writes — comparison.json (what training deterministically produces), speed.json
(timings and memory, which never repeat exactly) and details.json (every number). No torch, files or MLflow here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ampbench.config.arms import BASELINE, TF32_REFERENCE
from ampbench.verdict.decisions import against_noise, differs_from_zero, not_worse, one_sided_level, verdict
from ampbench.verdict.stats import Margins, SeedNoise, paired_ci


def decided_by_loss(task) -> bool:
    """Whether ``task``'s verdict is its loss's (a language model); None: image classification's, accuracy's."""
    return getattr(task, "deciding", "accuracy") == "loss"


@dataclass
class ArmReport:
    """One precision arm as the evaluation saw it: evaluated (``summary`` = means over seeds), or skipped/diverged
    with a reason."""

    arm: str
    skipped_reason: str | None = None
    status: str = "ok"  # ok | skipped (device cannot run it) | diverged (stopped by the guard)
    ablation: bool = False
    summary: dict[str, float] = field(default_factory=dict)
    per_seed: dict[int, dict[str, float]] = field(default_factory=dict)
    histories: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)  # samples_per_s, peak memory, skipped_steps, what ran
    stats: dict[str, Any] = field(default_factory=dict)  # paired CIs and verdicts vs fp32
    speed: dict[str, Any] = field(default_factory=dict)  # the speed stage's row: interleaved samples/s, ratios
    numerics: dict[str, Any] = field(default_factory=dict)  # flops, peak_tflops, first_nonfinite, activations
    quality: dict[str, Any] = field(default_factory=dict)  # time to fp32's quality (quality.arm_quality)
    evaluations: dict[str, list] = field(default_factory=dict)  # seed → validation losses during training

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
        """From the ``task.SeedEvaluation`` of each seed."""
        seeds = sorted(per_seed)
        keys = per_seed[seeds[0]].outcomes
        return cls({k: np.stack([per_seed[s].outcomes[k] for s in seeds]) for k in keys},
                   all(per_seed[s].finite for s in seeds))


def paired_statistics(per_seed: dict[int, dict[str, float]], arm: Outcomes, ref: Outcomes, margins: Margins,
                      noise: SeedNoise, confidence: float, task) -> dict[str, Any]:
    """Intervals of the paired differences and verdicts for one arm against the baseline of the same seeds.

    Accuracy and loss from the per-example outcomes (``task.paired``); agreement, KL and ECE from the per-seed
    values (Student t over seeds, cut to the range each can take). ``verdict`` is the one of the task's deciding
    metric (``accuracy_verdict`` or ``loss_verdict``); its comparison with fp32's seed noise is ``vs_seed_noise``.
    """
    seeds = sorted(per_seed)
    bounds = {"delta_ece_vs_fp32": (-1, 1), "agreement_vs_fp32": (0, 1), "kl_vs_fp32": (0, None)}
    out: dict[str, Any] = {key: paired_ci([per_seed[s][key] for s in seeds], confidence, bounds[key]).to_dict()
                           for key in bounds if key in per_seed[seeds[0]]}
    finite = arm.finite and ref.finite
    acc, loss = task.paired(arm.arrays, ref.arrays, confidence, finite)
    out["delta_accuracy_vs_fp32"], out["delta_loss_vs_fp32"] = acc.to_dict(), loss.to_dict()
    # The verdicts read the interval at 2·confidence − 1, whose ends are one-sided bounds: equivalence as two
    # one-sided tests, non-inferiority ("did anything degrade?") as one.
    acc1, loss1 = task.paired(arm.arrays, ref.arrays, one_sided_level(confidence), finite)
    out["accuracy_verdict"], out["accuracy_verdict_reason"] = verdict(acc1, margins.accuracy, True, " pp", 100,
                                                                      one_sided=True)
    out["loss_verdict"], out["loss_verdict_reason"] = verdict(loss1, margins.loss, False, " nats", digits=4,
                                                              one_sided=True)
    out["accuracy_vs_seed_noise"], noise_text = against_noise(acc, noise.accuracy_floor, " pp", 100)
    out["loss_vs_seed_noise"], loss_noise_text = against_noise(loss, noise.loss_sd, " nats", digits=4)
    if acc.finite:
        flips = (f"{acc.fp32_right_arm_wrong} of {acc.pairs} paired predictions right in fp32 only, "
                 f"{acc.arm_right_fp32_wrong} right in the arm only; " if acc.fp32_right_arm_wrong is not None
                 else "")
        out["accuracy_verdict_reason"] += f" ({flips}the difference is {noise_text})"
        out["loss_verdict_reason"] += f" (the difference is {loss_noise_text})"
    out["accuracy_not_worse"], out["accuracy_not_worse_reason"] = not_worse(acc1, margins.accuracy, True, " pp", 100)
    out["loss_not_worse"], out["loss_not_worse_reason"] = not_worse(loss1, margins.loss, False, " nats", digits=4)
    out["accuracy_bound"], out["loss_bound"] = acc1.ci_low, loss1.ci_high  # the bad side of each
    decided = "loss" if decided_by_loss(task) else "accuracy"
    out["verdict"], out["verdict_reason"] = out[f"{decided}_verdict"], out[f"{decided}_verdict_reason"]
    out["not_worse"], out["not_worse_reason"] = out[f"{decided}_not_worse"], out[f"{decided}_not_worse_reason"]
    out["vs_seed_noise"] = out[f"{decided}_vs_seed_noise"]
    out["differs_from_fp32"] = differs_from_zero(acc if decided == "accuracy" else loss)
    out["plans"] = _plans(acc if decided == "accuracy" else loss, out, margins, confidence, decided)
    return out


def _plans(s, out: dict[str, Any], margins: Margins, confidence: float, decided: str) -> list[dict[str, Any]]:
    """Sample-size plans (``plan.py``) for the deciding metric's verdicts that came out inconclusive."""
    from ampbench.verdict.plan import Design, plans
    from ampbench.verdict.variance import Components

    undecided = [q for q, key in (("not worse", "not_worse"), ("equivalent", "verdict")) if out[key] == "inconclusive"]
    if not undecided or not s.finite or s.components is None:
        return []
    discrete = decided == "accuracy" and s.fp32_right_arm_wrong is not None
    discordance = (s.arm_right_fp32_wrong + s.fp32_right_arm_wrong) / s.pairs if discrete else None
    margin = margins.accuracy if decided == "accuracy" else margins.loss
    design = Design(Components.from_dict(s.components), discordance, margin, confidence, decided == "accuracy")
    return [p.to_dict() for p in plans(design, undecided, s.mean)]


def tables(reports: list[ArmReport], noise: SeedNoise, margins: Margins,
           task=None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(comparison.json, speed.json, details.json) in full; ``shown`` cuts the first two to their DVC columns.

    comparison holds what training deterministically produces (verdicts, Δ with CI, agreement, …), so a fresh
    clone's `dvc repro` reproduces it exactly on CPU; speed holds the timings and memory, which never repeat
    exactly; details.json has every number, per arm and per seed.
    """
    by_arm = {r.arm: r for r in reports}
    base = by_arm[BASELINE]
    tf32 = by_arm.get(TF32_REFERENCE) if by_arm.get(TF32_REFERENCE) and by_arm[TF32_REFERENCE].ran else None
    comparison: dict[str, Any] = {}
    speed: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for r in reports:
        if not r.ran:
            comparison[r.arm] = {"status": r.status, "verdict": r.status, "ablation": r.ablation,
                                 "reason": r.skipped_reason}
            details[r.arm] = {**comparison[r.arm], "numerics": r.numerics}
            continue
        row, timing = comparison_row(r, noise, margins, task), timing_row(r, base, tf32)
        comparison[r.arm] = {k: v for k, v in row.items() if v is not None}
        speed[r.arm] = {k: v for k, v in timing.items() if v is not None}
        details[r.arm] = {**row, **timing, "statistics": r.stats, "mean_and_std": r.summary, "per_seed": r.per_seed,
                          "train": r.train, "numerics": r.numerics, "time_to_fp32_quality": r.quality}
    return comparison, speed, details


def comparison_row(r: ArmReport, noise: SeedNoise, margins: Margins, task=None) -> dict[str, Any]:
    """An evaluated arm's deterministic numbers: verdicts, Δ with CI, agreement, KL, ECE (classification) or
    perplexity (language model), steps, FLOP share; for the baseline its seed noise and the margins in use
    instead of an interval against itself."""
    st, s, t = r.stats, r.summary, r.train
    acc, loss = st["delta_accuracy_vs_fp32"], st["delta_loss_vs_fp32"]
    base = r.arm == BASELINE
    row = {"status": "ok", "ablation": r.ablation, "verdict": "baseline" if base else st["verdict"],
           "loss_verdict": "baseline" if base else st["loss_verdict"],
           "not_worse": "baseline" if base else st["not_worse"],
           "loss_not_worse": "baseline" if base else st["loss_not_worse"], "seeds": acc["n"],
           "test_accuracy": round(s["test_accuracy"], 6), "delta_accuracy_pp": _pp(acc["mean"]),
           "delta_accuracy_pp_ci_low": None if base else _pp(acc["ci_low"]),
           "delta_accuracy_pp_ci_high": None if base else _pp(acc["ci_high"]),
           "delta_accuracy_pp_bound": None if base else _pp(st["accuracy_bound"]),  # one-sided, the lower
           "test_loss": round(s["test_loss"], 6), "delta_loss": _round(loss["mean"]),
           "delta_loss_ci_low": None if base else _round(loss["ci_low"]),
           "delta_loss_ci_high": None if base else _round(loss["ci_high"]),
           "delta_loss_bound": None if base else _round(st["loss_bound"]),  # one-sided, the upper
           "agreement_vs_fp32": round(s["agreement_vs_fp32"], 6), "kl_vs_fp32": round(s["kl_vs_fp32"], 8),
           "max_abs_logit_diff_vs_fp32": round(s["max_abs_logit_diff_vs_fp32"], 6),
           "ece": _round(s.get("test_ece")), "delta_ece": _round(s.get("delta_ece_vs_fp32")),
           "skipped_steps": t["skipped_steps"], "optimizer_steps": t.get("optimizer_steps"),
           "plans": None if base else (st.get("plans") or None),
           "steps_to_fp32_quality_vs_fp32": _round(r.quality.get("steps_vs_fp32"), 4),
           "seeds_reaching_fp32_quality": r.quality.get("seeds_reached") if r.quality.get("seeds") else None}
    if decided_by_loss(task):  # a language model: the loss verdict decides
        row["accuracy_verdict"] = "baseline" if base else st["accuracy_verdict"]
        row["accuracy_not_worse"] = "baseline" if base else st["accuracy_not_worse"]
        row["perplexity"] = round(math.exp(s["test_loss"]), 4) if math.isfinite(s["test_loss"]) else None
    if t.get("state_bytes"):  # counted tensor by tensor: weights, gradients and optimizer state
        row["state_bytes_per_parameter"] = _round(t["state_bytes"]["per_parameter"], 4)
    flops = r.numerics.get("flops")
    if flops:  # counted, so deterministic: it belongs with the comparison, not the timings
        row["low_precision_flop_share"] = round(flops["low_precision_share"], 6)
    if base:  # the noise floor and the margins in use, once
        row.update({"fp32_seed_sd_accuracy_pp": _pp(noise.accuracy_sd), "fp32_seed_sd_loss": _round(noise.loss_sd),
                    "fp32_seed_disagreement": _round(noise.disagreement),
                    "margin_accuracy_pp": _pp(margins.accuracy), "margin_loss": _round(margins.loss)})
    else:
        row.update({"vs_seed_noise": st["vs_seed_noise"], "differs_from_fp32": st["differs_from_fp32"],
                    "paired_examples": acc["pairs"], "fp32_right_arm_wrong": acc["fp32_right_arm_wrong"],
                    "arm_right_fp32_wrong": acc["arm_right_fp32_wrong"],
                    "design_effect": _round(acc["design_effect"], 4)})
    return row


def timing_row(r: ArmReport, base: ArmReport, tf32: ArmReport | None) -> dict[str, Any]:
    """An evaluated arm's throughput, memory and input wait, as ratios to fp32 (and tf32 when it ran); achieved
    FLOP/s from the counted FLOPs, and its share of the GPU's peak when the GPU is known.

    Speed comes from the speed stage (``r.speed``: every arm in one process, interleaved, with an interval over
    rounds) when it ran; training-time throughput, each arm timed in its own process at its own time, stays as the
    secondary ``train_*`` figures (and is all there is without the speed stage). Memory: each arm alone on CUDA;
    on a CPU the training process's peak RSS."""
    t, flops, sp = r.train, r.numerics.get("flops"), r.speed
    own = sp.get("samples_per_s") if sp else t["samples_per_s"]
    ci = sp.get("speedup_vs_fp32_ci") or (None, None)
    mem, base_mem = (sp.get("peak_memory_mb") or t["peak_memory_mb"],
                     base.speed.get("peak_memory_mb") or base.train["peak_memory_mb"])
    timing = {
        "samples_per_s": None if own is None else round(own, 1),
        "speedup_vs_fp32": (1.0 if r.arm == BASELINE else _round(sp.get("speedup_vs_fp32"), 4)) if sp
        else _ratio(t["samples_per_s"], base.train["samples_per_s"]),
        "speedup_vs_fp32_ci_low": _round(ci[0], 4), "speedup_vs_fp32_ci_high": _round(ci[1], 4),
        "speed_unstable": sp.get("unstable"), "speed_source": "interleaved" if sp else "training",
        "train_samples_per_s": round(t["samples_per_s"], 1),
        "train_speedup_vs_fp32": _ratio(t["samples_per_s"], base.train["samples_per_s"]),
        "peak_memory_mb": round(mem, 1), "memory_vs_fp32": _ratio(mem, base_mem),
        "input_wait_share": _round(t.get("input_wait_share"), 4),
        # Steps to fp32's quality × the speed stage's time per step, as a ratio to fp32's (quality.py).
        "time_to_fp32_quality_vs_fp32": _round(r.quality.get("time_vs_fp32"), 4),
        "train_time_to_fp32_quality_vs_fp32": _round(r.quality.get("train_time_vs_fp32"), 4),
    }
    if flops and own:  # achieved FLOP/s: counted FLOPs per sample × samples/s; against the GPU's peak when known
        timing["achieved_tflops"] = round(flops["per_sample"] * own / 1e12, 6)
        if r.numerics.get("peak_tflops"):
            timing["peak_share"] = round(timing["achieved_tflops"] / r.numerics["peak_tflops"], 6)
    if tf32 is not None:
        if sp:
            timing["speedup_vs_tf32"] = 1.0 if r.arm == TF32_REFERENCE else _round(sp.get("speedup_vs_tf32"), 4)
        else:
            timing["speedup_vs_tf32"] = _ratio(t["samples_per_s"], tf32.train["samples_per_s"])
        timing["memory_vs_tf32"] = _ratio(mem, tf32.speed.get("peak_memory_mb") or tf32.train["peak_memory_mb"])
    return timing


def _pp(fraction: float | None) -> float | None:
    """A fraction as percentage points, rounded for the metrics files."""
    return None if fraction is None else round(100 * fraction, 4)


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


# What the DVC metrics files keep per arm: `dvc exp show` draws one column per value, so a handful (≈ 20 for the
# four main arms) that answer "may I switch?"; every other number is in details.json and the MLflow parent run.
SHOWN = ("not_worse", "verdict", "delta_accuracy_pp", "delta_accuracy_pp_bound")  # the bound: one-sided, the lower
SHOWN_BASELINE = ("verdict", "test_accuracy", "margin_accuracy_pp")
# A language model's verdict is its loss's: nats per token, and the perplexity they mean.
SHOWN_LOSS = ("not_worse", "verdict", "delta_loss", "delta_loss_bound")
SHOWN_LOSS_BASELINE = ("verdict", "test_loss", "perplexity", "margin_loss")
SPEED_SHOWN = ("speedup_vs_fp32", "memory_vs_fp32")


def shown(comparison: dict[str, Any], speed: dict[str, Any], task=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The slim comparison.json and speed.json: the columns above, plus skipped optimizer steps where the scaler
    skipped any; fp32's own throughput instead of ratios to itself."""
    by_loss = decided_by_loss(task)
    slim, fast = {}, {}
    for arm, row in comparison.items():
        if arm == BASELINE:
            keys = SHOWN_LOSS_BASELINE if by_loss else SHOWN_BASELINE
        else:
            keys = SHOWN_LOSS if by_loss else SHOWN
        slim[arm] = {k: row[k] for k in keys if row.get(k) is not None}
        if row.get("skipped_steps"):
            slim[arm]["skipped_steps"] = row["skipped_steps"]
    for arm, row in speed.items():
        keys = ("samples_per_s",) if arm == BASELINE else SPEED_SHOWN
        fast[arm] = {k: row[k] for k in keys if row.get(k) is not None}
    return slim, fast
