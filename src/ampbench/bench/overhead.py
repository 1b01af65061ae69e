"""``ampbench bench``'s goal lines: the pipeline's loop against the tutorial's bare loop (bare ÷ pipeline samples/s
over rounds, goal ≤ OVERHEAD_GOAL) and the share of an epoch spent logging (goal ≤ LOGGING_GOAL), each with its
interval and a verdict from it: within, above or undecided (``speed.ratios.goal_verdict``). ``loop.py`` builds the
two loops and calls ``loop_overhead`` per overhead arm.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ampbench.bench.config import LOGGING_GOAL, OVERHEAD_GOAL, OVERHEAD_MOST_ROUNDS, BenchConfig
from ampbench.errors import ArmUnavailable
from ampbench.speed import harness
from ampbench.speed.budget import Budget
from ampbench.speed.ratios import UNDECIDED, goal_verdict, median_interval, median_value, ratio, verdict_text


class Logged:
    """The pipeline loop's per-epoch hook timed: each epoch's logging call against its training seconds, kept for the
    measured rounds only (``round_starts``: the first call and the warm-up round are not what is measured)."""

    def __init__(self, log_epoch: Callable[[dict, list], None]):
        self.log_epoch, self.counting = log_epoch, False
        self.logging_seconds: list[float] = []  # per counted epoch
        self.train_seconds: list[float] = []

    def round_starts(self, r: int) -> None:
        self.counting = r >= 1

    def __call__(self, record: Any, _state: Any) -> None:
        """After an epoch (``training.state.EpochRecord``): log it, timed."""
        t0 = time.perf_counter()
        self.log_epoch(record.row(), record.steps)
        if self.counting:
            self.logging_seconds.append(time.perf_counter() - t0)
            self.train_seconds.append(record.epoch_seconds)

    @property
    def shares(self) -> list[float]:
        """Each counted epoch's logging seconds over its training seconds."""
        return [log / train for log, train in zip(self.logging_seconds, self.train_seconds, strict=True) if train > 0]


def logging_share(logged: list[Logged]) -> dict[str, Any]:
    """The logging share over every counted epoch of the overhead check's pipeline loops: the median of the epochs'
    shares with its order-statistic interval, and its verdict against LOGGING_GOAL from that interval."""
    shares = [x for lg in logged for x in lg.shares]
    iv = median_interval(shares)
    verdict = goal_verdict(iv, LOGGING_GOAL)
    return {"seconds": sum(x for lg in logged for x in lg.logging_seconds),
            "train_seconds": sum(x for lg in logged for x in lg.train_seconds), "epochs": len(shares),
            "share": iv and iv.median, "share_ci": iv and [iv.low, iv.high], "coverage": iv and iv.coverage,
            "goal": LOGGING_GOAL, "verdict": verdict,
            "verdict_text": verdict_text(verdict, iv, f"≤ {100 * LOGGING_GOAL:g}%", len(shares), "epoch")}


def loop_overhead(cfg: BenchConfig, bare: Callable[[], harness.Runner],
                  pipeline: Callable[[Logged], harness.Runner], log_epoch: Callable[[dict, list], None],
                  logged: list[Logged]) -> dict[str, Any]:
    """One overhead arm: its bare loop (``bare()``) and the pipeline's loop (``pipeline(hook)``, the hook timing its
    logging) through the harness, interleaved, each on a budget of its own (building included); rounds are added
    while its verdict or the logging share's is undecided, up to OVERHEAD_MOST_ROUNDS × ``rounds`` in all or until
    a loop's budget ends. ``logged`` gains the arm's hook. Its row (or why it was skipped)."""
    lg = Logged(log_epoch)
    # Windows of --window steps whatever the budget: the pipeline's telemetry comes every 10 steps, and a round's
    # fastest window of fewer could be one without it, hiding the very cost this check measures.
    budgets = {name: Budget(cfg.sizes(), shrink=False) for name in ("bare", "pipeline")}
    try:
        runners = {"bare": budgets["bare"].charge("build", bare),
                   "pipeline": budgets["pipeline"].charge("build", lambda: pipeline(lg))}
    except ArmUnavailable as exc:
        return {"skipped": str(exc)}
    logged.append(lg)

    def undecided(rounds: dict[str, list]) -> bool:
        r = ratio(rounds["bare"], rounds["pipeline"])
        return UNDECIDED in (goal_verdict(r and r.interval, OVERHEAD_GOAL),
                             goal_verdict(median_interval(lg.shares), LOGGING_GOAL))

    most = OVERHEAD_MOST_ROUNDS * cfg.rounds
    return _row(harness.measure(runners, cfg.sizes(), lg.round_starts, budgets, undecided, most), lg, most)


def _row(measured: harness.Measured, lg: Logged, most: int) -> dict[str, Any]:
    """One overhead arm's row: both loops' speeds, their ratio with its interval and verdict (undecided: after how
    many rounds, and what stopped them), each loop's budget."""
    r = ratio(measured.rounds["bare"], measured.rounds["pipeline"])
    iv = r and r.interval
    verdict = goal_verdict(iv, OVERHEAD_GOAL)
    text = verdict_text(verdict, iv, f"≤ {OVERHEAD_GOAL:g}", len(r.by_round) if r else 0)
    if verdict == UNDECIDED and iv is not None:
        ran = len(measured.rounds["bare"])
        text += f"; {most} rounds is the most it runs" if ran >= most else "; no round more fit a loop's budget"
    return {"bare_samples_per_s": median_value(measured.rounds["bare"]),
            "pipeline_samples_per_s": median_value(measured.rounds["pipeline"]),
            "ratio": iv and iv.median, "ratio_ci": iv and [iv.low, iv.high], "coverage": iv and iv.coverage,
            "goal": OVERHEAD_GOAL, "verdict": verdict,
            "verdict_text": text,
            "rounds": [sum(v is not None for v in measured.rounds[n]) for n in ("bare", "pipeline")],
            "logging_seconds": sum(lg.logging_seconds), "train_seconds": sum(lg.train_seconds),
            "budgets": measured.budgets, "cut_short": any(b["cut_short"] for b in measured.budgets.values())}
