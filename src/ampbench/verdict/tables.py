"""The three tables the evaluate stage writes, from the typed ``comparison.ArmReport`` of each arm: comparison.json
(what training deterministically produces), speed.json (timings and memory, which never repeat exactly) and
details.json (every number), each cut by ``shown`` to the columns ``dvc exp show`` draws. The keys of
comparison.json and speed.json are users' ``dvc exp show`` columns: they stay as they are. No torch, files or
MLflow here.
"""

from __future__ import annotations

import math
from typing import Any

from ampbench.config.arms import BASELINE, TF32_REFERENCE
from ampbench.runtime import memory
from ampbench.verdict.comparison import ArmReport
from ampbench.verdict.sequential import Looks
from ampbench.verdict.stats import Margins, SeedNoise

# The summary.json fields details.json repeats under "train": what ran and how fast it trained.
TRAIN_FIELDS = ("samples_per_s", "peak_memory_mb", "skipped_steps", "optimizer_steps", "input_path",
                "input_wait_share", "policy", "optimizer", "state_bytes", "float8")


def tables(reports: list[ArmReport], noise: SeedNoise, margins: Margins, deciding: str,
           looks: Looks | None = None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(comparison.json, speed.json, details.json) in full; ``shown`` cuts the first two to their DVC columns.
    A sequential comparison (``looks``) adds each arm's ``decided_at_seeds`` and details.json's ``sequential``.

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
        numerics = {"flops": r.numerics.flops, "peak_tflops": r.numerics.peak_tflops,
                    "first_nonfinite": r.numerics.first_nonfinite, "activations": r.numerics.activations}
        if not r.ran:
            comparison[r.arm] = {"status": r.status, "verdict": r.status, "ablation": r.ablation,
                                 "reason": r.skipped_reason}
            details[r.arm] = {**comparison[r.arm], "numerics": numerics}
            continue
        row, timing = comparison_row(r, noise, margins, deciding), timing_row(r, base, tf32)
        comparison[r.arm] = {k: v for k, v in row.items() if v is not None}
        speed[r.arm] = {k: v for k, v in timing.items() if v is not None}
        details[r.arm] = {**row, **timing, "statistics": r.stats.to_dict(), "mean_and_std": r.metrics,
                          "per_seed": r.per_seed, "train": {k: getattr(r.trained, k) for k in TRAIN_FIELDS},
                          "numerics": numerics, "time_to_fp32_quality": r.quality.to_dict() if r.quality else {}}
    if looks:
        for arm, at in looks.outcome.decided_at.items():
            comparison[arm]["decided_at_seeds"] = details[arm]["decided_at_seeds"] = at
        details["sequential"] = looks.to_dict()
    return comparison, speed, details


def comparison_row(r: ArmReport, noise: SeedNoise, margins: Margins, deciding: str) -> dict[str, Any]:
    """An evaluated arm's deterministic numbers: verdicts, Δ with CI, agreement, KL, ECE (classification) or
    perplexity (language model), steps, FLOP share; for the baseline its seed noise and the margins in use
    instead of an interval against itself."""
    st, m, t, q = r.stats, r.metrics, r.trained, r.quality
    acc, loss = st.accuracy, st.loss
    base = r.arm == BASELINE

    def vs(label: str) -> str:
        return "baseline" if base else label

    row = {"status": "ok", "ablation": r.ablation, "verdict": vs(st.decided.verdict),
           "loss_verdict": vs(loss.verdict), "not_worse": vs(st.decided.not_worse),
           "loss_not_worse": vs(loss.not_worse), "seeds": acc.interval.n,
           "test_accuracy": round(m["test_accuracy"], 6), "delta_accuracy_pp": _pp(acc.interval.mean),
           "delta_accuracy_pp_ci_low": None if base else _pp(acc.interval.ci_low),
           "delta_accuracy_pp_ci_high": None if base else _pp(acc.interval.ci_high),
           "delta_accuracy_pp_bound": None if base else _pp(acc.bound),  # one-sided, the lower
           "test_loss": round(m["test_loss"], 6), "delta_loss": _round(loss.interval.mean),
           "delta_loss_ci_low": None if base else _round(loss.interval.ci_low),
           "delta_loss_ci_high": None if base else _round(loss.interval.ci_high),
           "delta_loss_bound": None if base else _round(loss.bound),  # one-sided, the upper
           "agreement_vs_fp32": round(m["agreement_vs_fp32"], 6), "kl_vs_fp32": round(m["kl_vs_fp32"], 8),
           "max_abs_logit_diff_vs_fp32": round(m["max_abs_logit_diff_vs_fp32"], 6),
           "ece": _round(m.get("test_ece")), "delta_ece": _round(m.get("delta_ece_vs_fp32")),
           "skipped_steps": t.skipped_steps, "optimizer_steps": t.optimizer_steps,
           "plans": None if base else (st.plans or None),
           "steps_to_fp32_quality_vs_fp32": _round(q.steps_vs_fp32, 4) if q else None,
           "seeds_reaching_fp32_quality": q.seeds_reached if q and q.seeds else None}
    if deciding == "loss":  # a language model: the loss verdict decides
        row["accuracy_verdict"], row["accuracy_not_worse"] = vs(acc.verdict), vs(acc.not_worse)
        row["perplexity"] = round(math.exp(m["test_loss"]), 4) if math.isfinite(m["test_loss"]) else None
    if t.state_bytes:  # counted tensor by tensor: weights, gradients and optimizer state
        row["state_bytes_per_parameter"] = _round(t.state_bytes["per_parameter"], 4)
    flops = r.numerics.flops
    if flops:  # counted, so deterministic: it belongs with the comparison, not the timings
        row["low_precision_flop_share"] = round(flops["low_precision_share"], 6)
    if base:  # the noise floor and the margins in use, once
        row.update({"fp32_seed_sd_accuracy_pp": _pp(noise.accuracy_sd), "fp32_seed_sd_loss": _round(noise.loss_sd),
                    "fp32_seed_disagreement": _round(noise.disagreement),
                    "margin_accuracy_pp": _pp(margins.accuracy), "margin_loss": _round(margins.loss)})
    else:
        a = acc.interval
        row.update({"vs_seed_noise": st.decided.vs_seed_noise, "differs_from_fp32": st.differs_from_fp32,
                    "paired_examples": a.pairs, "fp32_right_arm_wrong": a.fp32_right_arm_wrong,
                    "arm_right_fp32_wrong": a.arm_right_fp32_wrong, "design_effect": _round(a.design_effect, 4)})
    return row


def timing_row(r: ArmReport, base: ArmReport, tf32: ArmReport | None) -> dict[str, Any]:
    """An evaluated arm's throughput, memory and input wait, as ratios to fp32 (and tf32 when it ran); achieved
    FLOP/s from the counted FLOPs, and its share of the GPU's peak when the GPU is known.

    Speed comes from the speed stage (``r.speed``: every arm in one process, interleaved, with an interval over
    rounds) when it ran; training-time throughput, each arm timed in its own process at its own time, stays as the
    secondary ``train_*`` figures (and is all there is without the speed stage). Memory: ``peak_memory``."""
    t, flops, sp, q = r.trained, r.numerics.flops, r.speed, r.quality
    own = sp.samples_per_s if sp else t.samples_per_s
    ci = (sp.speedup_vs_fp32_ci if sp else None) or (None, None)
    timing = {
        "samples_per_s": None if own is None else round(own, 1),
        "speedup_vs_fp32": (1.0 if r.arm == BASELINE else _round(sp.speedup_vs_fp32, 4)) if sp
        else _ratio(t.samples_per_s, base.trained.samples_per_s),
        "speedup_vs_fp32_ci_low": _round(ci[0], 4), "speedup_vs_fp32_ci_high": _round(ci[1], 4),
        "speed_unstable": sp.unstable if sp and sp.ratios else None,
        "speed_source": "interleaved" if sp else "training",
        "train_samples_per_s": round(t.samples_per_s, 1),
        "train_speedup_vs_fp32": _ratio(t.samples_per_s, base.trained.samples_per_s),
        "peak_memory_mb": _round(peak_memory(r), 1), "memory_vs_fp32": _ratio(peak_memory(r), peak_memory(base)),
        "input_wait_share": _round(t.input_wait_share, 4),
        # Steps to fp32's quality × the speed stage's time per step, as a ratio to fp32's (quality.py).
        "time_to_fp32_quality_vs_fp32": _round(q.time_vs_fp32, 4) if q else None,
        "train_time_to_fp32_quality_vs_fp32": _round(q.train_time_vs_fp32, 4) if q else None,
    }
    if flops and own:  # achieved FLOP/s: counted FLOPs per sample × samples/s; against the GPU's peak when known
        timing["achieved_tflops"] = round(flops["per_sample"] * own / 1e12, 6)
        if r.numerics.peak_tflops:
            timing["peak_share"] = round(timing["achieved_tflops"] / r.numerics.peak_tflops, 6)
    if tf32 is not None:
        timing["speedup_vs_tf32"] = ((1.0 if r.arm == TF32_REFERENCE else _round(sp.speedup_vs_tf32, 4)) if sp
                                     else _ratio(t.samples_per_s, tf32.trained.samples_per_s))
        timing["memory_vs_tf32"] = _ratio(peak_memory(r), peak_memory(tf32))
    return timing


def peak_memory(r: ArmReport) -> float | None:
    """The arm's peak memory: with only it alive (the speed stage, CUDA), else its training process's; None where
    a process's peak cannot be attributed to one arm (``runtime.memory.per_arm``, the bench's rule: a CPU's peak
    RSS), so its ratios are None too and the report says n/a."""
    if not memory.per_arm(r.trained.hardware.device_type):
        return None
    return (r.speed.peak_memory_mb if r.speed else None) or r.trained.peak_memory_mb


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


def shown(comparison: dict[str, Any], speed: dict[str, Any], deciding: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The slim comparison.json and speed.json: the columns above, plus skipped optimizer steps where the scaler
    skipped any; fp32's own throughput instead of ratios to itself."""
    slim, fast = {}, {}
    for arm, row in comparison.items():
        if arm == BASELINE:
            keys = SHOWN_LOSS_BASELINE if deciding == "loss" else SHOWN_BASELINE
        else:
            keys = SHOWN_LOSS if deciding == "loss" else SHOWN
        slim[arm] = {k: row[k] for k in keys if row.get(k) is not None}
        if "decided_at_seeds" in row:  # a sequential comparison: None while undecided
            slim[arm]["decided_at_seeds"] = row["decided_at_seeds"]
        if row.get("skipped_steps"):
            slim[arm]["skipped_steps"] = row["skipped_steps"]
    for arm, row in speed.items():
        keys = ("samples_per_s",) if arm == BASELINE else SPEED_SHOWN
        fast[arm] = {k: row[k] for k in keys if row.get(k) is not None}
    return slim, fast
