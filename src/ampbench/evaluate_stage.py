"""Evaluate stage: every arm against the baseline arm of the same seed on the test split; verdicts; reports.

The per-arm metrics live in metrics.py and stats.py, formatting in report.py, MLflow calls in tracking.py, the
file names in layout.py. Outputs: reports/comparison.json (DVC metrics: per arm the verdict, test accuracy, Δ with
CI), speed.json (speed and memory × fp32), report.md, details.json (every number, every seed), curves.json (DVC
plots) and figures/*.png; test metrics and verdicts onto each arm × seed MLflow run, the comparison onto the
execution's parent run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ampbench import checkpoint, tracking
from ampbench.arms import BASELINE, TF32_REFERENCE
from ampbench.console import log
from ampbench.data import load_prepared
from ampbench.errors import AmpbenchError, DataError
from ampbench.fileio import (
    atomic_savefig,
    atomic_write_json,
    atomic_write_text,
    dvc_md5,
    published_together,
    read_json,
)
from ampbench.layout import ArmFiles, ReportFiles
from ampbench.model_factory import ModelSpec, build
from ampbench.params import Params
from ampbench.precision import resolve_device, resolve_policy
from ampbench.stats import (
    Margins,
    SeedNoise,
    against_noise,
    differs_from_zero,
    paired_accuracy,
    paired_ci,
    paired_mean,
    resolve_margins,
    verdict,
)
from ampbench.training import predict

# Fingerprint keys that must match across arms: results from different hardware or software are not compared.
FINGERPRINT_KEYS = ("device_name", "compute_capability", "cuda_version", "cudnn_version", "torch_version",
                    "cpu_model", "cpu_16bit_flags")


def _load_arm_model(ckpt_path: Path, device: torch.device) -> torch.nn.Module:
    if not ckpt_path.exists():
        raise DataError(f"{ckpt_path}: missing; {_RETRAIN}")
    ck = checkpoint.load(ckpt_path)
    try:
        m = ck["meta"]
        model = build(ModelSpec.from_meta(m["model"]), tuple(m["input_shape"]), m["num_classes"])
        model.load_state_dict(ck["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # altered: not what train wrote
        raise DataError(f"{ckpt_path}: not a checkpoint the train stage wrote ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); {_RETRAIN}") from None
    return model.to(device).eval()


_RETRAIN = "rerun the train stage (dvc repro) to rewrite it"


def _read_summary(path: Path, arm: str, seeds: list[int]) -> dict:
    """models/<arm>/summary.json, checked for what evaluate reads: one line naming the file otherwise."""
    s = read_json(path, f"train the {arm} arm first (dvc repro)")
    need = ("skipped", "hardware") + (() if isinstance(s, dict) and s.get("skipped") else ("seeds",))
    if not isinstance(s, dict) or any(k not in s for k in need):
        raise DataError(f"{path}: not a summary the train stage wrote (expected keys {', '.join(need)}); {_RETRAIN}")
    if not s["skipped"] and not s.get("diverged"):
        missing = [seed for seed in seeds if str(seed) not in s["seeds"]]
        if missing:
            raise DataError(f"{path}: no result for seed(s) {missing} of train.seeds; {_RETRAIN}")
    return s


def check_fingerprints(summaries: dict[str, dict]) -> None:
    """Refuse to compare arms trained on different hardware or software (one clear message)."""
    ran = {arm: s["hardware"] for arm, s in summaries.items() if not s["skipped"]}
    base = ran[BASELINE]
    for arm, hw in ran.items():
        diff = [k for k in FINGERPRINT_KEYS if hw.get(k) != base.get(k)]
        if diff:
            shown = ", ".join(f"{k}: {base.get(k)!r} vs {hw.get(k)!r}" for k in diff)
            raise AmpbenchError(f"refusing to compare {arm} with {BASELINE}: they ran on different hardware or "
                                f"software ({shown}); retrain both on one machine (dvc repro --force)")


@dataclass(frozen=True)
class Outcomes:
    """One arm's per-example test outcomes, seeds × examples (the same examples in the same order for every arm)."""

    correct: np.ndarray  # bool
    loss: np.ndarray  # cross-entropy, nats
    finite: bool  # every logit finite

    @classmethod
    def stack(cls, per_seed: dict[int, tuple[torch.Tensor, torch.Tensor, bool]]) -> Outcomes:
        seeds = sorted(per_seed)
        return cls(np.stack([per_seed[s][0].numpy() for s in seeds]),
                   np.stack([per_seed[s][1].numpy() for s in seeds]), all(per_seed[s][2] for s in seeds))


def paired_statistics(per_seed: dict[int, dict[str, float]], arm: Outcomes, ref: Outcomes, margins: Margins,
                      noise: SeedNoise, confidence: float) -> dict[str, Any]:
    """Intervals of the paired differences and verdicts for one arm against the baseline of the same seeds.

    Accuracy and loss from the per-example outcomes (stats.paired_accuracy, stats.paired_mean); agreement, KL
    and ECE from the per-seed values (Student t over seeds, cut to the range each can take).
    """
    seeds = sorted(per_seed)
    bounds = {"delta_ece_vs_fp32": (-1, 1), "agreement_vs_fp32": (0, 1), "kl_vs_fp32": (0, None)}
    out: dict[str, Any] = {key: paired_ci([per_seed[s][key] for s in seeds], confidence, bounds[key]).to_dict()
                           for key in bounds}
    finite = arm.finite and ref.finite
    acc = paired_accuracy(arm.correct, ref.correct, confidence, finite)
    loss = paired_mean(arm.loss - ref.loss, confidence, finite=finite)
    out["delta_accuracy_vs_fp32"], out["delta_loss_vs_fp32"] = acc.to_dict(), loss.to_dict()
    out["verdict"], out["verdict_reason"] = verdict(acc, margins.accuracy, True, " pp", 100)
    out["loss_verdict"], out["loss_verdict_reason"] = verdict(loss, margins.loss, False, " nats", digits=4)
    out["vs_seed_noise"], noise_text = against_noise(acc, noise.accuracy_floor, " pp", 100)
    out["loss_vs_seed_noise"], loss_noise_text = against_noise(loss, noise.loss_sd, " nats", digits=4)
    if acc.finite:
        flips = (f"{acc.fp32_right_arm_wrong} of {acc.pairs} paired predictions right in fp32 only, "
                 f"{acc.arm_right_fp32_wrong} right in the arm only")
        out["verdict_reason"] += f" ({flips}; the difference is {noise_text})"
        out["loss_verdict_reason"] += f" (the difference is {loss_noise_text})"
    out["differs_from_fp32"] = differs_from_zero(acc)
    return out


def evaluate_arms(params: Params, data_dir: Path, models_dir: Path, reports_dir: Path, project_root: Path,
                  tags: dict[str, str]) -> dict[str, Any]:
    """Evaluate every arm on the test split against the baseline of the same seed; write reports; log to MLflow."""
    from ampbench.metrics import arm_seed_metrics, example_outcomes, seed_noise, summarise_seeds
    from ampbench.report import ArmReport

    tp = params.train
    device = resolve_device(tp.device)
    data = load_prepared(data_dir)
    test = data.test  # stays where it is (memory-mapped); predict moves it a batch at a time
    test_y = test.y.to(device)
    strict = resolve_policy(BASELINE, device)  # every arm's weights are also evaluated in strict fp32

    summaries = {}
    for arm in tp.precisions:
        summaries[arm] = _read_summary(ArmFiles(models_dir / arm).summary, arm, tp.seeds)
    if summaries[BASELINE]["skipped"] or summaries[BASELINE].get("diverged"):
        why = summaries[BASELINE]["skipped"] or summaries[BASELINE]["diverged"]
        raise AmpbenchError(f"the {BASELINE} baseline has no result to compare against: {why}")
    check_fingerprints(summaries)

    # Logits per arm and seed: in the arm's own precision, and the same weights in strict fp32.
    reports: list[ArmReport] = []
    ref: dict[int, torch.Tensor] = {}
    outcomes: dict[str, Outcomes] = {}
    for arm in [BASELINE] + [a for a in tp.precisions if a != BASELINE]:
        s = summaries[arm]
        if s["skipped"] or s.get("diverged"):
            reason = s["skipped"] or "; ".join(f"seed {k}: {v}" for k, v in s["diverged"].items())
            reports.append(ArmReport(arm, skipped_reason=reason, status="skipped" if s["skipped"] else "diverged",
                                     ablation=s.get("ablation", False), numerics=_numerics(s)))
            continue
        policy = resolve_policy(arm, device, tp.fp32_modules)
        arm_files = ArmFiles(models_dir / arm)
        histories = read_json(arm_files.history, _RETRAIN)
        if not isinstance(histories, dict):
            raise DataError(f"{arm_files.history}: not a history the train stage wrote; {_RETRAIN}")
        per_seed, examples = {}, {}
        for seed in tp.seeds:
            model = _load_arm_model(arm_files.checkpoint(seed), device)
            policy.apply_backend_flags()
            own = predict(policy.prepare_model(model), test, policy, params.evaluate.batch_size)
            strict.apply_backend_flags()
            f32 = predict(model.float(), test, strict, params.evaluate.batch_size)
            if arm == BASELINE:
                ref[seed] = own
            per_seed[seed] = arm_seed_metrics(own, f32, ref[seed], test_y, params.evaluate.calibration_bins)
            examples[seed] = (*example_outcomes(own, test_y), bool(torch.isfinite(own).all()))
        outcomes[arm] = Outcomes.stack(examples)
        reports.append(ArmReport(arm, summary=summarise_seeds(per_seed), per_seed=per_seed,
                                 histories={int(k): v for k, v in histories.items()},
                                 train={k: s.get(k) for k in ("samples_per_s", "peak_memory_mb", "skipped_steps",
                                                              "optimizer_steps", "input_path", "input_wait_share",
                                                              "policy")},
                                 ablation=s.get("ablation", False), numerics=_numerics(s)))
    ev = params.evaluate
    noise = seed_noise(ref, test_y)
    margins = resolve_margins(ev.margin.accuracy_pp, ev.margin.loss, noise)
    for r in reports:
        if r.ran:
            r.stats = paired_statistics(r.per_seed, outcomes[r.arm], outcomes[BASELINE], margins, noise,
                                        ev.confidence)

    comparison, speed, details = _tables(reports, noise, margins)
    base = summaries[BASELINE]
    hw = base["hardware"]
    context = {"dataset": data.meta["dataset"], "model": base["model"], "seeds": tp.seeds, "epochs": base["epochs"],
               "device_name": hw["device_name"], "device_type": device.type, "margins": margins, "noise": noise,
               "margin_pp": 100 * margins.accuracy, "confidence": ev.confidence}
    if device.type == "cpu":
        context["note"] = (
            f"CPU run. This CPU's 16-bit instructions: {hw['cpu_16bit_flags']}. Without AVX512-BF16/AMX, bf16 "
            "autocast is emulated, and fp16 autocast on CPU has few fast kernels, so both are often several times "
            "slower than fp32 here; mixed-precision speed-ups are mainly a GPU tensor-core effect. Memory on CPU is "
            "the process's peak RSS (imports included). Speeds are reported as measured.")
    report_files = ReportFiles(reports_dir)
    with published_together(reports_dir) as staging:  # all reports replaced at once, or none
        _write_reports(reports, comparison, speed, details, context, ReportFiles(staging))
    from ampbench.report import recommendation

    merged = {arm: {**row, **speed.get(arm, {})} for arm, row in comparison.items()}
    advice = recommendation(merged, context)[0].replace("**", "")
    log(advice)
    _log_evaluation(params, project_root, tags, advice, reports, summaries, comparison, speed, report_files,
                    dvc_md5(data_dir))
    return comparison


def _numerics(summary: dict) -> dict[str, Any]:
    """An arm's numerics from its summary.json: FLOPs by dtype of one counted step, the GPU's dense peak for the
    dtype most FLOPs ran in (None on CPUs and unknown GPUs), the first non-finite module per seed, the activation
    table (closest to fp16's top first)."""
    from ampbench.hardware import peak_tflops

    flops = summary.get("flops")
    peak = peak_tflops(summary["hardware"]["device_name"], flops["dominant_dtype"]) if flops else None
    return {"flops": flops, "peak_tflops": peak, "first_nonfinite": summary.get("first_nonfinite") or {},
            "activations": summary.get("activations") or []}


def _pp(fraction: float | None) -> float | None:
    """A fraction as percentage points, rounded for the metrics files."""
    return None if fraction is None else round(100 * fraction, 4)


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def _tables(reports, noise: SeedNoise, margins: Margins) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(comparison.json, speed.json, details.json).

    comparison holds what training deterministically produces (verdicts, Δ with CI, agreement, …), so a fresh
    clone's `dvc repro` reproduces it exactly on CPU; speed holds the timings and memory, which never repeat
    exactly. Their files (DVC metrics, columns in `dvc exp show`) keep the few columns of ``shown``;
    details.json has every number, per arm and per seed.
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
        st, s, t = r.stats, r.summary, r.train
        acc, loss = st["delta_accuracy_vs_fp32"], st["delta_loss_vs_fp32"]
        row = {
            "status": "ok",
            "ablation": r.ablation,
            "verdict": "baseline" if r.arm == BASELINE else st["verdict"],
            "loss_verdict": "baseline" if r.arm == BASELINE else st["loss_verdict"],
            "seeds": acc["n"],
            "test_accuracy": round(s["test_accuracy"], 6),
            "delta_accuracy_pp": _pp(acc["mean"]),
            "delta_accuracy_pp_ci_low": _pp(acc["ci_low"]),
            "delta_accuracy_pp_ci_high": _pp(acc["ci_high"]),
            "test_loss": round(s["test_loss"], 6),
            "delta_loss": _round(loss["mean"]),
            "delta_loss_ci_low": _round(loss["ci_low"]),
            "delta_loss_ci_high": _round(loss["ci_high"]),
            "agreement_vs_fp32": round(s["agreement_vs_fp32"], 6),
            "kl_vs_fp32": round(s["kl_vs_fp32"], 8),
            "max_abs_logit_diff_vs_fp32": round(s["max_abs_logit_diff_vs_fp32"], 6),
            "ece": round(s["test_ece"], 6),
            "delta_ece": round(s["delta_ece_vs_fp32"], 6),
            "skipped_steps": t["skipped_steps"],
            "optimizer_steps": t.get("optimizer_steps"),
        }
        flops = r.numerics.get("flops")
        if flops:  # counted, so deterministic: it belongs with the comparison, not the timings
            row["low_precision_flop_share"] = round(flops["low_precision_share"], 6)
        if r.arm == BASELINE:  # the noise floor and the margins in use, once; no interval of fp32 against itself
            for key in ("delta_accuracy_pp_ci_low", "delta_accuracy_pp_ci_high", "delta_loss_ci_low",
                        "delta_loss_ci_high"):
                row[key] = None
            row.update({"fp32_seed_sd_accuracy_pp": _pp(noise.accuracy_sd),
                        "fp32_seed_sd_loss": _round(noise.loss_sd),
                        "fp32_seed_disagreement": _round(noise.disagreement),
                        "margin_accuracy_pp": _pp(margins.accuracy), "margin_loss": _round(margins.loss)})
        else:
            row.update({"vs_seed_noise": st["vs_seed_noise"], "differs_from_fp32": st["differs_from_fp32"],
                        "paired_examples": acc["pairs"], "fp32_right_arm_wrong": acc["fp32_right_arm_wrong"],
                        "arm_right_fp32_wrong": acc["arm_right_fp32_wrong"],
                        "design_effect": _round(acc["design_effect"], 4)})
        timing = {
            "samples_per_s": round(t["samples_per_s"], 1),
            "speedup_vs_fp32": _ratio(t["samples_per_s"], base.train["samples_per_s"]),
            "peak_memory_mb": round(t["peak_memory_mb"], 1),
            "memory_vs_fp32": _ratio(t["peak_memory_mb"], base.train["peak_memory_mb"]),
            "input_wait_share": _round(t.get("input_wait_share"), 4),
        }
        if flops:  # achieved FLOP/s: counted FLOPs per sample × samples/s; against the GPU's peak when known
            timing["achieved_tflops"] = round(flops["per_sample"] * t["samples_per_s"] / 1e12, 6)
            if r.numerics.get("peak_tflops"):
                timing["peak_share"] = round(timing["achieved_tflops"] / r.numerics["peak_tflops"], 6)
        if tf32 is not None:
            timing["speedup_vs_tf32"] = _ratio(t["samples_per_s"], tf32.train["samples_per_s"])
            timing["memory_vs_tf32"] = _ratio(t["peak_memory_mb"], tf32.train["peak_memory_mb"])
        comparison[r.arm] = {k: v for k, v in row.items() if v is not None}
        speed[r.arm] = {k: v for k, v in timing.items() if v is not None}
        details[r.arm] = {**row, **timing, "statistics": st, "mean_and_std": s, "per_seed": r.per_seed, "train": t,
                          "numerics": r.numerics}
    return comparison, speed, details


# What the DVC metrics files keep per arm: `dvc exp show` draws one column per value, so a handful (≈ 20 for the
# four main arms) that answer "may I switch?"; every other number is in details.json and the MLflow parent run.
SHOWN = ("verdict", "test_accuracy", "delta_accuracy_pp", "delta_accuracy_pp_ci_low", "delta_accuracy_pp_ci_high")
SHOWN_BASELINE = ("verdict", "test_accuracy", "margin_accuracy_pp")
SPEED_SHOWN = ("speedup_vs_fp32", "memory_vs_fp32")


def shown(comparison: dict[str, Any], speed: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The slim comparison.json and speed.json: the columns above, plus skipped optimizer steps where the scaler
    skipped any; fp32's own throughput instead of ratios to itself."""
    slim, fast = {}, {}
    for arm, row in comparison.items():
        keys = SHOWN_BASELINE if arm == BASELINE else SHOWN
        slim[arm] = {k: row[k] for k in keys if row.get(k) is not None}
        if row.get("skipped_steps"):
            slim[arm]["skipped_steps"] = row["skipped_steps"]
    for arm, row in speed.items():
        keys = ("samples_per_s",) if arm == BASELINE else SPEED_SHOWN
        fast[arm] = {k: row[k] for k in keys if row.get(k) is not None}
    return slim, fast


def _write_reports(reports, comparison, speed, details, context, files: ReportFiles) -> None:
    from ampbench.report import accuracy_delta_figure, curve_rows, curves_figure, markdown_report, speed_memory_figure

    slim, fast = shown(comparison, speed)
    atomic_write_json(files.comparison, slim)
    atomic_write_json(files.speed, fast)
    atomic_write_json(files.details, details)
    atomic_write_json(files.curves, curve_rows(reports))
    merged = {arm: {**row, **speed.get(arm, {})} for arm, row in comparison.items()}
    atomic_write_text(files.report, markdown_report(reports, merged, context))
    figures = files.figures
    atomic_savefig(curves_figure(reports), figures / "curves.png")
    atomic_savefig(accuracy_delta_figure(reports, context["margin_pp"]), figures / "accuracy_delta.png")
    atomic_savefig(speed_memory_figure(merged), figures / "speed_memory.png")


def _log_evaluation(params, project_root, tags, advice: str, reports, summaries, comparison, speed,
                    files: ReportFiles, data_md5: str) -> None:
    """Onto each arm × seed run: its test metrics, the short sortable columns (``test_acc``, ``d_acc_pp``,
    ``speed_x``) and the arm's verdict as tags. Onto the execution's parent run (``tracking.evaluation_parent``):
    every arm's numbers as ``<arm>.<metric>``, the baseline's noise and margins once, the verdicts and the
    recommendation as tags, the evaluate params, the report and figures."""
    import hashlib
    import json

    experiment_id = tracking.setup(project_root, params.mlflow.experiment)
    run_ids: list[str] = []
    for r in sorted((r for r in reports if r.ran), key=lambda r: r.arm != BASELINE):  # baseline's runs first
        arm_row = {**comparison[r.arm], **speed[r.arm]}
        arm_tags = {"evaluated": "true", "verdict": arm_row["verdict"], "loss_verdict": arm_row["loss_verdict"]}
        if r.arm != BASELINE:
            arm_tags.update({"verdict_reason": r.stats["verdict_reason"], "vs_seed_noise": r.stats["vs_seed_noise"]})
        for seed, m in r.per_seed.items():
            run_id = summaries[r.arm]["seeds"][str(seed)]["run_id"]
            if not tracking.run_exists(run_id):
                log(f"[{r.arm}] seed {seed}: run {run_id} is not in this MLflow store; test metrics not attached")
                continue
            run_ids.append(run_id)
            metrics = {k: v for k, v in m.items() if k not in ("test_accuracy", "delta_accuracy_vs_fp32")}
            metrics.update({"test_acc": round(m["test_accuracy"], 6),
                            "d_acc_pp": round(100 * m["delta_accuracy_vs_fp32"], 4)})
            if arm_row.get("speedup_vs_fp32") is not None:
                metrics["speed_x"] = arm_row["speedup_vs_fp32"]
            tracking.log_to(run_id, metrics, arm_tags)
    flat = {f"{arm}.{k}": v for table in (comparison, speed) for arm, row in table.items() for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ptags = {**tags, "dvc.data_md5": data_md5, "ampbench.evaluated": "true", "recommendation": advice[:5000],
             "arms": ",".join(params.train.precisions), "model": summaries[BASELINE]["model"]["name"],
             "seeds": ",".join(map(str, params.train.seeds)),
             **{f"verdict.{arm}": row["verdict"] for arm, row in comparison.items()},
             **{f"{r.status}.{r.arm}": r.skipped_reason[:5000] for r in reports if not r.ran}}
    evaluate_params = tracking.flatten("evaluate", params.evaluate.to_dict())
    key = hashlib.sha256(json.dumps(evaluate_params, sort_keys=True).encode()).hexdigest()[:24]
    parent = tracking.evaluation_parent(experiment_id, run_ids, key, tracking.execution_name(tags), ptags,
                                        evaluate_params)
    tracking.log_to(parent, flat, ptags, evaluate_params, artifacts=files.tracked,
                    artifact_dirs={"figures": files.figures})
    tracking.end_execution(parent)
