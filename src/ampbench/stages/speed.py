"""The speed stage's measurement, on the user's model, data, batch size and input path: the speed harness
(``speed/harness.py``, the one ``ampbench bench`` uses) over every arm of ``train.precisions``, each built as the
train stage builds it (``training.loop.build_run``, seed 0), interleaved round by round; per arm the median over
rounds of its ratio to fp32 with a distribution-free interval, *unstable* when that interval is wide; peak memory
per arm with only that arm alive (CUDA). ``pipeline/speed.py`` writes the result (reports/interleaved.json); the
evaluate stage reads it through ``config.records.SpeedResult``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch

from ampbench.config.arms import BASELINE
from ampbench.config.params import Params
from ampbench.config.rules import speed_sizes
from ampbench.data.splits import Split
from ampbench.errors import AmpbenchError, ArmUnavailable, Diverged, ParamsError
from ampbench.precision.policy import resolve_policy
from ampbench.runtime.hardware import fingerprint
from ampbench.speed.budget import Sizes
from ampbench.speed.harness import LoopArm, isolated_memory, measure
from ampbench.speed.ratios import rounds_text, summarise
from ampbench.tasks.contract import Task
from ampbench.training.loop import build_run


def sizes(params: Params, batches_per_pass: int | None = None) -> Sizes:
    """The speed params as the harness's sizes (``ParamsError`` naming the speed key that cannot measure: the check
    stage's rule, ``config.rules.speed_sizes``), the window cut to one pass over the data when ``batches_per_pass``
    is given."""
    sp = params.speed
    for key, why in speed_sizes(sp):
        raise ParamsError(f"{key}: {why}")
    s = Sizes(sp.rounds, sp.steps, sp.window, sp.warmup_steps, sp.seconds_per_arm)
    return s if batches_per_pass is None else s.within(batches_per_pass)


def loop_arm(arm: str, params: Params, train: Split, val: Split, task: Task, device: torch.device,
             contract: dict[str, Any], s: Sizes) -> LoopArm:
    """``arm`` ready to step, built as the train stage builds a seed (seed 0); ArmUnavailable when the device
    cannot run it."""
    tp = params.train
    policy = resolve_policy(arm, device, tp.fp32_modules)
    _, state, cfg = build_run(tp, policy, contract, device, 0, train, task, epochs=1, progress=False,
                              warmup_steps=s.warmup_steps, timing_window=s.window)
    if tp.compile:  # as the train stage does: the optimizer holds the same parameters
        state.model = torch.compile(state.model)
    return LoopArm(policy, state, cfg, train, val)


def measure_arms(params: Params, train: Split, val: Split, task: Task, device: torch.device,
                 contract: dict[str, Any], between_rounds: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Every arm of ``train.precisions`` through the harness, then each arm's peak memory alone: what
    reports/interleaved.json holds."""
    s, build = _builder(params, train, val, task, device, contract)
    skipped: dict[str, str] = {}
    names = []
    for arm in params.train.precisions:
        try:
            policy = resolve_policy(arm, device, params.train.fp32_modules)
            if params.train.framework != "ampbench":
                _framework().check_arm(policy, params)
            names.append(arm)
        except ArmUnavailable as exc:
            skipped[arm] = str(exc)
    while True:  # an arm that diverges while timed (an ablation without a scaler) is left out, the rest timed again
        arms = {arm: build(arm) for arm in names}
        try:
            measured = measure(arms, s, between_rounds)
            break
        except Diverged as exc:
            culprit = next((arm for arm in names if str(exc).startswith(f"{arm}:")), None)
            if culprit is None or culprit == BASELINE:
                raise
            skipped[culprit] = f"diverged while timed ({exc}); the train stage records how it trained"
            names.remove(culprit)
        except AmpbenchError as exc:  # a framework's run read back as another arm (frameworks/readback.py)
            culprit = getattr(exc, "arm", None)
            if culprit not in names or culprit == BASELINE or not getattr(exc, "framework_ignored", False):
                raise
            skipped[culprit] = str(exc)  # the framework ignores the arm's flag here; the train stage skips it too
            names.remove(culprit)
    arms.clear()  # throughput needed every arm alive; memory needs each one alone
    memory = isolated_memory(build, list(measured.rounds), device, 2 * s.window)
    return {"device": fingerprint(device)["device_name"], "device_type": device.type, "params": dataclasses.asdict(s),
            "skipped": skipped, **summarise(measured.rounds), "budget": measured.budgets, "memory": memory}


FIXED = "{arm} with the fix"  # the fixed arm's name among measure_fix's


def measure_fix(params: Params, arm: str, modules: list[str], data_dir: Path) -> dict[str, Any]:
    """fp32, ``arm`` as it is and ``arm`` with ``modules`` kept in float32 (named ``FIXED.format(arm=arm)``), built
    as the train stage builds them and timed by the harness interleaved, as the speed stage times arms: what
    ``ampbench fix`` reports of its answer. Each one's ratio to fp32 (``summarise``'s ``arms``)."""
    train, val, task, device, contract = _timed_data(params, data_dir)
    fixed = dataclasses.replace(params, train=dataclasses.replace(params.train, fp32_modules=tuple(modules)))
    s, build = _builder(params, train, val, task, device, contract)
    build_fixed = _builder(fixed, train, val, task, device, contract)[1]
    runners = {BASELINE: build(BASELINE), arm: build(arm), FIXED.format(arm=arm): build_fixed(arm)}
    return summarise(measure(runners, s).rounds)["arms"]


def _builder(params: Params, train: Split, val: Split, task: Task, device: torch.device,
             contract: dict[str, Any]) -> tuple[Sizes, Callable[[str], Any]]:
    """The harness's sizes and what builds an arm for it: the pipeline's loop (``loop_arm``), or the framework's own
    trainer stepping the user's job (``framework.speed_arm``)."""
    if params.train.framework != "ampbench":
        framework = _framework()
        return sizes(params, framework.batches_per_pass(params)), lambda arm: framework.speed_arm(arm, params, device)
    s = sizes(params, len(train) // params.train.batch_size)
    return s, lambda arm: loop_arm(arm, params, train, val, task, device, contract, s)


def _framework():
    """``stages.framework``, imported for a framework's job only: it brings the train stage's outputs and tracking
    (MLflow's client, pydantic) into a stage that otherwise times arms without them."""
    from ampbench.stages import framework

    return framework


def _timed_data(params: Params, data_dir: Path) -> tuple[Split, Split, Task, torch.device, dict[str, Any]]:
    """The training split's first ``speed.steps`` batches (every round trains on them), a batch of the validation
    split (the loop validates after each round, untimed), the task, the device and the model's contract."""
    from ampbench.data.prepare import load_prepared
    from ampbench.precision.policy import resolve_device
    from ampbench.tasks.resolve import resolve_task

    device = resolve_device(params.train.device)
    task = resolve_task(params.train.task, params.train.block_size)
    data = task.view(load_prepared(data_dir))
    n, bs = params.speed.steps * params.train.batch_size, params.train.batch_size
    train, val = data.train, data.val
    train = train if n >= len(train) else Split(train.x[:n], train.y[:n], train.norm)
    val = Split(val.x[:bs], val.y[:bs], val.norm)
    return train, val, task, device, task.model_args(data.meta)


def run(params: Params, data_dir: Path) -> dict[str, Any]:
    """The speed stage's measurement on the prepared data in ``data_dir`` (``_timed_data``)."""
    train, val, task, device, contract = _timed_data(params, data_dir)
    return measure_arms(params, train, val, task, device, contract)


def summary_lines(result: dict[str, Any]) -> list[str]:
    """One line per arm for the stage's log: samples/s, × fp32 with its interval, unstable or skipped."""
    lines = []
    if result["params"]["window_cut"]:
        w = result["params"]["window"]
        lines.append(f"timing windows of {w} step{'s' * (w != 1)}: one pass over the training split has no more "
                     "batches than that, and windows never span two")
    for arm, reason in result["skipped"].items():
        lines.append(f"[{arm}] skipped: {reason}")
    for arm, row in result["arms"].items():
        sps = "n/a" if row["samples_per_s"] is None else f"{row['samples_per_s']:,.0f} samples/s"
        ratio = ""
        if row.get("speedup_vs_fp32") is not None:
            low, high = row["speedup_vs_fp32_ci"]
            ratio = (f", {row['speedup_vs_fp32']:.2f}× fp32 [{low:.2f}, {high:.2f}] over {len(row['ratios'])} "
                     f"rounds" + (f" — unstable ({rounds_text(row['disagreeing_rounds'], len(row['ratios']))})"
                                  if row["unstable"] else ""))
        lines.append(f"[{arm}] {sps}{ratio}")
    return lines
