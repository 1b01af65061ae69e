"""``ampbench bench``'s measuring (imports torch): the speed harness (``speed/harness.py``, the one the speed stage
uses) over every arm on synthetic data, and the bench's own rows: the pipeline's loop against the tutorial's bare
loop, the time spent logging, the FLOPs by dtype and the bytes of state per parameter, as ``config.BenchConfig``
asks. Logs to MLflow only through ``tracking``.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ampbench import tracking
from ampbench.bench.config import LOGGING_GOAL, OVERHEAD_GOAL, BenchConfig
from ampbench.config.arms import BASELINE, TF32_REFERENCE
from ampbench.config.params import TrainParams
from ampbench.data.splits import Split
from ampbench.data.text import VOCAB_SIZE
from ampbench.errors import ArmUnavailable
from ampbench.models.builtins import unwrap
from ampbench.models.factory import ModelSpec, build_for
from ampbench.precision.optimizers import state_bytes
from ampbench.precision.policy import resolve_device, resolve_policy
from ampbench.runtime.hardware import fingerprint, peak_tflops
from ampbench.speed import harness
from ampbench.speed.harness import LoopArm, fastest_after_first
from ampbench.speed.ratios import median_value, ratio, summarise
from ampbench.tasks.resolve import resolve_task
from ampbench.training.flops import count_step_flops
from ampbench.training.instruments import WindowTimer
from ampbench.training.loop import init_state
from ampbench.training.state import EpochRecord, LoopConfig, TrainState


def _data(cfg: BenchConfig, n: int, device: torch.device, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    if cfg.task == "language_model":  # random bytes: timing needs the shapes, not the text
        tokens = torch.randint(0, VOCAB_SIZE, (n, cfg.block_size + 1), generator=g)
        return Split(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()).to(device)
    x = torch.randn(n, cfg.channels, cfg.image_size, cfg.image_size, generator=g)
    y = torch.randint(0, cfg.classes, (n,), generator=g)
    if cfg.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return Split(x, y).to(device)


def _model(cfg: BenchConfig, device: torch.device, policy):
    torch.manual_seed(0)
    spec = ModelSpec(cfg.model, cfg.width if ModelSpec(cfg.model).kind == "builtin" else None)
    model = build_for(spec, _task(cfg).model_args(_meta(cfg))).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = policy.prepare_model(model)
    return torch.compile(model) if cfg.compile else model


def _task(cfg: BenchConfig):
    return resolve_task(cfg.task, cfg.block_size)


def _meta(cfg: BenchConfig) -> dict:
    """What the task's model contract reads of the (here: random) data."""
    if cfg.task == "language_model":
        return {"vocab_size": VOCAB_SIZE}
    return {"input_shape": [cfg.channels, cfg.image_size, cfg.image_size], "classes": list(range(cfg.classes))}


def _loop_cfg(cfg: BenchConfig) -> LoopConfig:
    """The pipeline's train defaults (telemetry, divergence checks, scaler settings) at the bench's sizes."""
    train = TrainParams(epochs=1, batch_size=cfg.batch_size, lr=1e-3, scheduler="constant", progress=False)
    return LoopConfig(train, warmup_steps=cfg.warmup_steps, timing_window=cfg.window, sync_debug=cfg.sync_debug,
                      task=_task(cfg))


def pipeline_arm(cfg: BenchConfig, arm: str, device: torch.device, train: Split, val: Split,
                 on_epoch: Callable[[EpochRecord, TrainState], None] | None = None) -> LoopArm:
    """``arm`` through the pipeline's loop (``fit``: telemetry, divergence checks, bookkeeping, the per-epoch
    hook); ArmUnavailable when the device cannot run it."""
    policy = resolve_policy(arm, device)
    policy.apply_backend_flags()
    loop = _loop_cfg(cfg)
    return LoopArm(policy, init_state(_model(cfg, device, policy), policy, loop, device), loop, train, val, on_epoch)


class BareArm:
    """The tutorial's loop, verbatim: same model, data, optimizer and precision, nothing else. It writes its own
    forward, loss and step on purpose instead of calling ``training.step.train_step``: it is the reference the
    pipeline's loop is timed against. A round does the same passes over the same batches as ``LoopArm``'s."""

    def __init__(self, cfg: BenchConfig, arm: str, device: torch.device, train: Split):
        self.policy = resolve_policy(arm, device)
        self.cfg, self.train, self.device = cfg, train, device
        self.model = _model(cfg, device, self.policy)
        st = init_state(self.model, self.policy, _loop_cfg(cfg), device)  # same optimizer/scaler settings
        self.optimizer, self.scaler, self.gen = st.optimizer, st.scaler, st.generator
        self.x = self.policy.cast_input(train.x)
        self.timer = WindowTimer(device, cfg.window, cfg.warmup_steps)  # the same windows as the pipeline's loop
        self.steps = 0

    def round(self, steps: int) -> float | None:
        self.policy.apply_backend_flags()
        bs = self.cfg.batch_size
        n = min(len(self.train), steps * bs)
        first = len(self.timer.windows)
        for _ in range(math.ceil(steps / max(1, n // bs))):  # passes, as fit() makes them: a window per pass
            perm = torch.randperm(n, generator=self.gen).to(self.device)
            self.timer.start()
            for start in range(0, n, bs):
                self._step(perm[start:start + bs])
        return fastest_after_first(self.timer.windows[first:])

    def _step(self, idx: torch.Tensor) -> None:
        x, y = self.x[idx], self.train.y[idx]
        self.optimizer.zero_grad()
        with self.policy.autocast():
            logits = self.model(x)
            # (N, classes) or (N, T, vocab) logits: one cross-entropy over the last dimension either way
            loss = F.cross_entropy(logits.float().flatten(0, -2), y.flatten())
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.steps += 1
        self.timer.tick(len(idx), self.steps)


def _flop_rate(runner: LoopArm, train: Split, task, device_name: str,
               samples_per_s: float | None) -> dict[str, Any]:
    """The arm's counted FLOPs per sample (one step, by dtype), its 16-bit share, achieved TFLOP/s and, on a GPU of
    ``hardware.GPU_PEAK_TFLOPS``, the share of its dense peak for the dtype most FLOPs ran in."""
    runner.policy.apply_backend_flags()
    x, y = runner.policy.cast_input(train.x[:16]), train.y[:16]
    counted = count_step_flops(unwrap(runner.state.model), runner.policy, x, y, task)
    out = {"flops_per_sample": counted["per_sample"], "low_precision_flop_share": counted["low_precision_share"],
           "flop_dtype": counted["dominant_dtype"]}
    if samples_per_s and counted["per_sample"]:
        out["achieved_tflops"] = counted["per_sample"] * samples_per_s / 1e12
        peak = peak_tflops(device_name, counted["dominant_dtype"]) if counted["dominant_dtype"] else None
        if peak:
            out["peak_tflops"], out["peak_share"] = peak, out["achieved_tflops"] / peak
    return out


def _logger(cfg: BenchConfig, workdir: Path, stack: contextlib.ExitStack) -> tuple[Callable[[dict, list], None], str]:
    """(log_epoch, backend description): the pipeline's real MLflow batching into a scratch SQLite store when
    mlflow is installed, else JSON lines. ``stack`` closes either."""
    if cfg.mlflow:
        try:
            stack.enter_context(tracking.scratch_run(workdir))
        except ImportError:
            pass
        else:
            return tracking.log_epoch, "mlflow (SQLite, one batch per epoch)"
    sink = stack.enter_context((workdir / "history.jsonl").open("a"))

    def log_json(row: dict, steps: list) -> None:
        sink.write(json.dumps({**row, "steps": steps}) + "\n")

    return log_json, "json lines (mlflow not installed)"


def measure(cfg: BenchConfig) -> dict[str, Any]:
    """Run the benchmark; return everything measured (also what the table shows)."""
    device = resolve_device(cfg.device)
    n = cfg.steps * cfg.batch_size
    train, val = _data(cfg, n, device, 0), _data(cfg, cfg.batch_size, device, 1)
    result: dict[str, Any] = {"config": asdict(cfg), "fingerprint": fingerprint(device), "date": time.strftime("%F")}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log_epoch, backend = _logger(cfg, Path(tmp), stack)
        result["loop_overhead"] = _loop_overhead(cfg, device, train, val, log_epoch)
    timed = [o for o in result["loop_overhead"].values() if "train_seconds" in o]
    log_s, train_s = sum(o["logging_seconds"] for o in timed), sum(o["train_seconds"] for o in timed)
    share = log_s / train_s if train_s else None
    result["logging"] = {"backend": backend, "seconds": log_s, "train_seconds": train_s, "share": share,
                         "goal": LOGGING_GOAL, "meets_goal": share is not None and share <= LOGGING_GOAL}
    result["arms"] = _arm_ratios(cfg, device, train, val)
    if device.type == "cpu":
        result["memory_note"] = ("CPU: peak RSS is the process's high-water mark and never goes down, so it "
                                 "cannot be attributed to one arm; peak memory and its ratios are given on CUDA only")
    return result


class _Logged:
    """The pipeline loop's per-epoch hook timed: the logging call's seconds against the epochs' training seconds."""

    def __init__(self, log_epoch: Callable[[dict, list], None]):
        self.log_epoch, self.logging_seconds, self.train_seconds = log_epoch, 0.0, 0.0

    def __call__(self, record: EpochRecord, _state: TrainState) -> None:
        self.train_seconds += record.epoch_seconds
        t0 = time.perf_counter()
        self.log_epoch(record.row(), record.steps)
        self.logging_seconds += time.perf_counter() - t0


def _loop_overhead(cfg: BenchConfig, device, train: Split, val: Split, log_epoch) -> dict[str, Any]:
    """Per overhead arm, the bare loop and the pipeline's loop through the harness (interleaved, alternating):
    the median over rounds of bare ÷ pipeline samples/s, with its interval."""
    overhead = {}
    for arm in cfg.overhead_arms:
        logged = _Logged(log_epoch)
        try:
            runners = {"bare": BareArm(cfg, arm, device, train),
                       "pipeline": pipeline_arm(cfg, arm, device, train, val, logged)}
        except ArmUnavailable as exc:
            overhead[arm] = {"skipped": str(exc)}
            continue
        measured = harness.measure(runners, cfg.sizes())
        r = ratio(measured.rounds["bare"], measured.rounds["pipeline"])
        budgets = measured.budgets
        overhead[arm] = {"bare_samples_per_s": median_value(measured.rounds["bare"]),
                         "pipeline_samples_per_s": median_value(measured.rounds["pipeline"]),
                         "ratio": r and r.interval.median, "ratio_ci": r and [r.interval.low, r.interval.high],
                         "goal": OVERHEAD_GOAL, "meets_goal": r is not None and r.interval.median <= OVERHEAD_GOAL,
                         "rounds": [sum(v is not None for v in measured.rounds[n]) for n in ("bare", "pipeline")],
                         "logging_seconds": logged.logging_seconds, "train_seconds": logged.train_seconds,
                         **budgets["pipeline"], "cut_short": budgets["bare"]["cut_short"] or
                         budgets["pipeline"]["cut_short"]}
    return overhead


def _arm_ratios(cfg: BenchConfig, device, train: Split, val: Split) -> dict[str, Any]:
    """Every arm through the harness: the ratios to the baseline and tf32 with their intervals, then FLOPs, bytes
    of state and (CUDA) peak memory with each arm alone."""
    arms: dict[str, Any] = {}
    runners: dict[str, LoopArm] = {}
    for arm in cfg.arms:
        try:
            runners[arm] = pipeline_arm(cfg, arm, device, train, val)
        except ArmUnavailable as exc:
            arms[arm] = {"skipped": str(exc)}
    measured = harness.measure(runners, cfg.sizes())
    for arm, row in summarise(measured.rounds)["arms"].items():
        itself = {"speedup_vs_" + arm: 1.0} if arm in (BASELINE, TF32_REFERENCE) and row["samples_per_s"] else {}
        arms[arm] = {**row, **itself, **measured.budgets[arm]}  # an arm against itself: the table's 1.00
    device_name = fingerprint(device)["device_name"]
    for name in list(runners):  # by name: no loop variable keeps a runner alive after runners.clear()
        arms[name].update(_flop_rate(runners[name], train, _task(cfg), device_name, arms[name]["samples_per_s"]))
        st = runners[name].state  # weights, gradients and optimizer state, counted (the pure arms' point)
        arms[name]["state_bytes_per_parameter"] = state_bytes(st.model, st.optimizer)["per_parameter"]
    runners.clear()  # throughput needed every arm alive (interleaved rounds); memory needs each one alone
    peaks = harness.isolated_memory(lambda arm: pipeline_arm(cfg, arm, device, train, val), list(measured.rounds),
                                    device, 2 * cfg.window)
    for arm, peak in peaks.items():
        arms[arm]["peak_memory_mb"] = peak
        for ref in (BASELINE, TF32_REFERENCE):
            base = peaks.get(ref)
            if peak and base:
                arms[arm][f"memory_vs_{ref}"] = peak / base
    return dict(sorted(arms.items(), key=lambda kv: cfg.arms.index(kv[0])))
