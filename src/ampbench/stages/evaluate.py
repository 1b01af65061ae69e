"""Evaluate stage: every arm against the baseline arm of the same seed on the test split; verdicts; reports.

Loading and predicting happen here; the per-example metrics are metrics.py, the paired statistics and the tables
comparison.py (with stats.py), the advice advice.py, the text report.py, the figures figures.py, MLflow tracking/
and the file names layout.py. Outputs: reports/comparison.json (DVC metrics: per arm the verdict, test accuracy,
Δ with CI), speed.json (speed and memory × fp32), report.md, details.json (every number, every seed), curves.json
(DVC plots) and figures/*.png; test metrics and verdicts onto each arm × seed MLflow run, the comparison onto the
execution's parent run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ampbench import tracking
from ampbench.config.arms import BASELINE
from ampbench.config.layout import INTERLEAVED, ArmFiles, ReportFiles
from ampbench.config.params import Params
from ampbench.config.records import check_history, check_summary
from ampbench.data.prepare import load_prepared
from ampbench.data.splits import Split
from ampbench.errors import AmpbenchError, DataError
from ampbench.models.factory import ModelSpec, build_for
from ampbench.precision.policy import resolve_device, resolve_policy
from ampbench.runtime.console import log
from ampbench.runtime.files import (
    atomic_savefig,
    atomic_write_json,
    atomic_write_text,
    dvc_md5,
    json_digest,
    published_together,
    read_json,
)
from ampbench.speed import harness
from ampbench.tasks.resolve import resolve_task
from ampbench.training import checkpoint
from ampbench.verdict.comparison import ArmReport, Outcomes, paired_statistics, shown, tables
from ampbench.verdict.metrics import seed_noise, summarise_seeds
from ampbench.verdict.quality import attach_quality, quality_metrics
from ampbench.verdict.stats import resolve_margins

# Fingerprint keys that must match across arms: results from different hardware or software are not compared.
FINGERPRINT_KEYS = ("device_name", "compute_capability", "cuda_version", "cudnn_version", "torch_version",
                    "cpu_model", "cpu_16bit_flags")


def _load_arm_model(ckpt_path: Path, device: torch.device) -> torch.nn.Module:
    if not ckpt_path.exists():
        raise DataError(f"{ckpt_path}: missing; {_RETRAIN}")
    ck = checkpoint.load(ckpt_path)
    try:
        m = ck["meta"]
        model = build_for(ModelSpec.from_meta(m["model"]), m["contract"])
        model.load_state_dict(ck["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # altered: not what train wrote
        raise DataError(f"{ckpt_path}: not a checkpoint the train stage wrote ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); {_RETRAIN}") from None
    return model.to(device).eval()


_RETRAIN = "rerun the train stage (dvc repro) to rewrite it"


def _read_summary(path: Path, arm: str, seeds: list[int]) -> dict:
    """models/<arm>/summary.json, checked for what evaluate reads (``records``): one line naming the file
    and the field otherwise."""
    s = read_json(path, f"train the {arm} arm first (dvc repro)")
    need = ("skipped", "hardware") + (() if isinstance(s, dict) and s.get("skipped") else ("seeds",))
    if not isinstance(s, dict) or any(k not in s for k in need):
        raise DataError(f"{path}: not a summary the train stage wrote (expected keys {', '.join(need)}); {_RETRAIN}")
    check_summary(s, path, arm, _RETRAIN)
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


def evaluate_arms(params: Params, data_dir: Path, models_dir: Path, reports_dir: Path, project_root: Path,
                  tags: dict[str, str], speed_path: Path | None = None) -> dict[str, Any]:
    """Evaluate every arm on the test split against the baseline of the same seed; write reports; log to MLflow.
    Speed from the speed stage's ``speed_path`` (reports/harness.json) when it exists."""
    from ampbench.report.advice import plan_lines, recommendation

    tp, ev = params.train, params.evaluate
    tracking.check_uri(tracking.store_uris(project_root)[0])  # a store it cannot log to: before any report is written
    device = resolve_device(tp.device)
    task = resolve_task(tp.task, tp.block_size)
    data = task.view(load_prepared(data_dir))
    summaries = {arm: _read_summary(ArmFiles(models_dir / arm).summary, arm, tp.seeds) for arm in tp.precisions}
    if summaries[BASELINE]["skipped"] or summaries[BASELINE].get("diverged"):
        why = summaries[BASELINE]["skipped"] or summaries[BASELINE]["diverged"]
        raise AmpbenchError(f"the {BASELINE} baseline has no result to compare against: {why}")
    check_fingerprints(summaries)
    inter = harness.load(speed_path or reports_dir / INTERLEAVED.name, tp.precisions,
                             summaries[BASELINE]["hardware"]["device_name"])
    reports, outcomes, predictions = _predict_arms(params, task, summaries, data.test, models_dir, device)
    for r in reports:
        if inter and r.ran and r.arm in inter["arms"]:
            r.speed = {**inter["arms"][r.arm], "peak_memory_mb": inter["memory"].get(r.arm)}
    base = next(r for r in reports if r.arm == BASELINE)
    noise = seed_noise(base.per_seed, predictions)
    margins = resolve_margins(ev.margin.accuracy_pp, ev.margin.loss, noise)
    attach_quality(reports, summaries, margins.loss)
    for r in reports:
        if r.ran:
            r.stats = paired_statistics(r.per_seed, outcomes[r.arm], outcomes[BASELINE], margins, noise,
                                        ev.confidence, task)
    comparison, speed, details = tables(reports, noise, margins, task)
    context = _context(params, task, data.meta, summaries[BASELINE], device, margins, noise)
    merged = {arm: {**row, **speed.get(arm, {})} for arm, row in comparison.items()}
    advice = recommendation(merged, context)  # (line, code): into the report, the log and the parent run
    with published_together(reports_dir) as staging:  # all reports replaced at once, or none
        _write_reports(reports, comparison, speed, details, context, advice, ReportFiles(staging), task)
    log(advice[0].replace("**", ""))
    plans = {arm: " | ".join(plan_lines(arm, row["plans"], context)).replace("`", "")[:5000]
             for arm, row in comparison.items() if row.get("plans")}
    _log_evaluation(params, project_root, tags, advice[0].replace("**", ""), reports, summaries, comparison, speed,
                    ReportFiles(reports_dir), dvc_md5(data_dir), plans)
    return comparison


def _predict_arms(params: Params, task, summaries: dict[str, dict], test: Split, models_dir: Path,
                  device: torch.device) -> tuple[list[ArmReport], dict[str, Outcomes], dict[int, torch.Tensor]]:
    """Every arm's report (skipped and diverged ones with their reason), its per-example outcomes and the
    baseline's predictions per seed (for fp32's seed noise). The baseline first: its models, loaded once, are
    every other arm's references."""
    reports: list[ArmReport] = []
    predictions: dict[int, torch.Tensor] = {}
    refs: dict[int, torch.nn.Module] = {}
    outcomes: dict[str, Outcomes] = {}
    for arm in [BASELINE] + [a for a in params.train.precisions if a != BASELINE]:
        s = summaries[arm]
        if s["skipped"] or s.get("diverged"):
            reason = s["skipped"] or "; ".join(f"seed {k}: {v}" for k, v in s["diverged"].items())
            reports.append(ArmReport(arm, skipped_reason=reason, status="skipped" if s["skipped"] else "diverged",
                                     ablation=s.get("ablation", False), numerics=_numerics(s)))
            continue
        report, outcomes[arm] = _evaluate_arm(arm, s, params, task, test, models_dir / arm, device, refs,
                                              predictions)
        reports.append(report)
    return reports, outcomes, predictions


def _evaluate_arm(arm: str, summary: dict, params: Params, task, test: Split, folder: Path, device: torch.device,
                  refs: dict[int, torch.nn.Module], predictions: dict[int, torch.Tensor]) -> tuple[ArmReport, Outcomes]:
    """One trained arm, every seed: in its own precision and, its weights as they are, in strict fp32; against the
    baseline's model of the same seed (``task.evaluate``). The baseline fills ``refs`` and ``predictions``."""
    policy, strict = resolve_policy(arm, device, params.train.fp32_modules), resolve_policy(BASELINE, device)
    files = ArmFiles(folder)
    histories = read_json(files.history, _RETRAIN)
    if not isinstance(histories, dict):
        raise DataError(f"{files.history}: not a history the train stage wrote; {_RETRAIN}")
    check_history(histories, files.history, _RETRAIN)
    ev = params.evaluate
    per_seed, examples = {}, {}
    for seed in params.train.seeds:
        model = _load_arm_model(files.checkpoint(seed), device)
        if arm == BASELINE:
            refs[seed] = model  # fp32's evaluation leaves it as it was: strict float32, eval mode
        result = task.evaluate(model, refs[seed], policy, strict, test, ev.batch_size, ev.calibration_bins)
        if arm == BASELINE:
            predictions[seed] = result.predictions
        per_seed[seed], examples[seed] = result.metrics, result
    train = {k: summary.get(k) for k in ("samples_per_s", "peak_memory_mb", "skipped_steps", "optimizer_steps",
                                         "input_path", "input_wait_share", "policy", "optimizer", "state_bytes",
                                         "float8")}
    report = ArmReport(arm, summary=summarise_seeds(per_seed), per_seed=per_seed, train=train,
                       histories={int(k): v for k, v in histories.items()}, ablation=summary.get("ablation", False),
                       numerics=_numerics(summary))
    return report, Outcomes.stack(examples)


def _context(params: Params, task, meta: dict, base: dict, device: torch.device, margins, noise) -> dict[str, Any]:
    """What the report says about the run as a whole: data, model, seeds, device, margins, fp32's seed noise."""
    hw = base["hardware"]
    context = {"task": task, "dataset": meta["dataset"], "model": base["model"], "seeds": params.train.seeds,
               "epochs": base["epochs"], "device_name": hw["device_name"], "device_type": device.type,
               "margins": margins, "noise": noise, "margin_pp": 100 * margins.accuracy,
               "confidence": params.evaluate.confidence, "prepare": params.prepare.to_dict(),
               "batch_size": params.train.batch_size,
               "test": {"size": meta["sizes"]["test"], "from": meta.get("test_from"),
                        "available": meta.get("test_available")}}
    if device.type == "cpu":
        from ampbench.report.advice import cpu_note

        context["note"] = cpu_note(hw["cpu_16bit_flags"])
    return context


def _numerics(summary: dict) -> dict[str, Any]:
    """An arm's numerics from its summary.json: FLOPs by dtype of one counted step, the GPU's dense peak for the
    dtype most FLOPs ran in (None on CPUs and unknown GPUs), the first non-finite module per seed, the activation
    table (closest to fp16's top first)."""
    from ampbench.runtime.hardware import peak_tflops

    flops = summary.get("flops")
    peak = peak_tflops(summary["hardware"]["device_name"], flops["dominant_dtype"]) if flops else None
    return {"flops": flops, "peak_tflops": peak, "first_nonfinite": summary.get("first_nonfinite") or {},
            "activations": summary.get("activations") or []}


def _write_reports(reports, comparison, speed, details, context, advice: tuple[str, str], files: ReportFiles,
                   task=None) -> None:
    from ampbench.report.figures import accuracy_delta_figure, curves_figure, quality_figure, speed_memory_figure
    from ampbench.report.markdown import curve_rows, markdown_report, quality_rows

    slim, fast = shown(comparison, speed, task)
    atomic_write_json(files.comparison, slim)
    atomic_write_json(files.speed, fast)
    atomic_write_json(files.details, details)
    atomic_write_json(files.curves, curve_rows(reports))
    quality = quality_rows(reports, context["batch_size"])
    atomic_write_json(files.quality, quality)
    merged = {arm: {**row, **speed.get(arm, {})} for arm, row in comparison.items()}
    atomic_write_text(files.report, markdown_report(reports, merged, context, advice))
    figures = files.figures
    atomic_savefig(curves_figure(reports), figures / "curves.png")
    atomic_savefig(accuracy_delta_figure(reports, context["margin_pp"]), figures / "accuracy_delta.png")
    atomic_savefig(speed_memory_figure(merged), figures / "speed_memory.png")
    atomic_savefig(quality_figure(quality, merged), figures / "time_to_quality.png")


def _log_evaluation(params, project_root, tags, advice: str, reports, summaries, comparison, speed,
                    files: ReportFiles, data_md5: str, plans: dict[str, str]) -> None:
    """Onto each arm × seed run: its test metrics, the short sortable columns (``test_acc``, ``d_acc_pp``,
    ``speed_x``) and the arm's verdict and, when undecided, its sample-size plan as tags. Onto the execution's
    parent run (``tracking.evaluation_parent``): every arm's numbers as ``<arm>.<metric>``, the baseline's noise
    and margins once, the verdicts, plans (``plan.<arm>``) and the recommendation as tags, the evaluate params,
    the report and figures."""
    experiment_id = tracking.setup(project_root, params.mlflow.experiment)
    run_ids: list[str] = []
    for r in sorted((r for r in reports if r.ran), key=lambda r: r.arm != BASELINE):  # baseline's runs first
        arm_row = {**comparison[r.arm], **speed[r.arm]}
        arm_tags = {"evaluated": "true", "verdict": arm_row["verdict"], "loss_verdict": arm_row["loss_verdict"],
                    "not_worse": arm_row["not_worse"], "loss_not_worse": arm_row["loss_not_worse"]}
        if r.arm != BASELINE:
            arm_tags.update({"verdict_reason": r.stats["verdict_reason"], "vs_seed_noise": r.stats["vs_seed_noise"],
                             "not_worse_reason": r.stats["not_worse_reason"]})
            if r.arm in plans:
                arm_tags["plan"] = plans[r.arm]
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
            metrics.update(quality_metrics(r.quality, seed))
            tracking.log_to(run_id, metrics, arm_tags)
    flat = {f"{arm}.{k}": v for table in (comparison, speed) for arm, row in table.items() for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ptags = {**tags, "dvc.data_md5": data_md5, "ampbench.evaluated": "true", "recommendation": advice[:5000],
             "arms": ",".join(params.train.precisions), "model": summaries[BASELINE]["model"]["name"],
             "seeds": ",".join(map(str, params.train.seeds)),
             **{f"verdict.{arm}": row["verdict"] for arm, row in comparison.items()},
             **{f"not_worse.{arm}": row["not_worse"] for arm, row in comparison.items() if "not_worse" in row},
             **{f"plan.{arm}": text for arm, text in plans.items()},
             **{f"{r.status}.{r.arm}": r.skipped_reason[:5000] for r in reports if not r.ran}}
    evaluate_params = tracking.flatten("evaluate", params.evaluate.to_dict())
    key = json_digest(evaluate_params, 24)
    parent = tracking.evaluation_parent(experiment_id, run_ids, key, tracking.execution_name(tags), ptags,
                                        evaluate_params)
    tracking.log_to(parent, flat, ptags, evaluate_params, artifacts=files.tracked,
                    artifact_dirs={"figures": files.figures})
    tracking.end_execution(parent)
