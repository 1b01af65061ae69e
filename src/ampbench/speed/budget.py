"""What one speed measurement runs (``Sizes``: rounds, steps, windows, warm-up, a time budget per arm) and how one
arm's wall-time budget is spent over every phase it runs (``Budget``). Torch-free; ``harness.py`` calls both.

An arm's phases, each charged to its budget: whatever its caller charges first (the bench: building the arm), the
first call (``FIRST_STEPS`` steps in windows of one step, whatever they cost: it is how the budget learns what a
step costs), round 0 (the warm-up: ``warmup_steps`` and two windows, never counted), the measured rounds, and what
its caller charges after (the bench: the FLOP count; on CUDA the memory pass). Without a budget every phase runs in
full. With one, every phase after the first call runs only the steps its cost so far says still fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from ampbench.config.rules import size_problem
from ampbench.errors import ParamsError

T = TypeVar("T")

# The first call: two steps in windows of one. The first window pays for the arm's one-off costs (the first step
# compiles under torch.compile or torchao's optimizer, ~9 s on a CPU; kernels and caches), the second is the arm's
# first speed: when the budget has no room for a warm-up round (a step of seconds), these two steps are round 1,
# its first window not counted as no round's first is.
FIRST_STEPS = 2


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


@dataclass(frozen=True)
class Plan:
    """One measured round of one arm: ``steps`` steps in timing windows of ``window`` steps."""

    steps: int
    window: int


class Budget:
    """One arm's wall time over all its phases (``charge``), and the steps each phase may run (``warmup``,
    ``plan``). With a budget, a phase runs only the steps that fit in what is left, less ``reserve`` steps' worth
    kept for the phases after the rounds, at the arm's cost per step: the larger of its last two calls' (seconds
    over steps), so that a load that grows between calls overruns the budget less; for the first call, its last
    window's share of it, since its first window carries one-off costs (a compile: 100 steps' worth). Round 0 takes
    at most half of what two steps a measured round leave free; with no room for a step of it, the first call is
    round 1. The measured rounds then share what is left: windows shrink (to one
    step at least, unless ``shrink`` is off) so that every round gets two, each round the steps that fit spread over
    the rounds left; an arm that cannot fit two windows more stops. Every cut is noted by phase (``record``)."""

    def __init__(self, sizes: Sizes, reserve: float = 0.0, shrink: bool = True,
                 clock: Callable[[], float] = time.perf_counter):
        # shrink=False keeps the asked window (fewer rounds instead): where the ratio is the loop's own cost, which
        # comes in a period of steps (the pipeline's telemetry every 10), a window shorter than that could leave it out
        self.sizes, self.seconds, self.reserve, self.shrink, self.clock = sizes, sizes.seconds, reserve, shrink, clock
        self.spent = 0.0
        self.phases: dict[str, dict[str, float]] = {}  # phase → steps and seconds charged to it
        self.costs: list[float] = []  # seconds per step of each call that stepped
        self.window = sizes.window  # the measured rounds' window (shrunk when the budget cuts the rounds)
        self.warmup_run = 0  # steps of round 0
        self.round_steps: list[int] = []  # steps of each measured round that ran
        self.first_is_round_1 = False  # no room for a warm-up round: the first call is round 1
        self.stopped = False  # a measured round did not fit: the arm measures no more
        self.more_rounds = 0  # rounds past ``sizes.rounds`` (the caller asked for them until its interval decides)
        self.cut: dict[str, str] = {}  # phase → what it got, where the budget cut it

    def charge(self, phase: str, fn: Callable[[], T], steps: int = 0) -> T:
        """``fn()``, its wall time charged to ``phase`` (and ``steps`` steps: a cost per step); its value."""
        t0 = self.clock()
        value = fn()
        seconds = self.clock() - t0
        self.spent += seconds
        row = self.phases.setdefault(phase, {"steps": 0, "seconds": 0.0})
        row["steps"] += steps
        row["seconds"] += seconds
        if steps:
            self.costs.append(seconds / steps)
        return value

    def first_call(self, windows: list[float]) -> None:
        """The first call's cost per step from its windows (samples/s, the same samples each): its last window's
        share of its time, without the one-off costs its first window carries."""
        if len(windows) >= 2 and all(w > 0 for w in windows) and self.costs:
            seconds = self.costs[-1] * FIRST_STEPS
            self.costs[-1] = seconds * (1 / windows[-1]) / sum(1 / w for w in windows)

    @property
    def per_step(self) -> float | None:
        """The cost per step the next phase is sized by (None: nothing stepped yet)."""
        return max(self.costs[-2:], default=None)

    def fits(self, reserve: bool = True) -> int | None:
        """The steps the time left holds at ``per_step`` (less the reserve); None: no budget (or nothing stepped)."""
        p = self.per_step
        if self.seconds is None or p is None:
            return None
        left = self.seconds - self.spent - (self.reserve * p if reserve else 0.0)
        return max(0, int(left / p)) if p > 0 else self.sizes.steps * (self.sizes.rounds + 1)

    def warmup(self) -> int:
        """Steps of round 0: all of them without a budget; with one, at most half of what the rounds' least leaves
        free (two steps a measured round; without ``shrink``, one round of two whole windows), so that a load that
        slows round 0 down twice over still leaves the rounds room. Round 0 with no room for a step makes the first
        call round 1 (where windows may shrink). One call: each call pays its own start (validation, logging)."""
        todo = self.sizes.first_round
        n = self.fits()
        if n is None:
            return todo
        room = 2 * self.sizes.rounds if self.shrink else 2 * self.sizes.window
        steps = max(0, min(todo, (n - room) // 2))
        if steps < todo:
            self.cut["warm-up"] = f"{steps} of {todo} steps"
            self.first_is_round_1 = steps == 0 and self.shrink  # its windows are of one step
        return steps

    def start_rounds(self) -> None:
        """Before round 1: the window the rounds left can each fit two of (the asked one when they fit)."""
        n, left = self.fits(), self.sizes.rounds - self.first_is_round_1
        if n is not None and left > 0 and self.shrink:
            self.window = min(self.sizes.window, max(1, n // (2 * left)))

    def plan(self, r: int) -> Plan | None:
        """Round ``r``'s steps and window (r ≥ 1; past ``sizes.rounds``: a round more), or None: the arm stops. A
        round the budget cuts says so; no round past one that did not fit."""
        s, w = self.sizes, self.window
        if self.stopped:
            return None
        n = self.fits()
        if n is None:
            return Plan(s.steps, w)
        rounds_left = max(1, s.rounds - r + 1)
        steps = min(s.steps, n // rounds_left // w * w)
        if steps < 2 * w:  # not two windows for every round left: a round of two while the budget holds them
            steps = 2 * w if n >= 2 * w else 0
        return Plan(steps, w) if steps else None

    def ran(self, r: int, steps: int) -> None:
        """Round ``r`` ran ``steps`` steps."""
        self.round_steps.append(steps)
        self.more_rounds += r > self.sizes.rounds

    def stop(self, r: int) -> None:
        """Round ``r`` did not fit: no round after it either; a planned round's absence is a cut."""
        self.stopped = True
        if r <= self.sizes.rounds:
            self.cut["rounds"] = self._rounds_text()

    def record(self) -> dict[str, Any]:
        """What the arm ran and spent, by phase, and what the budget cut (JSON)."""
        s = self.sizes
        planned = self.round_steps[self.first_is_round_1:s.rounds]  # the first call's two are noted as warm-up's cut
        if len(self.round_steps) >= s.rounds and (min(planned, default=s.steps) < s.steps or self.window < s.window):
            self.cut["rounds"] = self._rounds_text()
        return {"budget_s": self.seconds, "seconds": round(self.spent, 3), "window": self.window,
                "warmup_steps_run": self.warmup_run, "first_call_is_round_1": self.first_is_round_1,
                "rounds_run": len(self.round_steps), "steps_measured": sum(self.round_steps),
                "round_steps": list(self.round_steps), "more_rounds": self.more_rounds,
                "phases": {k: {"steps": int(v["steps"]), "seconds": round(v["seconds"], 3)}
                           for k, v in self.phases.items()},
                "cut": dict(self.cut), "cut_short": bool(self.cut)}

    def _rounds_text(self) -> str:
        s, n = self.sizes, len(self.round_steps)
        planned = self.round_steps[:s.rounds]
        first = " (its first call's two steps as round 1)" if self.first_is_round_1 else ""
        return (f"{min(n, s.rounds)} of {s.rounds} rounds, {sum(planned)} steps{first} in windows of {self.window}, "
                f"not {s.rounds} × {s.steps} in windows of {s.window}")
