"""What the train stage checks before any work, and what it says about the size of what was asked: a
configuration that trains nothing, a model that does not fit the data, ``train.fp32_modules`` that leave a 16-bit arm
no 16-bit work, and a request far larger than the default (its plan, then its estimated time).
"""

from __future__ import annotations

from typing import Any

import torch

from ampbench.config import arms
from ampbench.config.params import Params
from ampbench.config.rules import float8_needs_compile
from ampbench.data.loader import batches_per_epoch
from ampbench.data.splits import Prepared
from ampbench.errors import ParamsError
from ampbench.models.factory import ModelSpec, build_for, inspect_model
from ampbench.precision.policy import float32_matches
from ampbench.runtime import distributed
from ampbench.runtime.determinism import set_deterministic
from ampbench.tasks.contract import Task
from ampbench.training.flops import count_step_flops
from ampbench.training.state import EpochRecord


def check_steps(params: Params, data: Prepared, world: distributed.World) -> None:
    """Refuse, before any work, a configuration under which an epoch would run no optimizer step."""
    n, batch = len(data.train), params.train.batch_size
    if batches_per_epoch(n, batch, world.size) == 0:
        raise ParamsError(f"train.batch_size: {batch} over {n} training samples and {world.size} process(es) "
                          "gives no batch to train on (batches of one sample, or that do not split over the "
                          "processes, are dropped)")


def check_model(params: Params, data: Prepared, task: Task, device: torch.device) -> dict[str, Any]:
    """Build train.model once and run a dry forward and backward (through the task's loss) on two training samples
    on ``device``, with training's determinism settings, and probe the task's evaluation on a few test examples:
    ModelError or ParamsError (one line) before any work. Returns the model's identity."""
    tp = params.train
    set_deterministic(tp.deterministic, tp.cudnn_benchmark, tp.compile)
    spec, contract = ModelSpec.from_train(tp), task.model_args(data.meta)
    fp8 = [a for a in tp.precisions if arms.get(a).float8]
    if tp.fp32_modules or fp8:
        plain = build_for(spec, contract)
        try:  # a pattern that matches nothing would silently leave the layer in 16 bits
            float32 = float32_matches(plain, tp.fp32_modules) if tp.fp32_modules else []
        except ValueError as exc:
            raise ParamsError(str(exc)) from None
        check_float8(fp8, plain, float32, tp, device)
    return inspect_model(spec, data.train.inputs(data.train.x[:2]), contract, device, task, data.train.y[:2],
                         data.test)  # the task's loss and evaluation held to its contract, too


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


LARGE_REQUEST = 10  # × the default run's arms × seeds × epochs: beyond it, the plan and its estimate are printed


def _epoch_units(train) -> int:
    return len(train.precisions) * len(train.seeds) * train.epochs


def request_size(params: Params) -> str | None:
    """The plan line of a request far larger than the default (200 seeds start 400 runs without a word)."""
    from ampbench.config.params import TrainParams

    units, default = _epoch_units(params.train), _epoch_units(TrainParams())
    if units <= LARGE_REQUEST * default:
        return None
    tp = params.train
    arms = len(tp.precisions)
    return (f"plan: {arms} arm{'s' * (arms != 1)} × {len(tp.seeds)} seeds × {tp.epochs} epochs = {units:,} epochs of "
            f"training, {units / default:.0f}× the default run ({_default_size()}); the time it takes is estimated "
            "after the first epoch")


def _default_size() -> str:
    from ampbench.config.params import TrainParams

    d = TrainParams()
    return f"{len(d.precisions)} arms × {len(d.seeds)} seeds × {d.epochs} epochs"


def estimate(record: EpochRecord, params: Params) -> str:
    """After the first epoch of a large request: this arm's time and all arms' at its pace."""
    tp = params.train
    arm_s = record.epoch_seconds * len(tp.seeds) * tp.epochs

    def hm(seconds: float) -> str:
        m = round(seconds / 60)
        return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{max(m, 1)} min"

    return (f"estimate: this arm about {hm(arm_s)} ({len(tp.seeds) * tp.epochs:,} epochs at "
            f"{record.epoch_seconds:.1f} s), every arm about {hm(arm_s * len(tp.precisions))} at this arm's pace")


def check_16_bit_work(arm: str, policy, params: Params, data: Prepared, task: Task, device: torch.device) -> None:
    """Refuse, before any work, train.fp32_modules that leave a 16-bit arm no 16-bit FLOPs (e.g. ['*']): it would
    train as fp32 while labelled, compared and recommended as the arm. Counted on two samples (flops.py)."""
    tp = params.train
    if not (policy.low_precision and tp.fp32_modules):
        return
    set_deterministic(tp.deterministic, tp.cudnn_benchmark, tp.compile)
    model = policy.prepare_model(build_for(ModelSpec.from_train(tp), task.model_args(data.meta)).to(device))
    x = policy.cast_input(data.train.inputs(data.train.x[:2]).to(device))
    counted = count_step_flops(model, policy, x, data.train.y[:2].to(device), task)
    if counted["per_sample"] and not counted["low_precision_share"]:
        raise ParamsError(f"train.fp32_modules: {list(tp.fp32_modules)} keeps every module that computes in "
                          f"float32, so {arm} would run no 16-bit matmul or convolution and only be labelled "
                          f"{arm}; name the layers that need it (e.g. the one the report names)")
