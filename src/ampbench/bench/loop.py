"""``ampbench bench``'s measuring (imports torch): the speed harness (``speed/harness.py``, the one the speed stage
uses) over every arm on synthetic data, each arm on its time budget, and the bench's own rows: the FLOPs by dtype,
the bytes of state per parameter, and the two loops the overhead check (``overhead.py``) times against each other —
the pipeline's and the tutorial's bare loop — as ``config.BenchConfig`` asks. Logs to MLflow only through
``tracking``.
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
from ampbench.bench import overhead
from ampbench.bench.config import BenchConfig
from ampbench.config.arms import BASELINE, TF32_REFERENCE
from ampbench.config.params import TrainParams
from ampbench.data.splits import Split
from ampbench.data.text import VOCAB_SIZE
from ampbench.errors import ArmUnavailable
from ampbench.models.builtins import unwrap
from ampbench.models.factory import ModelSpec, build_for
from ampbench.precision.optimizers import state_bytes
from ampbench.precision.policy import resolve_device, resolve_policy
from ampbench.runtime import memory, signals
from ampbench.runtime.hardware import fingerprint, peak_tflops
from ampbench.speed import harness
from ampbench.speed.budget import Budget
from ampbench.speed.harness import LoopArm
from ampbench.speed.ratios import summarise
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
        # Windows as the pipeline's loop makes them in the harness: the round's, none left out (round 0 warms up).
        self.timer = WindowTimer(device, cfg.window, 0)
        self.steps = 0

    def round(self, steps: int, window: int) -> list[float]:
        self.policy.apply_backend_flags()
        self.timer.window = window
        bs = self.cfg.batch_size
        n = min(len(self.train), steps * bs)
        first = len(self.timer.windows)
        for _ in range(math.ceil(steps / max(1, n // bs))):  # passes, as fit() makes them: a window per pass
            signals.checkpoint()  # between windows, not steps: the bare loop stays the tutorial's
            perm = torch.randperm(n, generator=self.gen).to(self.device)
            self.timer.start()
            for start in range(0, n, bs):
                self._step(perm[start:start + bs])
        return self.timer.windows[first:]

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


FLOP_SAMPLES = 16  # the FLOP count's batch: FLOPs per sample and their dtypes do not depend on the batch size


def _flop_rate(runner: LoopArm, train: Split, task, device_name: str,
               samples_per_s: float | None) -> dict[str, Any]:
    """The arm's counted FLOPs per sample (one step, by dtype), its 16-bit share, achieved TFLOP/s and, on a GPU of
    ``hardware.GPU_PEAK_TFLOPS``, the share of its dense peak for the dtype most FLOPs ran in."""
    runner.policy.apply_backend_flags()
    x, y = runner.policy.cast_input(train.x[:FLOP_SAMPLES]), train.y[:FLOP_SAMPLES]
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

    return log_json, "json lines (" + ("mlflow not installed)" if cfg.mlflow else "--no-mlflow)")


def measure(cfg: BenchConfig) -> dict[str, Any]:
    """Run the benchmark; return everything measured (also what the table shows)."""
    device = resolve_device(cfg.device)
    n = cfg.steps * cfg.batch_size
    train, val = _data(cfg, n, device, 0), _data(cfg, cfg.batch_size, device, 1)
    result: dict[str, Any] = {"config": asdict(cfg), "fingerprint": fingerprint(device), "date": time.strftime("%F")}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log_epoch, backend = _logger(cfg, Path(tmp), stack)
        logged: list[overhead.Logged] = []
        result["loop_overhead"] = {arm: overhead.loop_overhead(
            cfg, lambda a=arm: BareArm(cfg, a, device, train),
            lambda hook, a=arm: pipeline_arm(cfg, a, device, train, val, hook), log_epoch, logged)
            for arm in cfg.overhead_arms}
    result["logging"] = {"backend": backend, **overhead.logging_share(logged)}
    result["arms"] = _arm_ratios(cfg, device, train, val)
    if not memory.per_arm(device.type):
        result["memory_note"] = memory.why_not(device.type)
    return result


def _arm_ratios(cfg: BenchConfig, device, train: Split, val: Split) -> dict[str, Any]:
    """Every arm through the harness: the ratios to the baseline and tf32 with their intervals, then FLOPs, bytes
    of state and (CUDA) peak memory with each arm alone; every phase, building included, on the arm's budget."""
    arms: dict[str, Any] = {}
    runners: dict[str, LoopArm] = {}
    sizes = cfg.sizes()
    # The FLOP count's share of a step (its batch over the bench's, twice: it counts at the dispatcher) is kept
    # out of the rounds, so that the count still fits when the rounds have spent the rest.
    budgets = {arm: Budget(sizes, reserve=2 * FLOP_SAMPLES / cfg.batch_size) for arm in cfg.arms}
    for arm in cfg.arms:
        try:
            runners[arm] = budgets[arm].charge("build", lambda a=arm: pipeline_arm(cfg, a, device, train, val))
        except ArmUnavailable as exc:
            arms[arm] = {"skipped": str(exc)}
            del budgets[arm]
    measured = harness.measure(runners, sizes, budgets=budgets)
    for arm, row in summarise(measured.rounds)["arms"].items():
        itself = {"speedup_vs_" + arm: 1.0} if arm in (BASELINE, TF32_REFERENCE) and row["samples_per_s"] else {}
        arms[arm] = {**row, **itself}  # an arm against itself: the table's 1.00
    device_name = fingerprint(device)["device_name"]
    for name in list(runners):  # by name: no loop variable keeps a runner alive after runners.clear()
        arms[name].update(budgets[name].charge("flop count", lambda n=name: _flop_rate(
            runners[n], train, _task(cfg), device_name, arms[n]["samples_per_s"])))
        st = runners[name].state  # weights, gradients and optimizer state, counted (the pure arms' point)
        arms[name]["state_bytes_per_parameter"] = state_bytes(st.model, st.optimizer)["per_parameter"]
    runners.clear()  # throughput needed every arm alive (interleaved rounds); memory needs each one alone
    peaks = harness.isolated_memory(lambda arm: pipeline_arm(cfg, arm, device, train, val), list(measured.rounds),
                                    device, 2 * cfg.window, budgets)
    for arm, peak in peaks.items():
        arms[arm]["peak_memory_mb"] = peak
        for ref in (BASELINE, TF32_REFERENCE):
            base = peaks.get(ref)
            if peak and base:
                arms[arm][f"memory_vs_{ref}"] = peak / base
    for arm, b in budgets.items():  # after the FLOP count and the memory pass: every phase in the record
        arms[arm].update(b.record())
    return dict(sorted(arms.items(), key=lambda kv: cfg.arms.index(kv[0])))
