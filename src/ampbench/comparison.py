"""Evaluate stage orchestration: every arm vs the fp32 arm of the same seed; reports; MLflow comparison run.

The maths lives in evaluation.py, formatting in report.py, MLflow calls in tracking.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from ampbench import checkpoint, tracking
from ampbench.data import load_prepared
from ampbench.errors import AmpbenchError
from ampbench.fileio import atomic_savefig, atomic_write_json, atomic_write_text
from ampbench.models import build_model
from ampbench.params import BASELINE, Params
from ampbench.precision import resolve_device, resolve_policy
from ampbench.runner import HISTORY, SUMMARY
from ampbench.training import predict

# Per-arm columns in reports/metrics.json (means over seeds); reports/details.json has every seed and std.
HEADLINE_METRICS = ("test_accuracy", "test_accuracy_std", "test_loss", "delta_accuracy_vs_fp32",
                    "delta_loss_vs_fp32", "agreement_vs_fp32", "kl_vs_fp32", "max_abs_logit_diff_vs_fp32",
                    "test_accuracy_fp32eval")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_arm_model(ckpt_path: Path, device: torch.device) -> torch.nn.Module:
    ck = checkpoint.load(ckpt_path)
    m = ck["meta"]
    model = build_model(m["model"], tuple(m["input_shape"]), m["num_classes"], m["width"])
    model.load_state_dict(ck["model"])
    return model.to(device).eval()


def evaluate_arms(params: Params, data_dir: Path, models_dir: Path, reports_dir: Path, project_root: Path,
                  tags: dict[str, str]) -> dict[str, Any]:
    """Evaluate every arm on the test split against fp32 of the same seed; write reports; log to MLflow."""
    from ampbench.evaluation import arm_seed_metrics, summarise_seeds
    from ampbench.report import ArmReport, curve_rows, curves_figure, markdown_table

    tp = params.train
    device = resolve_device(tp.device)
    data = load_prepared(data_dir)
    test = data.test.to(device)
    fp32 = resolve_policy(BASELINE, device)

    summaries = {}
    for arm in tp.precisions:
        path = models_dir / arm / SUMMARY
        if not path.exists():
            raise AmpbenchError(f"{path} missing: train the {arm} arm first (dvc repro)")
        summaries[arm] = json.loads(path.read_text())
    if summaries[BASELINE]["skipped"] or summaries[BASELINE].get("diverged"):
        why = summaries[BASELINE]["skipped"] or summaries[BASELINE]["diverged"]
        raise AmpbenchError(f"the fp32 baseline has no result to compare against: {why}")
    fingerprints = {arm: s["hardware"] for arm, s in summaries.items()}

    # Logits per arm and seed: in the arm's own precision, and the same weights in strict fp32.
    reports: list[ArmReport] = []
    ref: dict[int, torch.Tensor] = {}
    for arm in [BASELINE] + [a for a in tp.precisions if a != BASELINE]:
        s = summaries[arm]
        if s["skipped"] or s.get("diverged"):
            reason = s["skipped"] or "; ".join(f"seed {k}: {v}" for k, v in s["diverged"].items())
            reports.append(ArmReport(arm, skipped_reason=reason, status="skipped" if s["skipped"] else "diverged",
                                     ablation=s.get("ablation", False)))
            continue
        policy = resolve_policy(arm, device)
        histories = json.loads((models_dir / arm / HISTORY).read_text())
        per_seed = {}
        for seed in tp.seeds:
            model = _load_arm_model(models_dir / arm / f"seed{seed}.pt", device)
            policy.apply_backend_flags()
            own = predict(policy.prepare_model(model), test.x, policy, params.evaluate.batch_size)
            fp32.apply_backend_flags()
            f32 = predict(model.float(), test.x, fp32, params.evaluate.batch_size)
            if arm == BASELINE:
                ref[seed] = own
            per_seed[seed] = arm_seed_metrics(own, f32, ref[seed], test.y)
        reports.append(ArmReport(arm, summary=summarise_seeds(per_seed), per_seed=per_seed,
                                 histories={int(k): v for k, v in histories.items()},
                                 train={"samples_per_s": s["samples_per_s"], "skipped_steps": s["skipped_steps"],
                                        "policy": s["policy"]}, ablation=s.get("ablation", False)))

    base = reports[0]
    metrics: dict[str, Any] = {}  # compact: what `dvc metrics show` / `dvc exp show` put in columns
    details: dict[str, Any] = {}  # everything, per seed
    for r in reports:
        if not r.ran:
            metrics[r.arm] = details[r.arm] = {"status": r.status, "reason": r.skipped_reason,
                                               "ablation": r.ablation}
            continue
        metrics[r.arm] = {
            "status": "ok",
            "ablation": r.ablation,
            **{k: round(r.summary[k], 6) for k in HEADLINE_METRICS},
            "samples_per_s": round(r.train["samples_per_s"], 1),
            "speedup_vs_fp32": round(r.train["samples_per_s"] / base.train["samples_per_s"], 4),
            "skipped_steps": r.train["skipped_steps"],
        }
        details[r.arm] = {"status": "ok", "mean_and_std": r.summary, "per_seed": r.per_seed, "train": r.train}
    context = {"dataset": data.meta["dataset"], "model": tp.model, "seeds": tp.seeds, "epochs": tp.epochs,
               "device_name": fingerprints[BASELINE]["device_name"]}
    if device.type == "cpu":
        flags = fingerprints[BASELINE]["cpu_16bit_flags"]
        context["note"] = (
            f"CPU run. This CPU's 16-bit instructions: {flags}. Without AVX512-BF16/AMX, bf16 autocast is emulated, "
            "and fp16 autocast on CPU has few fast kernels, so both are often several times slower than fp32 here; "
            "mixed-precision speed-ups are mainly a GPU tensor-core effect. Speeds are reported as measured.")
    table = markdown_table(reports, context)

    reports_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(reports_dir / "metrics.json", metrics)
    atomic_write_json(reports_dir / "details.json", details)
    atomic_write_json(reports_dir / "curves.json", curve_rows(reports))
    atomic_write_text(reports_dir / "comparison.md", table)
    fig = curves_figure(reports)
    atomic_savefig(fig, reports_dir / "figures" / "curves.png")

    _log_evaluation(params, project_root, tags, reports, summaries, metrics, reports_dir)
    return metrics


def _log_evaluation(params, project_root, tags, reports, summaries, metrics, reports_dir) -> None:
    """Test metrics onto each arm's run; one comparison run holding the table, figures and all metrics."""
    tracking.setup(project_root, params.mlflow.experiment)
    for r in reports:
        if not r.ran:
            continue
        for seed, m in r.per_seed.items():
            run_id = summaries[r.arm]["seeds"][str(seed)]["run_id"]
            if tracking.run_exists(run_id):
                tracking.update_run(run_id, m, {"evaluated": "true"})
            else:
                _log(f"[{r.arm}] seed {seed}: run {run_id} is not in this MLflow store; test metrics not attached")
    flat = {}
    for arm, m in metrics.items():
        for k, v in m.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                flat[f"{arm}.{k}"] = v
    skipped = {f"{r.status}.{r.arm}": r.skipped_reason[:5000] for r in reports if not r.ran}
    ctags = {**tags, "ampbench.role": "comparison", "arms": ",".join(params.train.precisions),
             "seeds": ",".join(map(str, params.train.seeds)), **skipped}
    with tracking.run("comparison" + (f"-{tags['dvc_exp_name']}" if "dvc_exp_name" in tags else ""), ctags,
                      tracking.flatten("", params.model_dump())):
        tracking.log_metrics(flat)
        tracking.log_artifacts([reports_dir / "comparison.md", reports_dir / "metrics.json", reports_dir / "details.json",
                                reports_dir / "curves.json"])
        tracking.log_artifacts([reports_dir / "figures"], artifact_path="figures")
