"""What the train stage checks before an arm trains, once and before anything is written.

- ``check_request``: the arm is one of train.precisions, a cluster cell's options belong together, and your model or
  task code lies in the path its code param names (so that DVC reruns the stages that import it).
- ``check_steps``: a configuration under which an epoch would run no optimizer step.
- ``preflight``: the arm's model built once. A dry forward and backward and a probe of the task's evaluation
  (``models.factory.check_built``: a model that does not fit the data, a task that breaks its contract);
  ``train.fp32_modules`` and float8's layers matched on it; then one training step under the arm's policy, counted
  by dtype (``training.flops``): what the arm records as its FLOPs by dtype, and what refuses a 16-bit arm left
  with no 16-bit work. The random number generators are left as they were, so training is unchanged.

The train stage resolves the arm's policy first: an arm this device cannot run is recorded as skipped before any of
this is paid for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ampbench.config import arms
from ampbench.config.params import Params
from ampbench.config.rules import float8_needs_compile
from ampbench.config.user_code import require_tracked
from ampbench.data.loader import batches_per_epoch
from ampbench.data.splits import Prepared
from ampbench.errors import ParamsError
from ampbench.models.factory import ModelSpec, build_for, check_built
from ampbench.precision.policy import PrecisionPolicy, float32_matches
from ampbench.runtime import distributed
from ampbench.runtime.determinism import set_deterministic
from ampbench.stages.outputs import ClusterCell
from ampbench.tasks.contract import Task
from ampbench.training.flops import count_step_flops
from ampbench.training.loop import memory_format

COUNTED_SAMPLES = 16  # the counted step's batch (at most train.batch_size): FLOPs are per sample, weights unused


@dataclass(frozen=True)
class Preflight:
    """What the checks found out about the arm's model: its identity (``check_built``: name, kind, args, parameter
    count, forward FLOPs per sample) and one training step's FLOPs by dtype under the arm (``flop_summary``, with
    the TF32 setting read back)."""

    model: dict[str, Any]
    flops: dict[str, Any]


def check_request(arm: str, params: Params, root: Path, cell_seeds: tuple[int, ...] = (),
                  parent_run: str | None = None, node: str | None = None) -> ClusterCell | None:
    """The train stage's command line and code params, checked (ParamsError, one line); returns the cluster cell
    its options describe (``ampbench cluster repro``), None for a whole arm."""
    tp = params.train
    if arm not in tp.precisions:
        raise ParamsError(f"--precision {arm!r} is not in train.precisions {tp.precisions}")
    cell = None
    if cell_seeds or parent_run or node:
        if not (cell_seeds and parent_run and node) or not set(cell_seeds) <= set(tp.seeds):
            raise ParamsError("a cluster cell needs --seed (one of train.seeds), --parent-run and --node together")
        cell = ClusterCell(tuple(cell_seeds), parent_run, node)
    require_tracked("train.model", tp.model, tp.model_code, root)
    require_tracked("train.task", tp.task, tp.task_code, root)
    return cell


def check_steps(params: Params, data: Prepared, world: distributed.World) -> None:
    """Refuse, before any work, a configuration under which an epoch would run no optimizer step."""
    n, batch = len(data.train), params.train.batch_size
    if batches_per_epoch(n, batch, world.size) == 0:
        raise ParamsError(f"train.batch_size: {batch} over {n} training samples and {world.size} process(es) "
                          "gives no batch to train on (batches of one sample, or that do not split over the "
                          "processes, are dropped)")


def preflight(arm: str, policy: PrecisionPolicy, params: Params, data: Prepared, task: Task,
              device: torch.device) -> Preflight:
    """Build the arm's model once on ``device``, with training's determinism settings, and check it (see the module
    docstring): ModelError or ParamsError (one line) before any work."""
    tp = params.train
    set_deterministic(tp.deterministic, tp.cudnn_benchmark, tp.compile)
    spec, contract = ModelSpec.from_train(tp), task.model_args(data.meta)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_for(spec, contract).to(device)
        identity = check_built(spec, model, data.train.inputs(data.train.x[:2]).to(device), contract, task,
                               data.train.y[:2], data.test)
        try:  # a pattern that matches nothing would silently leave the layer in 16 bits
            float32 = float32_matches(model, tp.fp32_modules) if tp.fp32_modules else []
        except ValueError as exc:
            raise ParamsError(str(exc)) from None
        check_float8([a for a in tp.precisions if arms.get(a).float8], model, float32, tp, device)
        flops = _counted_step(policy, model, params, data, task, device)
    if policy.low_precision and tp.fp32_modules and flops["per_sample"] and not flops["low_precision_share"]:
        raise ParamsError(f"train.fp32_modules: {list(tp.fp32_modules)} keeps every module that computes in "
                          f"float32, so {arm} would run no 16-bit matmul or convolution and only be labelled "
                          f"{arm}; name the layers that need it (e.g. the one the report names)")
    return Preflight(identity, flops)


def _counted_step(policy: PrecisionPolicy, model: torch.nn.Module, params: Params, data: Prepared, task: Task,
                  device: torch.device) -> dict[str, Any]:
    """One training step's forward and backward under ``policy`` on the model as training prepares it, counted by
    dtype at the dispatcher, with the TF32 state read back."""
    tp, split = params.train, data.train
    n = min(tp.batch_size, COUNTED_SAMPLES, len(split))
    policy.apply_backend_flags()
    model = policy.prepare_model(model.to(memory_format=memory_format(tp)))
    x = policy.cast_input(split.inputs(split.x[:n].to(device))).to(memory_format=memory_format(tp))
    counted = count_step_flops(model, policy, x, split.y[:n].to(device), task)
    counted["cuda_matmul_fp32_precision"] = torch.backends.cuda.matmul.fp32_precision
    return counted


def check_float8(fp8: list[str], model: torch.nn.Module, float32: list[str], tp, device: torch.device) -> None:
    """Refuse, before any arm trains, fp8 arms in train.precisions that would convert no Linear layer of the model
    (they would train as bf16 under an fp8 label), and fp8 on CUDA without torch.compile (``config.rules``' rule,
    for the device ``train.device: auto`` resolved to)."""
    if not fp8:
        return
    from ampbench.precision.float8 import choices, no_eligible

    chosen = choices(model, float32)
    if not any(c["converted"] for c in chosen):
        raise ParamsError(f"train.model: {no_eligible(chosen)}, so {', '.join(fp8)} would train as bf16 under an fp8 "
                          f"label; use a model with Linear layers of multiples of 16 (e.g. mlp, vit_tiny, gpt) or "
                          f"drop {', '.join(fp8)} from train.precisions")
    for key, why in float8_needs_compile(fp8, tp.compile, device.type):  # the check stage's rule, on this device
        raise ParamsError(f"{key}: {why}")
