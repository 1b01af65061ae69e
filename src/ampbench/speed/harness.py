"""Speed measured the way ``ampbench bench`` measures it, on the user's model, data, batch size and input path:
every arm in one process, interleaved round by round (A B C, C B A, A B C …), so whatever else runs on the
machine lands on every arm alike; per round its fastest timing window, per arm the median over rounds of its
ratio to fp32 with a distribution-free interval, *unstable* when that interval is wide; peak memory per arm with
only that arm alive (CUDA). The speed stage writes the result; evaluate reads it for the report and speed.json.

Each arm trains through the pipeline's own loop (``training.fit``: the same step, telemetry and input path as the
train stage) from a fresh model of seed 0, on the first batches of the training split; what it learns is thrown
away. The statistics over rounds are in ``speed_rounds.py``. No files or MLflow here.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from ampbench.config.params import Params, SpeedParams
from ampbench.data.splits import Split
from ampbench.errors import ArmUnavailable, ParamsError
from ampbench.precision.policy import resolve_policy
from ampbench.runtime.hardware import fingerprint, peak_memory_mb, reset_peak_memory
from ampbench.speed.ratios import rounds_text, summarise
from ampbench.training.loop import build_run, fit


class _OneRound:
    """The train params as one round sees them: ``epochs`` one more than done so far, no progress bar; every
    other value read through to the user's params (so the keys the loop reads are the ones it really reads)."""

    def __init__(self, train, epochs: int):
        self._train, self.epochs, self.progress = train, epochs, False

    def __getattr__(self, name: str):
        return getattr(self._train, name)


class ArmTimer:
    """One arm, ready to step: its model (seed 0), optimizer, scaler and input path, as the train stage builds
    them. ``round(steps)`` trains ``steps`` optimizer steps and returns the round's samples/s."""

    def __init__(self, arm: str, params: Params, train: Split, val: Split, task, device: torch.device,
                 contract: dict[str, Any], sizes: Sizes | None = None):
        tp, sp = params.train, sizes or Sizes.of(params.speed, len(train) // params.train.batch_size)
        self.policy = resolve_policy(arm, device, tp.fp32_modules)  # ArmUnavailable: the caller skips the arm
        _, self.state, self.cfg = build_run(_OneRound(tp, 1), self.policy, contract, device, 0, train, task,
                                            warmup_steps=sp.warmup_steps, timing_window=sp.window)
        if tp.compile:  # as the train stage does: the optimizer holds the same parameters
            self.state.model = torch.compile(self.state.model)
        self.train, self.val, self.batch_size = train, val, tp.batch_size

    def round(self, steps: int) -> float | None:
        """Train ``steps`` steps (passes over the split's batches as needed, as training does); the fastest of the
        round's windows after its first (None: none was kept). Fastest, not median: another process's load only
        ever slows a window down, so on a busy machine the fastest window is the one least disturbed (timeit's
        rule). Here, with the two cores kept busy by other processes, one round's ratio of an arm to itself
        scattered by ±2–4% this way and by ±20–24% with the median; quiet, both ±1–5%."""
        self.policy.apply_backend_flags()
        n = min(len(self.train), steps * self.batch_size)
        part = self.train if n == len(self.train) else Split(self.train.x[:n], self.train.y[:n], self.train.norm)
        passes = math.ceil(steps / max(1, len(part) // self.batch_size))
        cfg = dataclasses.replace(self.cfg, train=_OneRound(self.cfg.train._train, self.state.epoch + passes))
        kept = [w for record in fit(self.state, part, self.val, self.policy, cfg) for w in record.windows][1:]
        return max(kept) if kept else None


@dataclass(frozen=True)
class Sizes:
    """The speed params as measured: ``window`` no longer than one pass over the data (windows never span two)."""

    rounds: int
    steps: int
    window: int
    warmup_steps: int
    seconds: float | None
    window_cut: bool = False  # speed.window was longer than a pass

    @classmethod
    def of(cls, sp: SpeedParams, batches_per_pass: int) -> Sizes:
        if sp.steps < 2 * sp.window:
            raise ParamsError(f"speed.steps: {sp.steps} is less than 2 × speed.window ({sp.window}); a round's "
                              "first window is not counted, so a round needs two")
        window = max(1, min(sp.window, batches_per_pass))
        return cls(sp.rounds, sp.steps, window, sp.warmup_steps, sp.seconds_per_arm, window < sp.window)


def measure(params: Params, train: Split, val: Split, task, device: torch.device, contract: dict[str, Any],
            between_rounds: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Every arm of ``train.precisions`` interleaved round by round, then each arm's peak memory alone.

    Round 0 is the warm-up (``speed.warmup_steps`` and two windows, whatever they cost: its time per step sizes the
    rest under ``speed.seconds_per_arm``); rounds 1… are the measured ones. ``between_rounds(r)`` is called before
    round r (tests use it to change the load)."""
    from ampbench.speed.budget import Budget

    sp = Sizes.of(params.speed, len(train) // params.train.batch_size)
    timers: dict[str, ArmTimer] = {}
    skipped: dict[str, str] = {}
    for arm in params.train.precisions:
        try:
            timers[arm] = ArmTimer(arm, params, train, val, task, device, contract, sp)
        except ArmUnavailable as exc:
            skipped[arm] = str(exc)
    for timer in timers.values():  # the first step compiles (torch.compile, torchao's optimizer: ~9 s on a CPU)
        timer.round(1)  # once, outside the budget, which round 0's time per step would otherwise size from it
    budgets = {arm: Budget(sp, sp.seconds) for arm in timers}
    rounds = interleave(timers, sp.rounds + 1, lambda arm, r: _round_steps(budgets[arm], r, sp), between_rounds,
                        budgets)
    rounds = {arm: values[1:] for arm, values in rounds.items()}  # round 0 warms up and sizes the budget
    budget = {arm: b.record() for arm, b in budgets.items()}
    timers.clear()  # throughput needed every arm alive; memory needs each one alone
    memory = isolated_memory(params, train, val, task, device, contract, list(rounds), sp)
    return {"device": fingerprint(device)["device_name"], "device_type": device.type, "params": asdict(sp),
            "skipped": skipped, **summarise(rounds), "budget": budget, "memory": memory}


def interleave(timers: dict[str, ArmTimer], rounds: int, steps: Callable[[str, int], int],
               between_rounds: Callable[[int], None] | None = None,
               budgets: dict[str, Any] | None = None) -> dict[str, list[float | None]]:
    """Each timer's samples/s in rounds 0 … ``rounds`` − 1, every arm once per round for ``steps(arm, r)`` steps
    (0: not this round, None recorded), in the order A B C, then C B A, A B C …: the order alternates so that
    whatever favours a place in the round (the arm after the longest one, a load that grows or fades) favours
    each arm equally over two rounds. ``budgets`` (``bench.budget.Budget`` per arm) are charged with the rounds'
    time."""
    out: dict[str, list[float | None]] = {arm: [] for arm in timers}
    order = list(timers)
    for r in range(rounds):
        if between_rounds is not None:
            between_rounds(r)
        for arm in (order if r % 2 == 0 else order[::-1]):
            n, result = steps(arm, r), [None]
            if n:
                one = lambda k, a=arm, res=result: res.__setitem__(0, timers[a].round(k))  # noqa: E731
                budgets[arm].run(n, one) if budgets else one(n)
            out[arm].append(result[0])
    return out


def run(params: Params, data_dir) -> dict[str, Any]:
    """The speed stage's measurement on the prepared data in ``data_dir``: the training split's first
    ``speed.steps`` batches (every round trains on them), a batch of the validation split (the loop validates after
    each round, untimed)."""
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
    return measure(params, train, val, task, device, task.model_args(data.meta))


def _round_steps(budget, r: int, sp: Sizes) -> int:
    """Steps of round ``r`` under ``budget``: round 0 the warm-up and two windows; later at least two windows (a
    round's first is not counted) once the budget allows any."""
    if r == 0:
        return sp.warmup_steps + 2 * sp.window
    if budget.seconds is None:
        return sp.steps
    n = budget.steps_for(r)
    return max(n, 2 * sp.window) if n else 0


def isolated_memory(params: Params, train: Split, val: Split, task, device: torch.device, contract, arms,
                    sp: Sizes):
    """Each arm's peak memory with only its own model, gradients and optimizer state alive (CUDA; on a CPU the
    process's peak RSS cannot be reset or told apart by arm: None)."""
    if device.type != "cuda":
        return {arm: None for arm in arms}
    peaks = {}
    for arm in arms:
        gc.collect()
        torch.cuda.empty_cache()
        reset_peak_memory(device)
        timer = ArmTimer(arm, params, train, val, task, device, contract, sp)
        timer.round(2 * sp.window)  # the optimizer's state exists from the first step
        peaks[arm] = peak_memory_mb(device)["peak_memory_mb"]
        del timer
    gc.collect()
    return peaks


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
                     f"rounds" + (f" — unstable ({rounds_text(row)})" if row["unstable"] else ""))
        lines.append(f"[{arm}] {sps}{ratio}")
    return lines


def load(path, arms: list[str], device_name: str) -> dict[str, Any] | None:
    """The speed stage's result at ``path`` for the evaluate stage, checked against what it compares: measured on
    the device the arms trained on, every arm of ``arms`` timed or skipped. None when there is no file (a stage
    run by hand without the speed stage: evaluate then says its speed comes from training time)."""
    from pathlib import Path

    from ampbench.errors import DataError
    from ampbench.runtime.files import read_json

    path = Path(path)
    if not path.exists():
        return None
    rerun = "rerun the speed stage (dvc repro)"
    result = read_json(path, rerun)
    if not isinstance(result, dict) or not isinstance(result.get("arms"), dict) or "device" not in result:
        raise DataError(f"{path}: not what the speed stage writes (expected keys arms, device); {rerun}")
    if result["device"] != device_name:
        raise DataError(f"{path}: measured on {result['device']!r}, but the arms trained on {device_name!r}; {rerun}")
    missing = [a for a in arms if a not in result["arms"] and a not in result.get("skipped", {})]
    if missing:
        raise DataError(f"{path}: no timing for {', '.join(missing)} of train.precisions; {rerun}")
    return result
