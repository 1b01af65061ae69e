"""Train stage orchestration: one arm, every seed: fit → checkpoint each epoch → MLflow run; exact resume.

An interrupted arm leaves a checkpoint per seed under ``resume_dir`` (model, optimizer, scheduler, scaler, RNG
and data-order states, history so far, MLflow run id). Run the stage again with the same params and code and
it continues from the last completed epoch, in the same MLflow run; seeds already finished are not retrained.
``resume_dir`` is removed once the whole arm is done.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from ampbench import checkpoint, distributed, tracking
from ampbench.data import Prepared, Split, load_prepared
from ampbench.determinism import seed_everything, set_deterministic
from ampbench.errors import ArmUnavailable
from ampbench.fileio import atomic_write_json
from ampbench.hardware import fingerprint, peak_memory_mb, reset_peak_memory
from ampbench.models import build_model
from ampbench.params import Params
from ampbench.precision import PrecisionPolicy, cudnn_legacy_flags_readable, resolve_device, resolve_policy
from ampbench.training import Diverged, TrainConfig, TrainResult, fit, init_state

SUMMARY = "summary.json"
HISTORY = "history.json"


def _requirements() -> list[str]:
    import torchvision

    return [f"torch=={torch.__version__.split('+')[0]}", f"torchvision=={torchvision.__version__.split('+')[0]}"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train_config(params: Params, seed: int) -> TrainConfig:
    """The loop's settings for one seed, from the train params."""
    tp = params.train
    return TrainConfig(epochs=tp.epochs, batch_size=tp.batch_size, lr=tp.lr, optimizer=tp.optimizer,
                       weight_decay=tp.weight_decay, momentum=tp.momentum, scheduler=tp.scheduler, seed=seed,
                       progress=tp.progress, clip_grad_norm=tp.clip_grad_norm, telemetry_every=tp.telemetry_every,
                       loss_multiplier=tp.loss_multiplier, scaler_settings=tp.grad_scaler.model_dump(),
                       min_loss_scale=tp.divergence.min_loss_scale,
                       max_consecutive_skips=tp.divergence.max_consecutive_skips)


def resume_key(params: Params, data_checksum: str, arm: str, seed: int, code_version: str) -> str:
    """What must be equal for a checkpoint to be resumed: params that shape training, data, arm, seed, code."""
    train = params.train.model_dump(exclude={"progress", "precisions", "seeds"})
    blob = json.dumps([train, data_checksum, arm, seed, code_version], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def train_arm(arm: str, params: Params, data_dir: Path, out_dir: Path, project_root: Path,
              tags: dict[str, str], resume_dir: Path | None = None, code_version: str = "") -> dict[str, Any]:
    """Train ``arm`` once per seed in ``params.train.seeds``; write checkpoints, history and summary to out_dir.

    An arm the device cannot run is recorded as skipped (with the reason) instead of running as something else;
    a seed stopped by the divergence guard is recorded as diverged. Returns the summary (``out_dir/summary.json``).
    """
    device = resolve_device(params.train.device)
    world = distributed.init(device.type)  # one process, or this rank of a torchrun job
    device = distributed.device_for(world, device)
    try:
        return _train_arm(arm, params, data_dir, out_dir, project_root, tags, resume_dir or out_dir / ".resume",
                          code_version, device, world)
    finally:
        distributed.shutdown(world)


def _train_arm(arm, params, data_dir, out_dir, project_root, tags, resume_dir, code_version, device, world):
    main = world.is_main  # only rank 0 writes files and talks to MLflow
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
    try:
        policy = resolve_policy(arm, device)
    except ArmUnavailable as exc:
        summary = {"arm": arm, "skipped": str(exc), "hardware": fingerprint(device)}
        if main:
            _log(f"[{arm}] skipped: {exc}")
            atomic_write_json(out_dir / HISTORY, {})
            atomic_write_json(out_dir / SUMMARY, summary)
        return summary

    data = load_prepared(data_dir)
    if main:
        tracking.setup(project_root, params.mlflow.experiment)
    seeds = {}
    for seed in params.train.seeds:
        key = resume_key(params, data.meta["checksum"], arm, seed, code_version)
        seeds[str(seed)] = _train_seed(arm, seed, policy, params, data, data_dir, device, out_dir,
                                       resume_dir / f"seed{seed}.pt", key, tags, world)
    distributed.barrier(world)
    ok = [s for s in seeds.values() if not s["diverged"]]
    summary = {
        "arm": arm,
        "skipped": None,
        "diverged": {seed: s["diverged"] for seed, s in seeds.items() if s["diverged"]} or None,
        "ablation": policy.ablation,
        "policy": policy.describe(),
        "world_size": world.size,
        "hardware": fingerprint(device),
        "seeds": {seed: {k: v for k, v in s.items() if k != "history"} for seed, s in seeds.items()},
        # Per arm: median over seeds of each seed's median window throughput; the largest peak memory.
        "samples_per_s": statistics.median(s["train_samples_per_s"] for s in ok) if ok else None,
        "peak_memory_mb": max(s["peak_memory_mb"] for s in ok) if ok else None,
        "skipped_steps": sum(s["skipped_steps_total"] for s in ok),
    }
    if main:
        shutil.rmtree(resume_dir, ignore_errors=True)  # the arm is complete: nothing left to resume
        atomic_write_json(out_dir / HISTORY, {seed: s["history"] for seed, s in seeds.items()})
        atomic_write_json(out_dir / SUMMARY, summary)
    return summary


def _train_seed(arm: str, seed: int, policy: PrecisionPolicy, params: Params, data: Prepared, data_dir: Path,
                device: torch.device, out_dir: Path, resume_path: Path, key: str, tags: dict[str, str],
                world: distributed.World) -> dict:
    """Train (or resume, or reuse) one seed; returns its record for the summary."""
    tp = params.train
    main = world.is_main
    prior = checkpoint.load_resumable(resume_path, arm, key)  # every rank reads it; only rank 0 writes
    if prior is not None and prior["meta"]["done"]:
        if main:
            _log(f"[{arm}] seed {seed}: already finished before the interruption; reusing it")
            if prior["meta"]["record"]["diverged"] is None:
                checkpoint.save_dict(prior, out_dir / f"seed{seed}.pt")
        return prior["meta"]["record"]

    seed_everything(seed)
    set_deterministic(tp.deterministic, tp.cudnn_benchmark)
    policy.apply_backend_flags()
    model = build_model(tp.model, data.input_shape, data.num_classes, tp.width).to(device)
    memory_format = torch.channels_last if tp.channels_last else torch.contiguous_format
    model = policy.prepare_model(model.to(memory_format=memory_format))
    cfg = train_config(params, seed)
    state = init_state(model, policy, cfg, device)
    history: list[dict] = []
    layers: list[dict] = []
    windows: list[float] = []  # throughput of each timing window, samples/s
    run_id = None
    if prior is not None:
        checkpoint.restore(state, prior)
        pm = prior["meta"]
        history, layers, windows, run_id = pm["history"], pm["layers"], pm["windows"], pm["run_id"]
        if main:
            _log(f"[{arm}] seed {seed}: resuming after epoch {state.epoch} of {cfg.epochs}")
    # Wrappers go on after restoring, so checkpoints hold plain keys. Same parameters: the optimizer built
    # above still owns them. DDP averages gradients across ranks; compile wraps the (DDP) model.
    state.model = distributed.wrap(model, world, device)
    if tp.compile:
        state.model = torch.compile(state.model)

    what_ran = policy.describe()
    hw = fingerprint(device)
    meta = {"arm": arm, "seed": seed, "model": tp.model, "width": tp.width, "input_shape": list(data.input_shape),
            "num_classes": data.num_classes, "policy": what_ran, "resume_key": key}
    run_params = {**tracking.flatten("", params.model_dump()), **tracking.flatten("effective", what_ran),
                  "seed": str(seed), "dataset.checksum": data.meta["checksum"], "world_size": str(world.size)}
    run_tags = {**tags, "precision": arm, "seed": str(seed), "device": hw["device_name"],
                "ablation": str(policy.ablation).lower(), "world_size": str(world.size),
                **{f"hw.{k}": v for k, v in hw.items()}, "ampbench.role": "arm"}
    if prior is None and main:
        _log(f"[{arm}] seed {seed}: {what_ran}" + (f", {world.size} ranks" if world.active else ""))

    def on_epoch(row: dict, st) -> None:
        layers.append(row.pop("layers"))
        windows.extend(row.pop("windows"))
        if main:
            tracking.log_epoch(row)  # before the checkpoint: a crash in between repeats the epoch, losing nothing
        row.pop("steps")
        history.append(row)
        if main:
            checkpoint.save(st, {**meta, "history": history, "layers": layers, "windows": windows,
                                 "run_id": run_id, "done": False}, resume_path)

    run_ctx = (tracking.run(f"{arm}-seed{seed}", run_tags, run_params, run_id=run_id) if main
               else contextlib.nullcontext(run_id))
    try:
        with run_ctx as run_id:
            if prior is None and main:
                tracking.log_dataset(data.meta, data_dir)
            reset_peak_memory(device)
            train, val = (Split(s.x.to(device, memory_format=memory_format), s.y.to(device))
                          for s in (data.train, data.val))
            fit(state, train, val, policy, cfg, on_epoch=on_epoch, world=world)
            result = TrainResult(history=history, windows=windows)  # whole run, resumed epochs included
            record = {"run_id": run_id, "diverged": None, "checkpoint": f"seed{seed}.pt",
                      "train_samples_per_s": result.samples_per_s, "timing_windows": len(windows),
                      **peak_memory_mb(device),
                      "train_seconds": sum(r["epoch_seconds"] for r in history),
                      "skipped_steps_total": result.skipped_steps, "final": history[-1], "model_uri": None}
            if tp.compile and len(history) > 1:  # the first epoch pays for compilation; estimate it apart
                rest = statistics.median(r["epoch_seconds"] for r in history[1:])
                record["compile_seconds_estimate"] = max(history[0]["epoch_seconds"] - rest, 0.0)
            if main:
                _save_seed_outputs(state, meta, history, layers, record, out_dir, seed, params, model, data)
    except Diverged as exc:  # the run is already marked FAILED with the reason; other seeds and arms go on
        if main:
            _log(f"[{arm}] seed {seed}: DIVERGED: {exc}")
        record = {"run_id": run_id, "diverged": str(exc)}
    record["history"] = history
    if not main:
        return record
    checkpoint.save(state, {**meta, "history": history, "layers": layers, "windows": windows, "run_id": run_id,
                            "done": True, "record": record}, resume_path)
    if not record["diverged"]:
        _log(f"[{arm}] seed {seed}: val_accuracy {history[-1]['val_accuracy']:.4f}, "
             f"{record['train_samples_per_s']:,.0f} samples/s, skipped steps {record['skipped_steps_total']}")
    return record


def _save_seed_outputs(state, meta, history, layers, record, out_dir, seed, params, model, data) -> None:
    """Rank 0, after a seed finished: final checkpoint, history and telemetry files, MLflow artifacts, model."""
    final = out_dir / f"seed{seed}.pt"
    checkpoint.save(state, meta, final)
    atomic_write_json(out_dir / f"history-seed{seed}.json", history)
    atomic_write_json(out_dir / f"grad_layers-seed{seed}.json", layers)
    tracking.log_metrics({k: v for k, v in record.items() if k in (
        "train_samples_per_s", "train_seconds", "skipped_steps_total", "peak_memory_mb", "peak_reserved_mb")})
    tracking.log_artifacts([final, out_dir / f"history-seed{seed}.json", out_dir / f"grad_layers-seed{seed}.json"])
    if params.mlflow.log_model:
        cpu_model = copy.deepcopy(model).float().cpu().eval()  # the plain model: no DDP/compile wrappers
        with cudnn_legacy_flags_readable():
            record["model_uri"] = tracking.log_model(cpu_model, data.test.x[:2].numpy(), _requirements())
