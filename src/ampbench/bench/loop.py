"""The measuring half of ``ampbench bench`` (imports torch): interleaved A/B rounds of the pipeline's loop, the
tutorial's bare loop and every precision arm, as ``config.BenchConfig`` asks. Logs to MLflow only through
``tracking``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
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
from ampbench.runtime.hardware import fingerprint, peak_memory_mb, peak_tflops, reset_peak_memory
from ampbench.speed.budget import Budget, prime
from ampbench.tasks.resolve import resolve_task
from ampbench.training.flops import count_step_flops
from ampbench.training.instruments import WindowTimer
from ampbench.training.loop import EpochRecord, LoopConfig, fit, init_state


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


def _loop_cfg(cfg: BenchConfig, epochs: int) -> LoopConfig:
    """The pipeline's train defaults (telemetry, divergence checks, scaler settings) at the bench's sizes."""
    train = TrainParams(epochs=epochs, batch_size=cfg.batch_size, lr=1e-3, scheduler="constant", progress=False)
    return LoopConfig(train, warmup_steps=cfg.warmup_steps, timing_window=cfg.window, sync_debug=cfg.sync_debug,
                      task=_task(cfg))


def _first(split: Split, steps: int, batch_size: int) -> Split:
    """The first ``steps`` batches of ``split`` (all of it when it has no more)."""
    n = steps * batch_size
    return split if n >= len(split) else Split(split.x[:n], split.y[:n], split.norm)


class _PipelineArm:
    """The pipeline's loop (``fit``: telemetry, divergence checks, bookkeeping, per-epoch logging hook on)."""

    def __init__(self, cfg: BenchConfig, arm: str, device: torch.device, train: Split, val: Split,
                 log_epoch: Callable[[dict, list], None]):
        self.policy = resolve_policy(arm, device)
        self.policy.apply_backend_flags()
        self.cfg, self.train, self.val, self.log_epoch = cfg, train, val, log_epoch
        self.state = init_state(_model(cfg, device, self.policy), self.policy, _loop_cfg(cfg, 1), device)
        self.windows: list[float] = []
        self.seconds = self.logging_seconds = 0.0
        self.peak: dict[str, float] = {}

    def round(self, steps: int, measured: bool = True) -> None:
        self.policy.apply_backend_flags()
        tcfg = _loop_cfg(self.cfg, self.state.epoch + 1)

        def on_epoch(record: EpochRecord, _state) -> None:
            if not measured:  # budget.prime's step: neither its windows nor its time count
                return
            self.windows.extend(record.windows)
            self.seconds += record.epoch_seconds
            t0 = time.perf_counter()
            self.log_epoch(record.row(), record.steps)
            self.logging_seconds += time.perf_counter() - t0

        reset_peak_memory(self.train.x.device)
        fit(self.state, _first(self.train, steps, self.cfg.batch_size), self.val, self.policy, tcfg,
            on_epoch=on_epoch)
        mem = peak_memory_mb(self.train.x.device)
        self.peak = {k: max(v, self.peak.get(k, 0.0)) for k, v in mem.items()}


class _BareArm:
    """The tutorial's loop, verbatim: same model, data, optimizer and precision, nothing else. It writes its own
    forward, loss and step on purpose instead of calling ``step.train_step``: it is the reference the pipeline's
    loop is timed against."""

    def __init__(self, cfg: BenchConfig, arm: str, device: torch.device, train: Split):
        self.policy = resolve_policy(arm, device)
        self.cfg, self.train, self.device = cfg, train, device
        self.model = _model(cfg, device, self.policy)
        st = init_state(self.model, self.policy, _loop_cfg(cfg, 1), device)  # same optimizer/scaler settings
        self.optimizer, self.scaler, self.gen = st.optimizer, st.scaler, st.generator
        self.x = self.policy.cast_input(train.x)
        self.timer = WindowTimer(device, cfg.window, cfg.warmup_steps)  # the same windows as the pipeline's loop
        self.steps = 0

    @property
    def windows(self) -> list[float]:
        return self.timer.windows

    def round(self, steps: int, measured: bool = True) -> None:
        self.policy.apply_backend_flags()
        n, bs = min(len(self.train), steps * self.cfg.batch_size), self.cfg.batch_size
        perm = torch.randperm(len(self.train), generator=self.gen)[:n].to(self.device)
        self.timer.start()
        for start in range(0, n, bs):
            idx = perm[start:start + bs]
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
            self.timer.tick(len(idx), self.steps if measured else 0)  # step 0 opens no window that is kept


def _flop_rate(runner: _PipelineArm, train: Split, device_name: str, samples_per_s: float | None) -> dict[str, Any]:
    """The arm's counted FLOPs per sample (one step, by dtype), its 16-bit share, achieved TFLOP/s and, on a GPU of
    ``hardware.GPU_PEAK_TFLOPS``, the share of its dense peak for the dtype most FLOPs ran in."""
    runner.policy.apply_backend_flags()
    model = unwrap(runner.state.model)
    x, y = runner.policy.cast_input(train.x[:16]), train.y[:16]
    counted = count_step_flops(model, runner.policy, x, y, _task(runner.cfg))
    out = {"flops_per_sample": counted["per_sample"], "low_precision_flop_share": counted["low_precision_share"],
           "flop_dtype": counted["dominant_dtype"]}
    if samples_per_s and counted["per_sample"]:
        out["achieved_tflops"] = counted["per_sample"] * samples_per_s / 1e12
        peak = peak_tflops(device_name, counted["dominant_dtype"]) if counted["dominant_dtype"] else None
        if peak:
            out["peak_tflops"], out["peak_share"] = peak, out["achieved_tflops"] / peak
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


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
                                 "cannot be attributed to one arm; memory ratios are given on CUDA only")
    return result


def _loop_overhead(cfg: BenchConfig, device, train: Split, val: Split, log_epoch) -> dict[str, Any]:
    """The pipeline's loop vs the bare loop, per overhead arm, interleaved A/B round by round."""
    overhead = {}
    for arm in cfg.overhead_arms:
        try:
            pipe, bare = _PipelineArm(cfg, arm, device, train, val, log_epoch), _BareArm(cfg, arm, device, train)
        except ArmUnavailable as exc:
            overhead[arm] = {"skipped": str(exc)}
            continue
        prime(cfg, [bare, pipe])
        budget = Budget(cfg, None if cfg.arm_budget is None else 2 * cfg.arm_budget)  # two loops per round
        for r in range(budget.total_rounds):
            steps = budget.steps_for(r)
            if not steps:
                break
            budget.run(steps, bare.round, pipe.round)
        b, p = _median(bare.windows), _median(pipe.windows)
        ratio = b / p if b and p else None
        overhead[arm] = {"bare_samples_per_s": b, "pipeline_samples_per_s": p, "ratio": ratio,
                         "goal": OVERHEAD_GOAL, "meets_goal": ratio is not None and ratio <= OVERHEAD_GOAL,
                         "windows": [len(bare.windows), len(pipe.windows)],
                         "logging_seconds": pipe.logging_seconds, "train_seconds": pipe.seconds,
                         **budget.record()}
    return overhead


def isolated_peaks(cfg: BenchConfig, device, train: Split, val: Split, arms: list[str]) -> dict[str, dict]:
    """Each arm's peak memory with only its own model, gradients and optimizer state alive: build, one round,
    free, next. (Resetting the peak counter only lowers it to what is allocated now, so measuring with every arm
    alive would count the others' state too.) The data, the same for every arm, stays."""
    peaks = {}
    for arm in arms:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runner = _PipelineArm(cfg, arm, device, train, val, lambda row, steps: None)
        # Resets the peak counter first. Under a budget two steps: the peak is reached by the second (the
        # optimizer's state exists from the first).
        runner.round(cfg.steps if cfg.arm_budget is None else min(cfg.steps, 2))
        peaks[arm] = dict(runner.peak)
        del runner
    gc.collect()
    return peaks


def _arm_ratios(cfg: BenchConfig, device, train: Split, val: Split) -> dict[str, Any]:
    """Every arm through the pipeline's loop, interleaved round by round; ratios to the baseline and tf32."""
    arms: dict[str, Any] = {}
    runners = {}
    for arm in cfg.arms:
        try:
            runners[arm] = _PipelineArm(cfg, arm, device, train, val, lambda row, steps: None)
        except ArmUnavailable as exc:
            arms[arm] = {"skipped": str(exc)}
    prime(cfg, runners.values())
    budgets = {name: Budget(cfg, cfg.arm_budget) for name in runners}
    for r in range(cfg.rounds + (cfg.arm_budget is not None)):
        for name in runners:  # by name: no loop variable keeps a runner alive after runners.clear()
            steps = budgets[name].steps_for(r) if budgets[name].rounds_run == r else 0
            if steps:
                budgets[name].run(steps, runners[name].round)
    arms.update({arm: {"samples_per_s": _median(r.windows), **budgets[arm].record()} for arm, r in runners.items()})
    device_name = fingerprint(device)["device_name"]
    for name in runners:  # by name, as above
        arms[name].update(_flop_rate(runners[name], train, device_name, arms[name]["samples_per_s"]))
        st = runners[name].state  # weights, gradients and optimizer state, counted (the pure arms' point)
        arms[name]["state_bytes_per_parameter"] = state_bytes(st.model, st.optimizer)["per_parameter"]
    names = list(runners)
    runners.clear()  # throughput needed every arm alive (interleaved rounds); memory needs each one alone
    for arm, peak in isolated_peaks(cfg, device, train, val, names).items():
        arms[arm].update(peak)
    for row in arms.values():
        for ref in (BASELINE, TF32_REFERENCE):
            base = arms.get(ref, {})
            if row.get("samples_per_s") and base.get("samples_per_s"):  # None: no window past the warm-up
                row[f"speedup_vs_{ref}"] = row["samples_per_s"] / base["samples_per_s"]
            if device.type == "cuda" and row.get("peak_memory_mb") and base.get("peak_memory_mb"):
                row[f"memory_vs_{ref}"] = row["peak_memory_mb"] / base["peak_memory_mb"]
    return dict(sorted(arms.items(), key=lambda kv: cfg.arms.index(kv[0])))
