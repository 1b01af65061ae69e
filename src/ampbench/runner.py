"""Orchestration behind the train and evaluate stages: seeds × (fit → checkpoint → MLflow), and arms vs fp32.

Stage scripts in ``pipeline/`` call ``train_arm`` and ``evaluate_arms``; the maths lives in training.py and
evaluation.py, MLflow calls in tracking.py, file formats in data.py / checkpoint.py / fileio.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from ampbench import checkpoint, tracking
from ampbench.data import load_prepared
from ampbench.determinism import seed_everything, set_deterministic
from ampbench.errors import AmpbenchError, ArmUnavailable
from ampbench.fileio import atomic_savefig, atomic_write_json, atomic_write_text
from ampbench.hardware import fingerprint
from ampbench.models import build_model
from ampbench.params import BASELINE, Params
from ampbench.precision import cudnn_legacy_flags_readable, resolve_device, resolve_policy
from ampbench.training import Diverged, TrainConfig, fit, init_state, predict

SUMMARY = "summary.json"
# Per-arm columns in reports/metrics.json (means over seeds); reports/details.json has every seed and std.
HEADLINE_METRICS = ("test_accuracy", "test_accuracy_std", "test_loss", "delta_accuracy_vs_fp32",
                    "delta_loss_vs_fp32", "agreement_vs_fp32", "kl_vs_fp32", "max_abs_logit_diff_vs_fp32",
                    "test_accuracy_fp32eval")
HISTORY = "history.json"


def _requirements() -> list[str]:
    import torchvision

    return [f"torch=={torch.__version__.split('+')[0]}", f"torchvision=={torchvision.__version__.split('+')[0]}"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train_arm(arm: str, params: Params, data_dir: Path, out_dir: Path, project_root: Path,
              tags: dict[str, str]) -> dict[str, Any]:
    """Train ``arm`` once per seed in ``params.train.seeds``; write checkpoints, history and summary to out_dir.

    An arm the device cannot run is recorded as skipped (with the reason) instead of running as something else.
    Returns the summary written to ``out_dir/summary.json``.
    """
    tp = params.train
    device = resolve_device(tp.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        policy = resolve_policy(arm, device)
    except ArmUnavailable as exc:
        _log(f"[{arm}] skipped: {exc}")
        summary = {"arm": arm, "skipped": str(exc), "hardware": fingerprint(device)}
        atomic_write_json(out_dir / HISTORY, {})
        atomic_write_json(out_dir / SUMMARY, summary)
        return summary

    data = load_prepared(data_dir)
    train, val = data.train.to(device), data.val.to(device)
    hw = fingerprint(device)
    tracking.setup(project_root, params.mlflow.experiment)
    histories: dict[str, list] = {}
    seeds: dict[str, Any] = {}
    for seed in tp.seeds:
        seed_everything(seed)
        set_deterministic(tp.deterministic)
        policy.apply_backend_flags()
        model = build_model(tp.model, data.input_shape, data.num_classes, tp.width).to(device)
        model = policy.prepare_model(model)
        cfg = TrainConfig(epochs=tp.epochs, batch_size=tp.batch_size, lr=tp.lr, optimizer=tp.optimizer,
                          weight_decay=tp.weight_decay, momentum=tp.momentum, scheduler=tp.scheduler, seed=seed,
                          progress=tp.progress, clip_grad_norm=tp.clip_grad_norm, telemetry_every=tp.telemetry_every,
                          loss_multiplier=tp.loss_multiplier, scaler_settings=tp.grad_scaler.model_dump(),
                          min_loss_scale=tp.divergence.min_loss_scale,
                          max_consecutive_skips=tp.divergence.max_consecutive_skips)
        state = init_state(model, policy, cfg, device)
        what_ran = policy.describe()
        run_params = {**tracking.flatten("", params.model_dump()), **tracking.flatten("effective", what_ran),
                      "seed": str(seed), "dataset.checksum": data.meta["checksum"]}
        run_tags = {**tags, "precision": arm, "seed": str(seed), "device": hw["device_name"],
                    **{f"hw.{k}": v for k, v in hw.items()}, "ampbench.role": "arm"}
        _log(f"[{arm}] seed {seed}: {what_ran}")
        history: list[dict] = []
        run_id = None
        try:
            with tracking.run(f"{arm}-seed{seed}", run_tags, run_params) as run_id:
                tracking.log_dataset(data.meta, data_dir)
                result = fit(state, train, val, policy, cfg,
                             on_epoch=lambda row, _state: (history.append(row), tracking.log_epoch(row)))
                ckpt = out_dir / f"seed{seed}.pt"
                meta = {"arm": arm, "seed": seed, "model": tp.model, "width": tp.width,
                        "input_shape": list(data.input_shape), "num_classes": data.num_classes, "policy": what_ran}
                checkpoint.save(state, meta, ckpt)
                seed_history = out_dir / f"history-seed{seed}.json"
                layers = out_dir / f"grad_layers-seed{seed}.json"
                atomic_write_json(seed_history, result.history)
                atomic_write_json(layers, result.layers)
                totals = {"train_samples_per_s": result.samples_per_s, "train_seconds": result.seconds,
                          "skipped_steps_total": result.skipped_steps}
                tracking.log_metrics(totals)
                tracking.log_artifacts([ckpt, seed_history, layers])
                model_uri = None
                if params.mlflow.log_model:
                    cpu_model = model.float().cpu().eval()
                    with cudnn_legacy_flags_readable():
                        model_uri = tracking.log_model(cpu_model, data.test.x[:2].numpy(), _requirements())
        except Diverged as exc:  # the run is already marked FAILED with the reason; other seeds/arms go on
            _log(f"[{arm}] seed {seed}: DIVERGED: {exc}")
            histories[str(seed)] = history
            seeds[str(seed)] = {"run_id": run_id, "diverged": str(exc)}
            continue
        last = result.history[-1]
        _log(f"[{arm}] seed {seed}: val_accuracy {last['val_accuracy']:.4f}, "
             f"{result.samples_per_s:,.0f} samples/s, skipped steps {result.skipped_steps}")
        histories[str(seed)] = result.history
        seeds[str(seed)] = {"run_id": run_id, "model_uri": model_uri, "checkpoint": ckpt.name, **totals,
                            "final": last, "diverged": None}
    ok = [s for s in seeds.values() if not s["diverged"]]
    diverged = {seed: s["diverged"] for seed, s in seeds.items() if s["diverged"]}
    summary = {
        "arm": arm,
        "skipped": None,
        "diverged": diverged or None,
        "ablation": policy.ablation,
        "policy": what_ran,
        "hardware": hw,
        "seeds": seeds,
        "samples_per_s": sum(s["train_samples_per_s"] for s in ok) / len(ok) if ok else None,
        "skipped_steps": sum(s["skipped_steps_total"] for s in ok),
    }
    atomic_write_json(out_dir / HISTORY, histories)
    atomic_write_json(out_dir / SUMMARY, summary)
    return summary


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
