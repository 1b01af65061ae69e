"""A trained seed's line in summary.json (``seed_record``; ``diverged_record`` for one the divergence guard stopped)
and what it records of what ran (``what_ran``, ``where``): shared by the pipeline's loop (``train.py``) and a
framework's trainer (``framework.py``)."""

from __future__ import annotations

import socket
import statistics
from typing import Any

import torch

from ampbench.errors import Diverged
from ampbench.report.advice import float32_fix
from ampbench.runtime.hardware import fingerprint, peak_memory_mb
from ampbench.stages import resume
from ampbench.stages.outputs import ArmOutputs, SeedJob
from ampbench.training.activations import merge_tables
from ampbench.training.loop import throughput
from ampbench.training.state import EpochRecord


def what_ran(policy, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Read back from the trained objects: the optimizer's class and rounding, the bytes of weights, gradients
    and optimizer state, and for the fp8 arms each Linear layer converted or left out with why."""
    from ampbench.precision import optimizers

    ran = {"optimizer": optimizers.describe(optimizer), "state_bytes": optimizers.state_bytes(model, optimizer)}
    if policy.float8_recipe:
        from ampbench.precision import float8

        ran["float8"] = float8.record(model, policy.float8_recipe)
    return ran


def where(device: torch.device, node: str | None) -> dict[str, Any]:
    """Where a seed trained: the device's name (one comparison, one device kind: evaluate checks it), the host
    and, for a cluster cell, the Ray node."""
    return {"device": fingerprint(device)["device_name"], "host": socket.gethostname(), "node": node}


def seed_record(job: SeedJob, input_path: str, records: list[EpochRecord], run_id: str,
                checkpoint_name: str, node: str | None) -> dict[str, Any]:
    """The seed's line in summary.json: run id, throughput, memory, time, skips, final metrics; ``input_path``: how
    batches reached the model, in words."""
    seconds = [r.epoch_seconds for r in records]
    record = {"run_id": run_id, "diverged": None, "checkpoint": checkpoint_name, **where(job.device, node),
              "train_samples_per_s": throughput(records), "timing_windows": sum(len(r.windows) for r in records),
              **peak_memory_mb(job.device), "train_seconds": sum(seconds),
              "skipped_steps_total": sum(r.skipped_steps for r in records),
              "optimizer_steps_total": sum(r.optimizer_steps for r in records),
              "input_path": input_path,
              "input_wait_share": sum(r.input_wait_seconds for r in records) / max(sum(seconds), 1e-9),
              "final": records[-1].row(),
              "first_nonfinite": next((r.nonfinite for r in records if r.nonfinite), None),
              "evaluations": evaluation_points(records),
              "activations": merge_tables([r.activations for r in records]),
              "model_uri": None}
    if job.params.train.compile and len(records) > 1:  # the first epoch pays for compilation; estimate it apart
        record["compile_seconds_estimate"] = max(seconds[0] - statistics.median(seconds[1:]), 0.0)
    return record


def evaluation_points(records: list[EpochRecord]) -> list[dict[str, float]]:
    """Every validation loss of the run in order: optimizer step, training seconds since the start (evaluations
    left out), val_loss."""
    points, before = [], 0.0
    for r in records:
        points += [{**e, "seconds": before + e["seconds"]} for e in r.evaluations]
        before += r.epoch_seconds
    return points


def diverged_record(job: SeedJob, exc: Diverged, progress: resume.SeedProgress, out: ArmOutputs,
                    flops: dict | None) -> dict[str, Any]:
    """The record of a seed the divergence guard stopped: the reason, the first non-finite module and the rerun
    that keeps it in float32, the activation table up to the divergence."""
    out.log(f"seed {job.seed}: DIVERGED: {exc}")
    record = {"run_id": progress.run_id, "diverged": str(exc), "first_nonfinite": exc.culprit, "flops": flops,
              **where(job.device, out.node),
              "activations": merge_tables([r.activations for r in progress.records] + [exc.activations])}
    fix = float32_fix(exc.culprit, job.arm) if exc.culprit else None
    if fix:  # a module of a 16-bit arm: never the loss, never an arm that already computes in float32
        record["fix"] = fix
        out.log(f"seed {job.seed}: keep it in float32: {fix}")
    out.numerics(job, progress.run_id, record)
    return record
