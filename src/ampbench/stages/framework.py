"""The train stage's seeds for a framework's own trainer (``train.framework``: ``lightning`` or ``hf_trainer``).

The same outputs as the pipeline's loop, through the same ``ArmOutputs``: one MLflow run per seed under the
execution's parent, its epochs' metrics, the final checkpoint the evaluate stage loads, the resume checkpoint after
each epoch. What differs is who trains: the user's code under the framework's own precision setting for the arm,
read back as it trains. Each framework is a module of ``frameworks/`` with one shape (``adapter``): ``NAME``,
``check_arm``, ``precision_name``, ``build`` (the seed's model and where its data comes from), ``test_split``,
``reseed``, ``Run`` (one Trainer: ``fit``, ``save``, ``optimizer``) and ``Arm`` (the speed stage's).

- ``preflight``: one real step of the framework under the arm, read back, with FLOPs by dtype: an arm that would
  train as something else stops here, before anything is written (refused, naming the user's line; skipped, with
  why, when the framework itself ignores the arm's flag on this device). Then the model checked as a built-in model
  is (a dry forward and backward, the evaluation's probe: its forward must give the logits) and
  ``train.fp32_modules`` matched.
- ``train_seed``: one seed, resumed from its last finished epoch when the framework's checkpoint of it is there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from ampbench.config.params import Params
from ampbench.data.splits import Prepared
from ampbench.errors import AmpbenchError, ArmUnavailable, DataError, Diverged, ParamsError
from ampbench.models.factory import ModelSpec, check_built
from ampbench.precision.policy import PrecisionPolicy, describe_line, float32_matches, keep_float32
from ampbench.runtime.determinism import set_deterministic
from ampbench.stages import resume
from ampbench.stages.outputs import ArmOutputs, SeedJob
from ampbench.stages.preflight import Preflight
from ampbench.stages.seed_record import diverged_record, seed_record, what_ran
from ampbench.tasks.contract import Task
from ampbench.training.instruments import epoch_line
from ampbench.training.state import EpochRecord

# A framework's checkpoint of a seed's run after an epoch, beside its resume file, which names the one it goes with.
CHECKPOINT_FILE = "seed{seed}.epoch{epoch}.framework.ckpt"


def adapter(params: Params):
    """The ``frameworks/`` module of train.framework."""
    if params.train.framework == "lightning":
        from ampbench.frameworks import lightning

        return lightning
    from ampbench.frameworks import hf

    return hf


def check_arm(policy: PrecisionPolicy, params: Params) -> None:
    """ArmUnavailable (the arm is recorded as skipped, with why) when the framework has no setting for the arm."""
    adapter(params).check_arm(policy, params)


def check_steps(params: Params, data: Prepared, world: Any) -> None:
    """Nothing before the run: the framework's own loaders batch its data (``train.batch_size`` is not theirs), so
    the number of steps is the framework's; a seed that ran no optimizer step is refused after its fit."""


def _check_data(params: Params, data: Prepared) -> None:
    """The prepared data came from the framework's own data (ParamsError otherwise)."""
    if data.meta.get("kind") != "inputs":
        raise ParamsError(f"train.framework: {params.train.framework} trains on your job's own data, so "
                          f"prepare.dataset must name it (package.module:callable); it is {params.prepare.dataset!r}")


def _float32(module: torch.nn.Module, params: Params) -> list[str]:
    try:  # a pattern that matches nothing would silently leave the layer in 16 bits
        return float32_matches(module, params.train.fp32_modules) if params.train.fp32_modules else []
    except ValueError as exc:
        raise ParamsError(str(exc)) from None


def _book(arm: str, policy: PrecisionPolicy, float32: list[str], params: Params, count_flops: bool = False,
          task: Task | None = None):
    from ampbench.frameworks.readback import StepBook
    from ampbench.tasks.resolve import resolve_task

    return StepBook(arm, policy, float32 if policy.low_precision else [], params.train.telemetry_every, window=10,
                    warmup=5, count_flops=count_flops,
                    user_code=(Path(params.train.model_code), Path(params.prepare.dataset_code)),
                    divergence=params.train.divergence,
                    task=task or resolve_task(params.train.task, params.train.block_size))


def _built(arm_policy: PrecisionPolicy, params: Params, device: torch.device) -> tuple[Any, Any, list[str]]:
    """The model and its data source from the user's code, on ``device``, float32 islands on."""
    module, source = adapter(params).build(params)
    module = module.to(device)
    float32 = _float32(module, params) if arm_policy.low_precision else []
    if float32:
        keep_float32(module, float32, arm_policy.device_type, arm_policy.param_dtype)
    return module, source, float32


def preflight(arm: str, policy: PrecisionPolicy, params: Params, data: Prepared, task: Task,
              device: torch.device) -> Preflight:
    """The checks of the module docstring; ModelError, ParamsError or ArmMismatch (one line) before any work,
    ArmUnavailable when the framework itself runs the arm as something else."""
    from ampbench.frameworks.readback import ArmMismatch

    fw, tp = adapter(params), params.train
    _check_data(params, data)
    set_deterministic(tp.deterministic, tp.cudnn_benchmark, tp.compile)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # First what the framework runs, on a model of its own (the checks after it cast theirs to float32): a model
        # that overrides the arm is named here, before a check fails on its consequences.
        module, source, float32 = _built(policy, params, device)
        policy.apply_backend_flags()
        book = _book(arm, policy, float32, params, count_flops=True, task=task)
        book.every = 1
        try:
            fw.Run(policy, params, device, 1, book, module, source, 0, max_steps=1,
                   **({"limit_val_batches": 0, "num_sanity_val_steps": 0} if fw.NAME == "Lightning" else {})).fit()
        except ArmMismatch as exc:
            if exc.framework_ignored:  # nothing of the user's code was running: the framework ignores the flag here
                raise ArmUnavailable(f"{exc} (read back in one step; {fw.NAME}, {fw.precision_name(policy)})"
                                     ) from None
            raise
        model = fw.build(params)[0].to(device)
        identity = check_built(ModelSpec.from_train(tp), model, data.train.x[:2].to(device), task.model_args(data.meta),
                               task, data.train.y[:2], data.test)
    flops = book.flops or {"per_sample": 0, "low_precision_share": 0.0}
    if policy.low_precision and float32 and flops.get("per_sample") and not flops["low_precision_share"]:
        raise ParamsError(f"train.fp32_modules: {list(tp.fp32_modules)} keeps every module that computes in "
                          f"float32, so {arm} would run no 16-bit matmul or convolution and only be labelled {arm}")
    flops["framework_precision"] = fw.precision_name(policy)
    return Preflight({**identity, "kind": params.train.framework}, flops)


def _check_test_split(source: Any, params: Params, data: Prepared, seed: int) -> None:
    """The job's test split for this seed is the one prepare read (DataError otherwise): the arms are paired on it
    example by example, and a seed that drew another split may have trained on test examples."""
    from ampbench.data.prepare import tensors_digest

    x, y = adapter(params).test_split(source)
    if tensors_digest(x.float() if x.is_floating_point() else x, y) != data.meta.get("datamodule_test"):
        raise DataError(f"prepare.dataset {data.meta['dataset']!r}: the test split differs from the one prepare "
                        f"read when seed {seed} is set; split with a fixed generator (e.g. random_split(..., "
                        "generator=torch.Generator().manual_seed(0))), or the arms are not compared on the same "
                        "examples")


def _remove_checkpoints(job: SeedJob, but: Path | None = None) -> None:
    """The seed's framework checkpoints that its resume file no longer names."""
    for path in job.resume_path.parent.glob(CHECKPOINT_FILE.format(seed=job.seed, epoch="*")):
        if path != but:  # a file (Lightning's) or a folder (the Hugging Face Trainer's)
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _start(job: SeedJob, out: ArmOutputs) -> tuple[resume.SeedProgress, Path | None]:
    """Where the seed starts: its progress so far and the framework checkpoint its resume file names (None: from
    scratch), said in one line."""
    fw = adapter(job.params)
    prior = resume.load(job.resume_path, job.arm, job.key)
    saved = job.resume_path.parent / prior[0].get("framework_checkpoint", "-") if prior is not None else None
    if saved is not None and saved.exists():
        out.log(f"seed {job.seed}: resuming after epoch {len(prior[1].records)} of {job.params.train.epochs}")
        return prior[1], saved
    out.log(f"seed {job.seed}: {describe_line(job.policy.describe())}, {fw.NAME} {fw.precision_name(job.policy)}")
    return resume.SeedProgress(job.arm, job.key), None


def train_seed(job: SeedJob, data_dir: Path, out: ArmOutputs,
               flops: dict[str, Any] | None) -> tuple[dict[str, Any], list[EpochRecord]]:
    """Train (or resume, or reuse) one seed through the framework; returns its summary record and its epochs."""
    fw = adapter(job.params)
    prior = resume.load(job.resume_path, job.arm, job.key)
    if prior is not None and prior[1].done is not None:
        out.reused(job)
        if not prior[1].done["diverged"]:
            out.seed_files(job, prior[0]["final"], prior[1].records, prior[1].done["activations"])
        return prior[1].done, prior[1].records
    tp = job.params.train
    progress, saved = _start(job, out)
    fw.reseed(job.seed, 0)  # the model's initial weights: from the seed alone
    module, source, float32 = _built(job.policy, job.params, job.device)
    _check_test_split(source, job.params, job.data, job.seed)
    later_seeds = len(tp.seeds) - 1 - tp.seeds.index(job.seed)

    def on_epoch(record: EpochRecord, run: Any) -> None:
        progress.records.append(record)
        path = job.resume_path.with_name(CHECKPOINT_FILE.format(seed=job.seed, epoch=record.epoch))
        run.save(path)  # first the framework's state, then the progress that names it
        out.epoch(job, {"framework_checkpoint": path.name}, progress)
        _remove_checkpoints(job, but=path)
        out.log(epoch_line(f"seed {job.seed}", record, tp.epochs, tp.epochs - record.epoch + later_seeds * tp.epochs))

    job.policy.apply_backend_flags()
    book = _book(job.arm, job.policy, float32, job.params, task=job.task)
    run = fw.Run(job.policy, job.params, job.device, tp.epochs, book, module, source, job.seed, on_epoch=on_epoch,
                 output_dir=job.resume_path.with_name(f"seed{job.seed}.trainer"),
                 validate=lambda m: job.task.validate(m, job.data.val, job.policy, job.params.evaluate.batch_size))
    try:
        with out.open_run(job, progress.run_id) as run_id:
            progress.run_id = run_id
            if saved is None:
                out.dataset(job, data_dir)
            fw.reseed(job.seed, len(progress.records))  # the loaders' shuffle of the epoch training starts at
            run.fit(saved)
            if not sum(r.optimizer_steps for r in progress.records):
                raise AmpbenchError(f"{job.name}: {fw.NAME} ran no optimizer step (its loaders gave no batch?); "
                                    "its results would be untrained")
            record = _finish(job, out, run, module, book, progress, run_id, flops)
    except Diverged as exc:  # the run is already marked FAILED with the reason; other seeds and arms go on
        record = diverged_record(job, exc, progress, out, flops)
    progress.done = record
    out.seed_done(job, {"final": {"model": module.state_dict()}}, progress)
    _remove_checkpoints(job)
    if not record["diverged"]:
        out.log(f"seed {job.seed}: val_accuracy {progress.records[-1].val_accuracy:.4f}, "
                f"{record['train_samples_per_s']:,.0f} samples/s, skipped steps {record['skipped_steps_total']}")
    return record, progress.records


def _finish(job: SeedJob, out: ArmOutputs, run: Any, module: torch.nn.Module, book: Any,
            progress: resume.SeedProgress, run_id: str, flops: dict[str, Any] | None) -> dict[str, Any]:
    """Inside the seed's run, once the framework is done: its record (what ran read back), numerics, files and
    artifacts."""
    fw = adapter(job.params)
    record = seed_record(job, f"your {fw.NAME} job's own data loading", progress.records, run_id,
                         out.files.checkpoint(job.seed).name, out.node)
    record["flops"] = flops
    if run.optimizer is not None:
        record.update(what_ran(job.policy, module, run.optimizer))
    record["framework"] = {"name": fw.NAME, "precision": run.precision, **book.what_ran()}
    out.numerics(job, run_id, record)
    if hasattr(module, "trainer"):
        module.trainer = None  # the model alone goes into the checkpoint and MLflow, not the Trainer it points to
    paths = out.seed_files(job, {"model": module.state_dict()}, progress.records, record["activations"])
    out.seed_artifacts(job, paths, record, module)
    return record


def speed_arm(arm: str, params: Params, device: torch.device) -> Any:
    """``arm`` for the speed harness: the model built as seed 0's is, under the framework's own trainer (its
    ``Arm``); ArmUnavailable where the device or the framework cannot run it."""
    from ampbench.precision.policy import resolve_policy

    fw = adapter(params)
    policy = resolve_policy(arm, device, params.train.fp32_modules)
    fw.check_arm(policy, params)
    fw.reseed(0, 0)
    module, source, float32 = _built(policy, params, device)
    return fw.Arm(arm, policy, params, device, module, source, float32)


def batches_per_pass(params: Params) -> int:
    """Batches in one pass over the job's training data (the speed stage's windows stay within one)."""
    return adapter(params).batches_per_pass(params)
