"""One arm's seeds as the train stage sees them: what each seed trains from (``SeedJob``) and every side effect
of training them (``ArmOutputs``: files under models/<arm>/, resume checkpoints, MLflow runs, log lines), which
does nothing on DDP ranks other than 0, so the training code never asks which rank it is.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ampbench import tracking
from ampbench.config.layout import ArmFiles
from ampbench.config.params import Params
from ampbench.data.splits import Prepared
from ampbench.models.factory import ModelSpec
from ampbench.precision.policy import PrecisionPolicy, cudnn_legacy_flags_readable, plain_model
from ampbench.runtime import distributed, signals
from ampbench.runtime.console import log
from ampbench.runtime.files import atomic_write_json
from ampbench.runtime.hardware import fingerprint
from ampbench.stages import resume
from ampbench.tasks.contract import Task
from ampbench.training import checkpoint
from ampbench.training.state import EpochRecord, TrainState


@dataclass(frozen=True)
class SeedJob:
    """One seed of one arm: everything its training reads."""

    arm: str
    seed: int
    params: Params
    policy: PrecisionPolicy
    data: Prepared
    device: torch.device
    world: distributed.World
    resume_path: Path  # .resume/<arm>/seed<N>.pt
    key: str  # resume.resume_key(): what a checkpoint must match to be continued
    model: dict[str, Any]  # models.factory.check_built(): name, kind, args, parameters, FLOPs per sample
    task: Task  # train.task resolved (task.resolve_task)

    @property
    def name(self) -> str:
        return f"{self.arm}-seed{self.seed}"

    def model_meta(self) -> dict[str, Any]:
        """What the evaluate stage needs to rebuild the model from a final checkpoint."""
        return {"arm": self.arm, "seed": self.seed, "model": ModelSpec.from_train(self.params.train).to_meta(),
                "task": self.params.train.task, "contract": self.contract, "policy": self.policy.describe()}

    @property
    def contract(self) -> dict[str, Any]:
        """What the model factory gets for this data (``Task.model_args``)."""
        # A framework's module is built from train.model_args alone, as the user's own script builds it.
        return {} if self.params.train.framework != "ampbench" else self.task.model_args(self.data.meta)


@dataclass(frozen=True)
class ClusterCell:
    """A cluster cell's share of an arm (``ampbench cluster repro``): the seeds it trains, the cluster
    execution's parent run they nest under, and the Ray node it runs on (recorded with each seed)."""

    seeds: tuple[int, ...]
    parent_run: str
    node: str


class ArmOutputs:
    """Every side effect of training one arm. With ``enabled`` False (DDP ranks other than 0) it does nothing."""

    def __init__(self, arm: str, files: ArmFiles, resume_dir: Path, project_root: Path, tags: dict[str, str],
                 enabled: bool, cell: ClusterCell | None = None):
        self.arm, self.files, self.resume_dir = arm, files, resume_dir
        self.project_root, self.tags, self.enabled = project_root, tags, enabled
        self.node = cell.node if cell else None
        # The execution's parent run: a cell's is given; else found or made when the first seed opens its run
        # (``tracking.execution_parent``), so a stage that only collects finished seeds makes no empty parent.
        self.parent: str | None = cell.parent_run if cell else None
        self._find_parent = None
        self.kept: dict[int, str] = {}  # seed → what its resume checkpoint holds, for an interruption's line
        self.complete = False  # summary.json written: the arm's outputs are all there

    def log(self, msg: str) -> None:
        if self.enabled:
            log(f"[{self.arm}] {msg}")

    def open(self, params: Params, execution: str) -> None:
        """Before any training: the output folder, the MLflow store checked and ready, and the parent run of this
        pipeline execution (``execution``: its key) found or made, named after the DVC experiment or the commit.
        The values every arm shares (prepare.*, mlflow.*) are its params, not each arm run's."""
        if self.enabled:
            self.files.root.mkdir(parents=True, exist_ok=True)
            experiment_id = tracking.setup(self.project_root, params.mlflow.experiment)
            if self.parent is None:
                self._find_parent = lambda: tracking.execution_parent(
                    experiment_id, execution, tracking.execution_name(self.tags), self.arm, self.tags,
                    execution_params(params))

    def open_run(self, job: SeedJob, run_id: str | None):
        """The seed's MLflow run (reopened when ``run_id`` is given), as a context yielding its id."""
        if not self.enabled:
            return contextlib.nullcontext(run_id)
        if self.parent is None and self._find_parent is not None:
            self.parent = self._find_parent()
        if self.node and run_id is None:  # a cluster cell: an earlier attempt lost with its node ends KILLED
            tracking.close_lost_attempts(self.parent, self.arm, job.seed, self.node)
        hw = fingerprint(job.device)
        world = str(job.world.size)
        params = {**tracking.flatten("train", job.params.train.to_dict()),
                  **tracking.flatten("effective", job.policy.describe()),
                  **tracking.flatten("model", {k: job.model[k] for k in ("kind", "parameters", "flops_per_sample")}),
                  "seed": str(job.seed), "dataset.checksum": job.data.meta["checksum"], "world_size": world}
        tags = {**self.tags, "precision": job.arm, "seed": str(job.seed), "device": hw["device_name"],
                "ablation": str(job.policy.ablation).lower(), "world_size": world,
                **{f"hw.{k}": v for k, v in hw.items()}, "ampbench.role": "arm",
                **({"ray.node_id": self.node} if self.node else {})}
        return tracking.open_run(job.name, tags, params, run_id=run_id, parent_id=self.parent,
                            system_metrics_every=job.params.mlflow.system_metrics_every)

    def dataset(self, job: SeedJob, data_dir: Path) -> None:
        if self.enabled:
            tracking.log_dataset(job.data.meta["dataset"], self.tags["dvc.data_md5"], data_dir)

    def epoch(self, job: SeedJob, state: TrainState, progress: resume.SeedProgress) -> None:
        """After an epoch: its metrics to MLflow, then the resume checkpoint (a crash in between repeats the
        epoch, losing nothing)."""
        if self.enabled:
            record = progress.records[-1]
            evaluations = [{"step": e["step"], "val_loss": e["val_loss"]} for e in record.evaluations]
            tracking.log_epoch(record.row(), record.steps + evaluations)  # step/val_loss: by optimizer step
            resume.save(state, progress, job.resume_path)
            self.kept[job.seed] = f"after epoch {record.epoch} of {job.params.train.epochs}"

    def seed_done(self, job: SeedJob, state: TrainState, progress: resume.SeedProgress) -> None:
        """A seed ended (finished or diverged): keep its outcome in the resume checkpoint until the arm is done."""
        if self.enabled:
            resume.save(state, progress, job.resume_path)
            self.kept[job.seed] = "finished"

    def reused(self, job: SeedJob) -> None:
        """A seed found finished in its resume checkpoint (an interrupted run, a cluster cell, a shorter seed list)."""
        self.kept[job.seed] = "finished"
        self.log(f"seed {job.seed}: finished earlier (an interrupted run, a cluster cell or a shorter seed list); "
                 "reusing it")

    def kept_line(self) -> str:
        """What an interruption leaves for the rerun, in words (the stage's one line)."""
        where = self.resume_dir
        if self.complete:
            return (f"the arm had completed; its {len(self.kept)} seed(s) are kept in {where}, and running the stage "
                    "again reuses them without training")
        if not self.kept:
            return "nothing to keep yet (no epoch had finished); running the stage again starts over"
        seeds = ", ".join(f"seed {seed} {what}" for seed, what in self.kept.items())
        return (f"kept in {where}: {seeds}; running the stage again continues from there (finished seeds are "
                "reused, not trained again)")

    def seed_files(self, job: SeedJob, final: dict[str, Any], records: list[EpochRecord],
                   activations: list[dict]) -> list[Path]:
        """The seed's files under models/<arm>/: final checkpoint, history, per-layer telemetry, and its activation
        table (the seed's epochs merged, ``training.activations.merge_tables``)."""
        if not self.enabled:
            return []
        files = self.files
        checkpoint_path = files.checkpoint(job.seed)
        checkpoint.write(final, job.model_meta(), checkpoint_path)
        atomic_write_json(files.seed_history(job.seed), [r.row() for r in records])
        atomic_write_json(files.grad_layers(job.seed), [r.layers for r in records])
        atomic_write_json(files.activations(job.seed), activations)
        return [checkpoint_path, files.seed_history(job.seed), files.grad_layers(job.seed),
                files.activations(job.seed)]

    def numerics(self, job: SeedJob, run_id: str | None, record: dict[str, Any]) -> None:
        """Onto the seed's run (open or ended): the first non-finite module as tags, the activation table and the
        counted FLOPs as files; for a diverged seed the table is also written to models/<arm>/."""
        if not self.enabled or run_id is None:
            return
        culprit = record.get("first_nonfinite")
        keys = ("module", "module_type", "phase", "step") if culprit else ()
        tags = {f"nonfinite.{k}": str(culprit[k]) for k in keys}
        metrics = {}
        if record.get("flops"):
            f = record["flops"]
            metrics = {"flops_per_sample_train": f["per_sample"], "low_precision_flop_share": f["low_precision_share"]}
            tags["flops.dominant_dtype"] = str(f["dominant_dtype"])
        tags.update(what_ran_tags(record))
        if record.get("state_bytes"):
            b = record["state_bytes"]
            metrics.update({"state_bytes_total": b["total"], "state_bytes_per_parameter": b["per_parameter"]})
        paths = []
        if record.get("diverged") and record.get("activations"):
            atomic_write_json(self.files.activations(job.seed), record["activations"])
            paths.append(self.files.activations(job.seed))
        tracking.log_to(run_id, metrics, tags, artifacts=paths)

    def seed_artifacts(self, job: SeedJob, paths: list[Path], record: dict[str, Any], model: torch.nn.Module) -> None:
        """Into the seed's (still open) MLflow run: run-level numbers, its files, and the model when asked for."""
        if not self.enabled:
            return
        tracking.log_metrics({k: v for k, v in record.items() if k in (
            "train_samples_per_s", "train_seconds", "skipped_steps_total", "peak_memory_mb", "peak_reserved_mb")})
        tracking.log_artifacts(paths)
        if job.params.mlflow.log_model:
            # the plain model: no DDP/compile wrappers, no float32 islands or float8 layers (both belong to the arm)
            cpu_model = plain_model(copy.deepcopy(model)).float().cpu().eval()
            with cudnn_legacy_flags_readable():
                example = job.data.test.inputs(job.data.test.x[:2]).numpy()  # model inputs, not stored pixels
                record["model_uri"] = tracking.log_model(cpu_model, example, _requirements())

    def finished(self, summary: dict[str, Any], histories: dict[str, list[dict]], keep: bool = False) -> None:
        """The arm is complete: history.json and summary.json; nothing left to resume (``keep``: the finished
        seeds stay, for a later run with more seeds).

        The finished seeds are removed from the resume folder last, once a signal can no longer fail the stage
        (``signals.settle``): until then an interruption exits 130 with the seeds kept, and the rerun (DVC runs a
        failed stage again) reuses them; never a completed arm trained twice, never two FINISHED runs of a seed."""
        if self.enabled:
            atomic_write_json(self.files.history, {"arm": self.arm, "seeds": histories})  # bound to its arm
            atomic_write_json(self.files.summary, summary)
            self.complete = True
            if not keep:
                signals.settle()
                shutil.rmtree(self.resume_dir, ignore_errors=True)


def execution_params(params: Params) -> dict[str, str]:
    """The params an execution's parent run holds: what every arm shares (all but evaluate.* and the arm list)."""
    shared = {k: v for k, v in params.to_dict().items() if k != "evaluate"}
    shared["train"] = {k: v for k, v in shared["train"].items() if k != "precisions"}
    return tracking.flatten("", shared)


def what_ran_tags(record: dict[str, Any]) -> dict[str, str]:
    """MLflow tags of what a seed really ran: optimizer class and rounding, float8's converted and left-out
    Linear layers (cut to MLflow's 5,000 characters per tag)."""
    tags = {f"optimizer.{k.removeprefix('optimizer_')}": v for k, v in (record.get("optimizer") or {}).items()}
    fw = record.get("framework")
    if fw:  # a framework's trainer: its precision setting and what was read back
        tags.update({f"framework.{k}": ",".join(v) if isinstance(v, list) else str(v) for k, v in fw.items()})
    f8 = record.get("float8")
    if f8:
        rows = f8["modules"]
        tags["float8.recipe"] = f8["recipe"]
        tags["float8.converted"] = (", ".join(r["module"] for r in rows if r["converted"]) or "none")[:5000]
        tags["float8.left_out"] = ("; ".join(f"{r['module']}: {r['reason']}" for r in rows if not r["converted"])
                                   or "none")[:5000]
    return tags


def _requirements() -> list[str]:
    """The logged model's pip requirements; torchvision's version from its metadata (importing it costs ~1.4 s)."""
    from importlib.metadata import version

    return [f"torch=={torch.__version__.split('+')[0]}", f"torchvision=={version('torchvision').split('+')[0]}"]
