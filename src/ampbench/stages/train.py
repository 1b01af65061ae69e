"""Train stage: one arm, every seed in train.seeds — fit, a resume checkpoint after each epoch, one MLflow run.

``train_arm``, in order: the device and the arm's policy (an arm the device cannot run is recorded as skipped, never
run as something else, before anything else is paid for); one preflight (``preflight.py``: the model built once,
its dry step, its FLOPs by dtype); then the outputs opened and each seed trained as a ``SeedJob``; the arm's
summary. When a seed is resumed or reused is the policy of
``resume.py``; every side effect (files under models/<arm>/, resume checkpoints, MLflow, log lines) goes through
``ArmOutputs`` (``outputs.py``), which does nothing on DDP ranks other than 0.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from ampbench.config.layout import ArmFiles
from ampbench.config.params import Params
from ampbench.data.loader import batches_per_epoch
from ampbench.data.prepare import load_prepared
from ampbench.data.splits import Prepared
from ampbench.errors import AmpbenchError, ArmUnavailable, Diverged, Interrupted, StoreError
from ampbench.precision.policy import PrecisionPolicy, describe_line, resolve_device, resolve_policy
from ampbench.report.size import estimate, request_size
from ampbench.runtime import distributed
from ampbench.runtime.files import dvc_md5, json_digest
from ampbench.runtime.hardware import fingerprint, reset_peak_memory
from ampbench.stages import resume
from ampbench.stages.outputs import ArmOutputs, ClusterCell, SeedJob
from ampbench.stages.preflight import Preflight, check_steps, preflight
from ampbench.stages.seed_record import diverged_record, seed_record, what_ran
from ampbench.tasks.contract import Task
from ampbench.tasks.resolve import resolve_task
from ampbench.training import checkpoint
from ampbench.training.activations import merge_tables
from ampbench.training.instruments import epoch_line
from ampbench.training.loop import build_run, fit
from ampbench.training.state import EpochRecord, LoopConfig, TrainState


def train_arm(arm: str, params: Params, data_dir: Path, out_dir: Path, project_root: Path, tags: dict[str, str],
              resume_dir: Path, code_version: str = "", cell: ClusterCell | None = None,
              now: list[int] | None = None) -> dict[str, Any]:
    """Train ``arm`` once per seed in ``params.train.seeds``; write checkpoints, history and summary to out_dir.
    A seed stopped by the divergence guard is recorded as diverged. Returns the summary (``summary.json``). A
    cluster ``cell`` trains only its seeds, each kept finished in ``resume_dir`` for the stage that collects them;
    ``now``: only these first seeds, in the execution run of all of them (the looks of an ``ampbench fix`` trial)."""
    device = resolve_device(params.train.device)
    world = distributed.init(device.type)  # one process, or this rank of a torchrun job
    device = distributed.device_for(world, device)
    data_md5 = dvc_md5(data_dir)  # the prepared data's hash as DVC records it: a tag, and the dataset's digest
    out = ArmOutputs(arm, ArmFiles(out_dir), resume_dir, project_root, {**tags, "dvc.data_md5": data_md5},
                     enabled=world.is_main, cell=cell)
    try:
        trainer = who_trains(params)
        try:
            policy, task, data, pre = ready(arm, params, data_dir, device, world)
        except ArmUnavailable as exc:
            if cell is not None:  # a cluster cell placed on a node that cannot run the arm: refuse, never record
                raise
            return _skipped(out, exc, device)
        if plan := request_size(params):
            out.log(plan)
        out.open(params, execution_key(params, data_md5, code_version, tags))
        seeds = {}
        try:
            for seed in cell.seeds if cell else now or params.train.seeds:
                key = resume.resume_key(params.train, data.meta["checksum"], arm, seed, code_version)
                job = SeedJob(arm, seed, params, policy, data, device, world, resume_dir / f"seed{seed}.pt", key,
                              pre.model, task)
                seeds[str(seed)] = trainer.train_seed(job, data_dir, out,
                                                      pre.flops if seed == params.train.seeds[0] else None)
        except StoreError as exc:
            raise StoreError(f"{exc} — the epochs done are kept in {resume_dir}: run the stage again once the "
                             "store works, it continues from there") from None
        distributed.barrier(world)
        summary = _arm_summary(arm, params, policy, device, world, pre.model, {s: r for s, (r, _) in seeds.items()})
        if cell is not None:
            return summary  # the seeds wait in resume_dir; the train stage that collects them writes the arm
        out.finished(summary, {s: [r.row() for r in records] for s, (_, records) in seeds.items()},
                     keep=params.train.keep_finished)
        return summary
    except KeyboardInterrupt as exc:  # the seed's run ended KILLED on the way here; say what the rerun finds
        raise Interrupted(str(exc) or "SIGINT", out.kept_line()) from None
    finally:
        distributed.shutdown(world)


def ready(arm: str, params: Params, data_dir: Path, device: torch.device,
          world: distributed.World = distributed.SINGLE) -> tuple[PrecisionPolicy, Task, Prepared, Preflight]:
    """Everything the train stage checks of ``arm`` before it writes anything: ArmUnavailable when this device or
    train.framework cannot run it (first, so such an arm pays for nothing else; a framework that ignores the arm's
    setting on this device is read back in its preflight's one step), else ModelError, ParamsError or DataError (one
    line) for a model, params or data it would refuse. Returns the arm's policy, the task, the prepared data and the
    preflight. The cluster's head asks it of each arm before sending cells out."""
    trainer = who_trains(params)
    policy = resolve_policy(arm, device, params.train.fp32_modules)
    trainer.check_arm(policy, params)
    task = resolve_task(params.train.task, params.train.block_size)
    data = task.view(load_prepared(data_dir))
    trainer.check_steps(params, data, world)
    return policy, task, data, trainer.preflight(arm, policy, params, data, task, device)


class _PipelineLoop:
    """Who trains by default: the pipeline's own loop (``training.loop.fit``), on every arm the device runs."""

    @staticmethod
    def check_arm(policy, params: Params) -> None:
        """Nothing beyond the device's own check (``resolve_policy``)."""

    check_steps = staticmethod(check_steps)
    preflight = staticmethod(preflight)

    @staticmethod
    def train_seed(job: SeedJob, data_dir: Path, out: ArmOutputs, flops: dict[str, Any] | None):
        return _train_seed(job, data_dir, out, flops)


def who_trains(params: Params):
    """train.framework's trainer, as an object with ``check_arm`` (ArmUnavailable for an arm it cannot run),
    ``check_steps`` (ParamsError for data an epoch would train no step on), ``preflight`` and ``train_seed``: the
    pipeline's loop, or a framework's (``framework.py``)."""
    if params.train.framework != "ampbench":
        from ampbench.stages import framework

        return framework
    return _PipelineLoop


def _skipped(out: ArmOutputs, why: ArmUnavailable, device: torch.device) -> dict[str, Any]:
    """An arm this device cannot run honestly: recorded as skipped, with why (never run as something else), before
    its model is built."""
    out.log(f"skipped: {why}")
    summary = {"arm": out.arm, "skipped": str(why), "hardware": fingerprint(device), "model": None}
    out.finished(summary, {})
    return summary


def execution_key(params: Params, data_md5: str, code_version: str, tags: dict[str, str]) -> str:
    """What every train stage of one pipeline execution shares (so they find one parent run): the training params
    but the arm list, the data, the code and the DVC experiment with its baseline."""
    train = {k: v for k, v in params.train.to_dict().items() if k not in ("precisions", "progress", "keep_finished")}
    shared = {"train": train, "mlflow": params.mlflow.to_dict(), "data": data_md5, "code": code_version,
              "exp": tags.get("dvc.exp_name"), "rev": tags.get("dvc.baseline_rev")}
    return json_digest(shared, 24)


def _arm_summary(arm, params, policy, device, world, model, seeds: dict[str, dict]) -> dict[str, Any]:
    ok = [s for s in seeds.values() if not s["diverged"]]
    return {
        "arm": arm,
        "skipped": None,
        "diverged": {seed: s["diverged"] for seed, s in seeds.items() if s["diverged"]} or None,
        "ablation": policy.ablation,
        "policy": policy.describe(),
        "model": model,
        "epochs": params.train.epochs,
        "world_size": world.size,
        "hardware": fingerprint(device),
        "seeds": seeds,
        # Per arm: median over seeds of each seed's median window throughput; the largest peak memory.
        "samples_per_s": statistics.median(s["train_samples_per_s"] for s in ok) if ok else None,
        "peak_memory_mb": max(s["peak_memory_mb"] for s in ok) if ok else None,
        "skipped_steps": sum(s["skipped_steps_total"] for s in ok),
        "optimizer_steps": sum(s.get("optimizer_steps_total", 0) for s in ok),
        "input_path": ok[0].get("input_path") if ok else None,
        "input_wait_share": statistics.median(s.get("input_wait_share", 0.0) for s in ok) if ok else None,
        # Numerics: FLOPs by dtype of one counted step, the first non-finite module per seed, and the
        # per-module activation ranges of every seed (diverged ones too), closest to fp16's top first.
        "flops": next((s["flops"] for s in seeds.values() if s.get("flops")), None),
        # What ran, read back from the first finished seed: optimizer class and rounding, the bytes of weights,
        # gradients and optimizer state, float8's converted and left-out Linear layers.
        **{k: next((s[k] for s in ok if s.get(k)), None) for k in ("optimizer", "state_bytes", "float8",
                                                                    "framework")},
        "first_nonfinite": {seed: s["first_nonfinite"] for seed, s in seeds.items() if s.get("first_nonfinite")},
        "activations": merge_tables([s.get("activations") or [] for s in seeds.values()]),
    }


def _build(job: SeedJob) -> tuple[torch.nn.Module, TrainState, LoopConfig]:
    """Seeded, deterministic (if asked) model and fresh training state for ``job``."""
    tp = job.params.train
    return build_run(tp, job.policy, job.contract, job.device, job.seed, job.data.train, job.task,
                     eval_every=eval_interval(tp.eval_every, batches_per_epoch(len(job.data.train), tp.batch_size,
                                                                               job.world.size)))


def eval_interval(eval_every: int | None, batches: int) -> int:
    """train.eval_every as steps: null gives four evaluations per epoch (the last at the epoch's end)."""
    return max(1, batches // 4) if eval_every is None else eval_every


def _train_seed(job: SeedJob, data_dir: Path, out: ArmOutputs,
                flops: dict[str, Any] | None) -> tuple[dict[str, Any], list[EpochRecord]]:
    """Train (or resume, or reuse) one seed; returns its summary record and its epochs. ``flops``: the preflight's
    counted step, recorded with the first seed."""
    prior = resume.load(job.resume_path, job.arm, job.key)  # every rank reads it; only rank 0 writes
    if prior is not None and prior[1].done is not None:
        ck, progress = prior
        out.reused(job)
        if not progress.done["diverged"]:
            out.seed_files(job, ck, progress.records, progress.done["activations"])
        return progress.done, progress.records
    model, state, cfg = _build(job)
    progress = resume.SeedProgress(job.arm, job.key)
    if prior is not None:
        checkpoint.restore(state, prior[0])
        progress = prior[1]
        out.log(f"seed {job.seed}: resuming after epoch {state.epoch} of {job.params.train.epochs}")
    else:
        ranks = f", {job.world.size} ranks" if job.world.active else ""
        out.log(f"seed {job.seed}: {describe_line(job.policy.describe())}{ranks}")
    # Wrappers go on after restoring, so checkpoints hold plain keys. Same parameters: the optimizer built
    # above still owns them. DDP averages gradients across ranks; compile wraps the (DDP) model.
    state.model = distributed.wrap(model, job.world, job.device)
    if job.params.train.compile:
        state.model = torch.compile(state.model)
    try:
        record = _fit_in_run(job, model, state, cfg, progress, data_dir, out, flops, fresh=prior is None)
    except Diverged as exc:  # the run is already marked FAILED with the reason; other seeds and arms go on
        record = diverged_record(job, exc, progress, out, flops)
    progress.done = record
    out.seed_done(job, state, progress)
    if not record["diverged"]:
        out.log(f"seed {job.seed}: val_accuracy {progress.records[-1].val_accuracy:.4f}, "
                f"{record['train_samples_per_s']:,.0f} samples/s, skipped steps {record['skipped_steps_total']}")
    return record, progress.records


def _fit_in_run(job: SeedJob, model: torch.nn.Module, state: TrainState, cfg: LoopConfig,
                progress: resume.SeedProgress, data_dir: Path, out: ArmOutputs, flops: dict | None,
                fresh: bool) -> dict[str, Any]:
    """Fit inside the seed's MLflow run (a checkpoint and the epoch's metrics after each epoch); then its record,
    files and artifacts. Returns the record (``seed_record``)."""
    tp = job.params.train
    later_seeds = len(tp.seeds) - 1 - tp.seeds.index(job.seed)

    def on_epoch(record: EpochRecord, st: TrainState) -> None:
        progress.records.append(record)
        out.epoch(job, st, progress)
        out.log(epoch_line(f"seed {job.seed}", record, tp.epochs, tp.epochs - record.epoch + later_seeds * tp.epochs))
        if record.epoch == 1 and job.seed == tp.seeds[0] and request_size(job.params):
            out.log(estimate(record, job.params))

    with out.open_run(job, progress.run_id) as run_id:
        progress.run_id = run_id
        if fresh:
            out.dataset(job, data_dir)
        reset_peak_memory(job.device)
        fit(state, job.data.train, job.data.val, job.policy, cfg, on_epoch=on_epoch, world=job.world)
        if not sum(r.optimizer_steps for r in progress.records):  # a safety net behind check_steps
            raise AmpbenchError(f"{job.name}: training ran no optimizer step; its results would be untrained")
        record = seed_record(job, "device tensors" if cfg.on_device else "streaming DataLoader", progress.records,
                             run_id, out.files.checkpoint(job.seed).name, out.node)
        record["flops"] = flops
        record.update(what_ran(job.policy, model, state.optimizer))
        out.numerics(job, run_id, record)
        paths = out.seed_files(job, checkpoint.state_dict(state), progress.records, record["activations"])
        out.seed_artifacts(job, paths, record, model)
    return record
