"""The speed harness the speed stage and ``ampbench bench`` share: arms that train through the pipeline's loop,
interleaved round by round in alternating order (A B C, C B A, A B C …) so whatever else runs on the machine lands
on every arm alike, each round's fastest timing window after its first, and each arm's peak memory with only that
arm alive.

``LoopArm`` is one arm ready to step (the caller builds its model, state and loop settings: the train stage's way
for the speed stage, synthetic data for the bench); anything with ``round(steps, window) -> samples/s of each
window`` can be interleaved (the bench's bare loop too). The numbers over rounds are ``ratios.py``; the sizes and
budgets ``budget.py``. No files or MLflow here.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ampbench.data.splits import Split
from ampbench.precision.policy import PrecisionPolicy
from ampbench.runtime import memory
from ampbench.runtime.hardware import peak_memory_mb, reset_peak_memory
from ampbench.speed.budget import FIRST_STEPS, Budget, Plan, Sizes
from ampbench.training.loop import fit
from ampbench.training.state import EpochRecord, LoopConfig, TrainState


class Runner(Protocol):
    def round(self, steps: int, window: int) -> list[float]:
        """Train ``steps`` steps; samples/s of each timing window of ``window`` steps it closed."""


def fastest_after_first(windows: list[float]) -> float | None:
    """A round's value: the fastest of its timing windows after the first. The first carries the round's start;
    fastest, not median: another process's load only ever slows a window down, so on a busy machine the fastest
    window is the one least disturbed (timeit's rule). With the two cores kept busy by other processes, one round's
    ratio of an arm to itself scattered by ±2–4% this way and by ±20–24% with the median; quiet, both ±1–5%."""
    kept = windows[1:]
    return max(kept) if kept else None


class LoopArm:
    """One arm through the pipeline's own loop (``training.loop.fit``: the same step, telemetry, divergence checks
    and input path as the train stage), on the first batches of ``train``; what it learns is thrown away.
    ``on_epoch`` sees each round's records (the bench times its logging there)."""

    def __init__(self, policy: PrecisionPolicy, state: TrainState, cfg: LoopConfig, train: Split, val: Split,
                 on_epoch: Callable[[EpochRecord, TrainState], None] | None = None):
        self.policy, self.state, self.cfg, self.train, self.val = policy, state, cfg, train, val
        self.on_epoch = on_epoch

    def round(self, steps: int, window: int) -> list[float]:
        """Train ``steps`` steps (passes over the split's batches as needed, as training does); samples/s of each
        window of ``window`` steps."""
        self.policy.apply_backend_flags()
        bs = self.cfg.train.batch_size
        n = min(len(self.train), steps * bs)
        part = self.train if n == len(self.train) else Split(self.train.x[:n], self.train.y[:n], self.train.norm)
        passes = math.ceil(steps / max(1, len(part) // bs))
        # This round's loop settings: as many epochs as it takes, no bar, its windows, none left out as warm-up
        # (round 0 is the harness's warm-up); the train params stay the user's.
        cfg = dataclasses.replace(self.cfg, epochs=self.state.epoch + passes, progress=False, timing_window=window,
                                  warmup_steps=0)
        records = fit(self.state, part, self.val, self.policy, cfg, on_epoch=self.on_epoch)
        return [w for record in records for w in record.windows]


@dataclass(frozen=True)
class Measured:
    """Every arm's samples/s in each measured round (None: it did not run that round), and its budget's record."""

    rounds: dict[str, list[float | None]]
    budgets: dict[str, dict]


def measure(runners: dict[str, Runner], sizes: Sizes, between_rounds: Callable[[int], None] | None = None,
            budgets: dict[str, Budget] | None = None, more: Callable[[dict[str, list]], bool] | None = None,
            most_rounds: int = 0) -> Measured:
    """Each runner's first call (``budget.FIRST_STEPS`` steps, windows of one), round 0 (the warm-up, never
    counted) and ``sizes.rounds`` measured rounds, interleaved; then, while ``more(rounds so far)`` and up to
    ``most_rounds`` rounds in all, a round more for every runner (all or none: ratios pair runners round by round).
    Every phase is charged to the runner's budget (``budgets``: the caller's, already charged with what it did
    first; else fresh ones). ``between_rounds(r)`` is called before round r (tests use it to change the load)."""
    budgets = budgets if budgets is not None else {name: Budget(sizes) for name in runners}
    first = {}
    for name, runner in runners.items():
        first[name] = budgets[name].charge("first call", lambda r=runner: r.round(FIRST_STEPS, 1), FIRST_STEPS)
        budgets[name].first_call(first[name])
    if between_rounds is not None:
        between_rounds(0)
    for name, runner in runners.items():  # round 0, as much of it as the budget holds
        b = budgets[name]
        if steps := b.warmup():
            b.charge("warm-up", lambda r=runner, n=steps: r.round(n, sizes.window), steps)
            b.warmup_run = steps
        b.start_rounds()
    rounds = interleave(runners, budgets, first, between_rounds, more, most_rounds)
    return Measured(rounds, {name: b.record() for name, b in budgets.items()})


def interleave(runners: dict[str, Runner], budgets: dict[str, Budget], first: dict[str, list[float]],
               between_rounds: Callable[[int], None] | None = None,
               more: Callable[[dict[str, list]], bool] | None = None,
               most_rounds: int = 0) -> dict[str, list[float | None]]:
    """Each runner's value in rounds 1 … R (and the rounds ``more`` asks for), every runner once per round for the
    steps its budget gives (None: not this round), in the order C B A, then A B C, … (round 0 ran A B C): the
    order alternates so that whatever favours a place in the round (the arm after the longest one, a load that
    grows or fades) favours each arm equally over two rounds. A runner whose first call is its round 1
    (``first``: that call's windows) takes its value from it."""
    out: dict[str, list[float | None]] = {name: [] for name in runners}
    order = list(runners)
    total = max((b.sizes.rounds for b in budgets.values()), default=0)
    r = 1
    while r <= total or (more is not None and r <= most_rounds and more(out)):
        plans = {name: b.plan(r) for name, b in budgets.items()}
        if r > total and not all(plans.values()):  # a round more only if every runner still fits one
            break
        if between_rounds is not None:
            between_rounds(r)
        for name in (order if r % 2 == 0 else order[::-1]):
            out[name].append(_one_round(runners[name], budgets[name], r, plans[name], first[name]))
        r += 1
    return out


def _one_round(runner: Runner, b: Budget, r: int, plan: Plan | None, first: list[float]) -> float | None:
    """Round ``r`` of one runner: its value (the fastest window after the round's first), or None."""
    if r == 1 and b.first_is_round_1:
        b.ran(r, FIRST_STEPS)
        return fastest_after_first(first)
    if plan is None:
        b.stop(r)
        return None
    value = fastest_after_first(b.charge("rounds" if r <= b.sizes.rounds else "more rounds",
                                         lambda: runner.round(plan.steps, plan.window), plan.steps))
    b.ran(r, plan.steps)
    return value


def isolated_memory(build: Callable[[str], Runner], arms: list[str], device: torch.device, steps: int,
                    budgets: dict[str, Budget] | None = None) -> dict[str, float | None]:
    """Each arm's peak memory (MB) with only its own model, gradients and optimizer state alive: build, ``steps``
    steps, free, next. (Resetting the peak counter only lowers it to what is allocated now, so measuring with every
    arm alive would count the others' state too.) Only where ``memory.per_arm`` (CUDA): elsewhere None. With
    ``budgets``, each arm's pass is charged to its budget and runs the steps that still fit (none: None, noted)."""
    if not memory.per_arm(device.type):
        return {arm: None for arm in arms}
    peaks: dict[str, float | None] = {}
    for arm in arms:
        b = budgets.get(arm) if budgets else None
        n = steps if b is None or b.fits(reserve=False) is None else min(steps, b.fits(reserve=False))
        if n < 1:  # the optimizer's state exists from the first step: without one there is nothing to measure
            b.cut["memory"] = "no step fits what is left: not measured"
            peaks[arm] = None
            continue
        peaks[arm] = _peak_alone(build, arm, device, n) if b is None else b.charge(
            "memory", lambda a=arm, k=n: _peak_alone(build, a, device, k), n)
    gc.collect()
    return peaks


def _peak_alone(build: Callable[[str], Runner], arm: str, device: torch.device, steps: int) -> float:
    """``arm``'s peak memory (MB) over ``steps`` steps, built after everything else was freed."""
    gc.collect()
    torch.cuda.empty_cache()
    reset_peak_memory(device)
    runner = build(arm)
    runner.round(steps, steps)
    peak = peak_memory_mb(device)["peak_memory_mb"]
    del runner
    return peak
