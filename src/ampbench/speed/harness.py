"""The speed harness the speed stage and ``ampbench bench`` share: arms that train through the pipeline's loop,
interleaved round by round in alternating order (A B C, C B A, A B C …) so whatever else runs on the machine lands
on every arm alike, each round's fastest timing window after its first, and each arm's peak memory with only that
arm alive.

``LoopArm`` is one arm ready to step (the caller builds its model, state and loop settings: the train stage's way
for the speed stage, synthetic data for the bench); anything with ``round(steps) -> samples/s | None`` can be
interleaved (the bench's bare loop too). The numbers over rounds are ``ratios.py``; the sizes and budgets
``budget.py``. No files or MLflow here.
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
from ampbench.runtime.hardware import peak_memory_mb, reset_peak_memory
from ampbench.speed.budget import Budget, Sizes
from ampbench.training.loop import fit
from ampbench.training.state import EpochRecord, LoopConfig, TrainState


class Runner(Protocol):
    def round(self, steps: int) -> float | None:
        """Train ``steps`` steps; samples/s of the round's fastest window after its first (None: none kept)."""


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

    def round(self, steps: int) -> float | None:
        """Train ``steps`` steps (passes over the split's batches as needed, as training does)."""
        self.policy.apply_backend_flags()
        bs = self.cfg.train.batch_size
        n = min(len(self.train), steps * bs)
        part = self.train if n == len(self.train) else Split(self.train.x[:n], self.train.y[:n], self.train.norm)
        passes = math.ceil(steps / max(1, len(part) // bs))
        # This round's loop settings: as many epochs as it takes, no bar; the train params stay the user's.
        cfg = dataclasses.replace(self.cfg, epochs=self.state.epoch + passes, progress=False)
        records = fit(self.state, part, self.val, self.policy, cfg, on_epoch=self.on_epoch)
        return fastest_after_first([w for record in records for w in record.windows])


@dataclass(frozen=True)
class Measured:
    """Every arm's samples/s in each measured round (None: it did not run that round), and its budget's record."""

    rounds: dict[str, list[float | None]]
    budgets: dict[str, dict]


def measure(runners: dict[str, Runner], sizes: Sizes,
            between_rounds: Callable[[int], None] | None = None) -> Measured:
    """Each runner one untimed step first (the first step compiles: torch.compile, torchao's optimizer, ~9 s on a
    CPU, which round 0's time per step would otherwise charge to the budget), then round 0 (the warm-up, never
    counted) and ``sizes.rounds`` measured rounds, interleaved. ``between_rounds(r)`` is called before round r
    (tests use it to change the load)."""
    for runner in runners.values():
        runner.round(1)
    budgets = {name: Budget(sizes) for name in runners}
    rounds = interleave(runners, budgets, between_rounds)
    return Measured({name: values[1:] for name, values in rounds.items()},
                    {name: b.record() for name, b in budgets.items()})


def interleave(runners: dict[str, Runner], budgets: dict[str, Budget],
               between_rounds: Callable[[int], None] | None = None) -> dict[str, list[float | None]]:
    """Each runner's value in rounds 0 … R, every runner once per round for the steps its budget gives (0: not
    this round, None recorded), in the order A B C, then C B A, A B C …: the order alternates so that whatever
    favours a place in the round (the arm after the longest one, a load that grows or fades) favours each arm
    equally over two rounds."""
    out: dict[str, list[float | None]] = {name: [] for name in runners}
    order = list(runners)
    total = max(b.total_rounds for b in budgets.values()) if budgets else 0
    for r in range(total):
        if between_rounds is not None:
            between_rounds(r)
        for name in (order if r % 2 == 0 else order[::-1]):
            steps = budgets[name].steps_for(r)
            out[name].append(budgets[name].run(steps, runners[name].round) if steps else None)
    return out


def isolated_memory(build: Callable[[str], Runner], arms: list[str], device: torch.device,
                    steps: int) -> dict[str, float | None]:
    """Each arm's peak memory (MB) with only its own model, gradients and optimizer state alive: build, ``steps``
    steps, free, next. (Resetting the peak counter only lowers it to what is allocated now, so measuring with every
    arm alive would count the others' state too.) CUDA only: on a CPU the process's peak RSS cannot be reset or
    told apart by arm, so None."""
    if device.type != "cuda":
        return {arm: None for arm in arms}
    peaks: dict[str, float | None] = {}
    for arm in arms:
        gc.collect()
        torch.cuda.empty_cache()
        reset_peak_memory(device)
        runner = build(arm)
        runner.round(steps)  # the optimizer's state exists from the first step
        peaks[arm] = peak_memory_mb(device)["peak_memory_mb"]
        del runner
    gc.collect()
    return peaks
