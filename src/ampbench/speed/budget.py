"""How many steps each round of one arm may run within its wall-time budget (``BenchConfig.arm_budget``).

Torch-free: the loop (``loop.py``) calls ``steps_for`` before each round and ``run`` to time it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from ampbench.bench.config import BenchConfig, first_round_steps


class Budget:
    """One arm's wall-time budget in one phase. Without one (None), ``rounds`` full rounds. With one, round 0 runs
    the warm-up and one window whatever it costs (``config.first_round_steps``: the least that measures anything;
    its time per step sizes the rest), then each round the steps the time left allows spread over the rounds left,
    in whole windows, up to ``steps``; an arm that cannot fit one more window stops and is marked cut short."""

    def __init__(self, cfg: BenchConfig, seconds: float | None):
        self.cfg, self.seconds = cfg, seconds
        self.total_rounds = cfg.rounds + (seconds is not None)
        self.spent, self.steps_run, self.rounds_run, self.cut = 0.0, 0, 0, False

    def steps_for(self, r: int) -> int:
        """Steps of round ``r`` (0-based; 0: stop)."""
        c = self.cfg
        if self.seconds is None:
            return c.steps
        if r == 0:
            return first_round_steps(c.warmup_steps, c.window)
        per_step, left = self.spent / self.steps_run, self.seconds - self.spent
        n = min(c.steps, int(left / (self.total_rounds - r) / per_step) // c.window * c.window)
        if n < c.window:  # not a window for every round left: one more while the budget holds it
            n = c.window if left >= c.window * per_step else 0
        self.cut = self.cut or n < c.steps
        return n

    def run(self, steps: int, *rounds: Callable[[int], None]) -> None:
        t0 = time.perf_counter()
        for one in rounds:
            one(steps)
        self.spent += time.perf_counter() - t0
        self.steps_run += steps
        self.rounds_run += 1

    def record(self) -> dict[str, Any]:
        return {"budget_s": self.seconds, "steps_measured": self.steps_run, "rounds_run": self.rounds_run,
                "cut_short": self.cut}


def prime(cfg: BenchConfig, runners: Iterable[Any]) -> None:
    """Under a time budget, one unmeasured step per runner (``round(1, measured=False)``) before its budget starts:
    the first step compiles (``--compile``, torchao's optimizer: ~9 s on a CPU), and round 0's time per step, which
    sizes the rounds left, would otherwise include it and leave a compiled arm a round or two. Without a budget the
    warm-up steps absorb it, as before."""
    if cfg.arm_budget is not None:
        for runner in runners:
            runner.round(1, measured=False)
