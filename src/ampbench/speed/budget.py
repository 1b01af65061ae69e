"""What one speed measurement runs (``Sizes``: rounds, steps, windows, warm-up, a time budget per arm) and how many
steps each round of one arm may run within its budget (``Budget``). Torch-free; ``harness.py`` calls both.

Round 0 warms up (``warmup_steps`` and two windows, whatever it costs) and is never counted; its time per step
sizes the rounds after it when there is a budget. A round's value is its fastest window after its first, so every
round that runs has at least two windows; round 1 runs two whatever they cost, the least that measures a speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from ampbench.config.rules import size_problem
from ampbench.errors import ParamsError

T = TypeVar("T")


@dataclass(frozen=True)
class Sizes:
    """The sizes of one measurement, checked when made (``ParamsError`` naming the first that cannot measure)."""

    rounds: int  # measured rounds, after round 0
    steps: int  # optimizer steps per measured round
    window: int  # steps per timing window
    warmup_steps: int  # steps of round 0 before its windows
    seconds: float | None = None  # wall seconds each arm may spend; None: every round in full
    window_cut: bool = False  # the window asked for was longer than one pass over the data

    def __post_init__(self) -> None:
        problem = size_problem(self.rounds, self.steps, self.window, self.warmup_steps, self.seconds)
        if problem:
            raise ParamsError(f"{problem[0]}: {problem[1]}")

    def within(self, batches_per_pass: int) -> Sizes:
        """The window no longer than one pass over the data (windows never span two passes)."""
        window = max(1, min(self.window, batches_per_pass))
        if window == self.window:
            return self
        return Sizes(self.rounds, self.steps, window, self.warmup_steps, self.seconds, True)  # steps ≥ 2 windows still

    @property
    def first_round(self) -> int:
        """Steps of round 0: the warm-up and two windows."""
        return self.warmup_steps + 2 * self.window


class Budget:
    """One arm's wall-time budget. Without one, round 0 and then ``rounds`` full rounds. With one, round 0 and two
    windows of round 1 whatever they cost, then each round the steps the time left allows spread over the rounds
    left, in whole windows, up to ``steps``; an arm that cannot fit two more windows stops, and is marked cut
    short."""

    def __init__(self, sizes: Sizes):
        self.sizes, self.seconds = sizes, sizes.seconds
        self.total_rounds = sizes.rounds + 1
        self.spent, self.steps_run, self.rounds_run, self.cut = 0.0, 0, 0, False

    def steps_for(self, r: int) -> int:
        """Steps of round ``r`` (0: the warm-up round; a result of 0: stop)."""
        s = self.sizes
        if r == 0:
            return s.first_round
        if self.rounds_run < r:  # stopped in an earlier round: stays stopped
            return 0
        if self.seconds is None:
            return s.steps
        per_step, left = self.spent / self.steps_run, self.seconds - self.spent
        n = min(s.steps, int(left / (self.total_rounds - r) / per_step) // s.window * s.window)
        if n < 2 * s.window:  # not two windows for every round left: a round of two while the budget holds it,
            n = 2 * s.window if left >= 2 * s.window * per_step or r == 1 else 0  # and round 1 whatever it costs
        self.cut = self.cut or n < s.steps
        return n

    def run(self, steps: int, one_round: Callable[[int], T]) -> T:
        """``one_round(steps)``, its time charged to the budget; what it returns."""
        t0 = time.perf_counter()
        value = one_round(steps)
        self.spent += time.perf_counter() - t0
        self.steps_run += steps
        self.rounds_run += 1
        return value

    def record(self) -> dict[str, Any]:
        return {"budget_s": self.seconds, "steps_measured": self.steps_run, "rounds_run": self.rounds_run,
                "cut_short": self.cut}
