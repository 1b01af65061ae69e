"""The train stage's seeds for a framework's own trainer (``train.framework: lightning``).

The same outputs as the pipeline's loop, through the same ``ArmOutputs``: one MLflow run per seed under the
execution's parent, its epochs' metrics, the final checkpoint the evaluate stage loads, the resume checkpoint after
each epoch (Lightning's own checkpoint of the run beside it). What differs is who trains: the user's module under
the Lightning plugin that means the arm (``frameworks/lightning.py``), read back as it trains.

- ``preflight``: the module built once and checked as a built-in model is (a dry forward and backward, the
  evaluation's probe on the test split: forward must give the logits), ``train.fp32_modules`` matched, then one
  real Lightning step under the arm with the read-back and FLOPs by dtype: an arm that would train as something
  else stops here, before anything is written.
- ``train_seed``: one seed, resumed from its last finished epoch when a checkpoint is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ampbench.config.params import Params
from ampbench.config.user_code import first_line, import_callable
from ampbench.data.splits import Prepared
from ampbench.errors import DataError, ModelError, ParamsError
from ampbench.models.factory import ModelSpec, build_for, check_built
from ampbench.precision.policy import PrecisionPolicy, describe_line, float32_matches, keep_float32
from ampbench.runtime.determinism import set_deterministic
from ampbench.stages import resume
from ampbench.stages.outputs import ArmOutputs, SeedJob
from ampbench.stages.preflight import Preflight
from ampbench.tasks.contract import Task
from ampbench.training.instruments import epoch_line
from ampbench.training.state import EpochRecord

# Lightning's checkpoint of a seed's run after an epoch, beside its resume file, which names the one it goes with.
LIGHTNING_FILE = "seed{seed}.epoch{epoch}.lightning.ckpt"


def _module(params: Params) -> torch.nn.Module:
    """``train.model(**train.model_args)``: a LightningModule (ModelError otherwise)."""
    import lightning.pytorch as L

    module = build_for(ModelSpec.from_train(params.train), {})
    if not isinstance(module, L.LightningModule):
        raise ModelError(f"train.model {params.train.model!r} built a {type(module).__name__}, not a "
                         "LightningModule (train.framework: lightning)")
    return module


def _datamodule(params: Params) -> Any:
    """``prepare.dataset(**prepare.dataset_args)``: the LightningDataModule prepare read the splits from."""
    from ampbench.data.datamodule import is_datamodule

    p = params.prepare
    try:
        dm = import_callable(p.dataset, "prepare.dataset", DataError)(**p.dataset_args)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"prepare.dataset {p.dataset!r}: calling it failed ({type(exc).__name__}: "
                        f"{first_line(exc)})") from None
    if not is_datamodule(dm):
        raise ParamsError(f"train.framework: lightning trains on a LightningDataModule; prepare.dataset "
                          f"{p.dataset!r} gives a {type(dm).__name__}")
    return dm


def check_data(params: Params, data: Prepared) -> None:
    """The prepared data came from a LightningDataModule (ParamsError otherwise)."""
    if data.meta.get("kind") != "inputs":
        raise ParamsError(f"train.framework: lightning trains on your LightningDataModule's loaders, so "
                          f"prepare.dataset must name it (package.module:Class); it is {params.prepare.dataset!r}")


def check_arm(policy: PrecisionPolicy, params: Params) -> None:
    """ArmUnavailable (the arm is recorded as skipped, with why) when Lightning has no plugin for the arm."""
    from ampbench.frameworks.lightning import plugin

    plugin(policy, params.train.grad_scaler)


def _float32(module: torch.nn.Module, params: Params) -> list[str]:
    try:  # a pattern that matches nothing would silently leave the layer in 16 bits
        return float32_matches(module, params.train.fp32_modules) if params.train.fp32_modules else []
    except ValueError as exc:
        raise ParamsError(str(exc)) from None


def _book(arm: str, policy: PrecisionPolicy, float32: list[str], params: Params, count_flops: bool = False):
    from ampbench.frameworks.readback import StepBook

    return StepBook(arm, policy, float32 if policy.low_precision else [], params.train.telemetry_every, window=10,
                    warmup=5, count_flops=count_flops)


def preflight(arm: str, policy: PrecisionPolicy, params: Params, data: Prepared, task: Task,
              device: torch.device) -> Preflight:
    """The checks of the module docstring; ModelError, ParamsError or ArmMismatch (one line) before any work."""
    from ampbench.frameworks import lightning

    tp = params.train
    check_data(params, data)
    set_deterministic(tp.deterministic, tp.cudnn_benchmark, tp.compile)
    contract = task.model_args(data.meta)  # what the task checks the module's output against, not passed to it
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # First what Lightning runs, on a module of its own (the checks after it cast their module to float32):
        # a module that overrides the arm is named here, before a check fails on its consequences.
        module = _module(params).to(device)
        float32 = _float32(module, params)
        if float32 and policy.low_precision:
            keep_float32(module, float32, policy.device_type, policy.param_dtype)
        policy.apply_backend_flags()
        book = _book(arm, policy, float32, params, count_flops=True)
        trainer = lightning.trainer(policy, tp.grad_scaler, device, 1, tp.deterministic, lightning.ReadBack(book, 0),
                                    max_steps=1, limit_val_batches=0, num_sanity_val_steps=0)
        lightning.fit(trainer, module, _datamodule(params))
        identity = check_built(ModelSpec.from_train(tp), _module(params).to(device), data.train.x[:2].to(device),
                               contract, task, data.train.y[:2], data.test)
    flops = book.flops or {"per_sample": 0, "low_precision_share": 0.0}
    if policy.low_precision and float32 and flops.get("per_sample") and not flops["low_precision_share"]:
        raise ParamsError(f"train.fp32_modules: {list(tp.fp32_modules)} keeps every module that computes in "
                          f"float32, so {arm} would run no 16-bit matmul or convolution and only be labelled {arm}")
    flops["lightning_precision"] = lightning.plugin_name(trainer.precision_plugin)
    return Preflight({**identity, "kind": "lightning"}, flops)


def _check_test_split(dm: Any, data: Prepared, seed: int) -> None:
    """The datamodule's test split for this seed is the one prepare read (DataError otherwise): the arms are paired
    on it example by example, and a seed that drew another split may have trained on test examples."""
    from ampbench.data.datamodule import loader_tensors
    from ampbench.data.prepare import tensors_digest

    if callable(getattr(dm, "prepare_data", None)):
        dm.prepare_data()
    dm.setup("test")
    x, y = loader_tensors(dm.test_dataloader, "the datamodule's test_dataloader")
    if tensors_digest(x.float() if x.is_floating_point() else x, y) != data.meta.get("datamodule_test"):
        raise DataError(f"prepare.dataset {data.meta['dataset']!r}: the test split differs from the one prepare "
                        f"read when seed {seed} is set; split with a fixed generator (e.g. random_split(..., "
                        "generator=torch.Generator().manual_seed(0))), or the arms are not compared on the same "
                        "examples")


def _remove_lightning_checkpoints(job: SeedJob, but: Path | None = None) -> None:
    """The seed's Lightning checkpoints that its resume file no longer names."""
    for path in job.resume_path.parent.glob(LIGHTNING_FILE.format(seed=job.seed, epoch="*")):
        if path != but:
            path.unlink(missing_ok=True)


def _start(job: SeedJob, out: ArmOutputs) -> tuple[resume.SeedProgress, Path | None]:
    """Where the seed starts: its progress so far and the Lightning checkpoint its resume file names (None: from
    scratch), said in one line."""
    from ampbench.frameworks import lightning

    prior = resume.load(job.resume_path, job.arm, job.key)
    saved = job.resume_path.parent / prior[0].get("lightning_checkpoint", "-") if prior is not None else None
    if saved is not None and saved.is_file():
        out.log(f"seed {job.seed}: resuming after epoch {len(prior[1].records)} of {job.params.train.epochs}")
        return prior[1], saved
    out.log(f"seed {job.seed}: {describe_line(job.policy.describe())}, Lightning precision "
            f"{lightning.plugin_name(lightning.plugin(job.policy, job.params.train.grad_scaler))}")
    return resume.SeedProgress(job.arm, job.key), None


def _built(job: SeedJob) -> tuple[torch.nn.Module, Any, list[str]]:
    """The seed's module (initial weights from the seed alone, float32 islands on), its datamodule (its test split
    checked) and the modules kept in float32."""
    from ampbench.frameworks import lightning

    lightning.reseed(job.seed, 0)
    module = _module(job.params).to(job.device)
    dm = _datamodule(job.params)
    _check_test_split(dm, job.data, job.seed)
    float32 = _float32(module, job.params) if job.policy.low_precision else []
    if float32:
        keep_float32(module, float32, job.policy.device_type, job.policy.param_dtype)
    return module, dm, float32


def train_seed(job: SeedJob, data_dir: Path, out: ArmOutputs,
               flops: dict[str, Any] | None) -> tuple[dict[str, Any], list[EpochRecord]]:
    """Train (or resume, or reuse) one seed through Lightning; returns its summary record and its epochs."""
    from ampbench.frameworks import lightning

    prior = resume.load(job.resume_path, job.arm, job.key)
    if prior is not None and prior[1].done is not None:
        out.reused(job)
        out.seed_files(job, prior[0]["final"], prior[1].records, [])
        return prior[1].done, prior[1].records
    tp = job.params.train
    progress, saved = _start(job, out)
    module, dm, float32 = _built(job)
    later_seeds = len(tp.seeds) - 1 - tp.seeds.index(job.seed)

    def on_epoch(record: EpochRecord, trainer: Any) -> None:
        progress.records.append(record)
        path = job.resume_path.with_name(LIGHTNING_FILE.format(seed=job.seed, epoch=record.epoch))
        lightning.save(trainer, path)  # first Lightning's state, then the progress that names it
        out.epoch(job, {"lightning_checkpoint": path.name}, progress)
        _remove_lightning_checkpoints(job, but=path)
        out.log(epoch_line(f"seed {job.seed}", record, tp.epochs, tp.epochs - record.epoch + later_seeds * tp.epochs))

    job.policy.apply_backend_flags()
    book = _book(job.arm, job.policy, float32, job.params)
    readback = lightning.ReadBack(book, job.seed, on_epoch=on_epoch, validate=lambda m: job.task.validate(
        m, job.data.val, job.policy, job.params.evaluate.batch_size))
    trainer = lightning.trainer(job.policy, tp.grad_scaler, job.device, tp.epochs, tp.deterministic, readback)
    with out.open_run(job, progress.run_id) as run_id:
        progress.run_id = run_id
        if saved is None:
            out.dataset(job, data_dir)
        lightning.reseed(job.seed, len(progress.records))  # the loaders' shuffle of the epoch training starts at
        lightning.fit(trainer, module, dm, saved)
        record = _finish(job, out, trainer, module, book, progress, run_id, flops)
    progress.done = record
    out.seed_done(job, {"final": {"model": module.state_dict()}}, progress)
    _remove_lightning_checkpoints(job)
    out.log(f"seed {job.seed}: val_accuracy {progress.records[-1].val_accuracy:.4f}, "
            f"{record['train_samples_per_s']:,.0f} samples/s, skipped steps {record['skipped_steps_total']}")
    return record, progress.records


def _finish(job: SeedJob, out: ArmOutputs, trainer: Any, module: torch.nn.Module, book: Any,
            progress: resume.SeedProgress, run_id: str, flops: dict[str, Any] | None) -> dict[str, Any]:
    """Inside the seed's run, once Lightning is done: its record (what ran read back), numerics, files and
    artifacts."""
    from ampbench.frameworks import lightning
    from ampbench.stages.seed_record import seed_record, what_ran

    record = seed_record(job, "your LightningDataModule's loaders", progress.records, run_id,
                         out.files.checkpoint(job.seed).name, out.node)
    record["flops"] = flops
    if trainer.optimizers:
        record.update(what_ran(job.policy, module, trainer.optimizers[0]))
    record["framework"] = {"name": "Lightning", "precision": lightning.plugin_name(trainer.precision_plugin),
                           **book.what_ran()}
    out.numerics(job, run_id, record)
    module.trainer = None  # the model alone goes into the checkpoint and MLflow, not the Trainer it points to
    paths = out.seed_files(job, {"model": module.state_dict()}, progress.records, [])
    out.seed_artifacts(job, paths, record, module)
    return record


def speed_arm(arm: str, params: Params, device: torch.device) -> Any:
    """``arm`` for the speed harness: the module built as seed 0's is, under Lightning's Trainer
    (``frameworks.lightning.LightningArm``); ArmUnavailable where the device or Lightning cannot run it."""
    from ampbench.frameworks import lightning
    from ampbench.precision.policy import resolve_policy

    tp = params.train
    policy = resolve_policy(arm, device, tp.fp32_modules)
    check_arm(policy, params)
    lightning.reseed(0, 0)
    module = _module(params).to(device)
    float32 = _float32(module, params) if policy.low_precision else []
    if float32:
        keep_float32(module, float32, policy.device_type, policy.param_dtype)
    return lightning.LightningArm(arm, policy, module, _datamodule(params), tp.grad_scaler, device,
                                  tp.deterministic, float32)


def batches_per_pass(params: Params) -> int:
    """Batches in one pass over the datamodule's training loader (the speed stage's windows stay within one)."""
    dm = _datamodule(params)
    if callable(getattr(dm, "prepare_data", None)):
        dm.prepare_data()
    dm.setup("fit")
    return len(dm.train_dataloader())
