"""The speed harness the speed stage and `ampbench bench` share: the order-statistic interval, the per-round
ratios, the alternating order, budgets, and the property it exists for — a neighbour's load during part of the
measurement moves the interleaved ratio little, while timing each arm in its own period (what training-time
throughput does) moves a lot; and the bench's and the stage's ratios on one config agree."""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
import time

import numpy as np
import pytest
import torch

from ampbench.config.validation import validate
from ampbench.data.splits import Split
from ampbench.errors import ParamsError
from ampbench.speed.budget import Budget, Sizes
from ampbench.speed.harness import fastest_after_first, measure
from ampbench.speed.ratios import ABOVE, UNDECIDED, WITHIN, goal_verdict, median_interval, summarise, verdict_text
from ampbench.stages.speed import loop_arm, sizes
from ampbench.tasks.classification import CLASSIFICATION
from conftest import ROOT


def test_median_interval_is_the_order_statistics_binomial_coverage_gives():
    five = median_interval([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (five.median, five.low, five.high) == (3.0, 1.0, 5.0) and five.coverage == pytest.approx(1 - 2 / 32)
    nine = median_interval([float(x) for x in range(1, 10)])  # P(B(9,½) < 2) = 10/512: [x(2), x(8)], 96.1%
    assert (nine.low, nine.high) == (2.0, 8.0) and nine.coverage == pytest.approx(1 - 20 / 512)
    assert median_interval([]) is None and median_interval([2.0]).coverage == 0.0
    # By simulation: the interval covers the true median at least as often as it says.
    rng = np.random.default_rng(29)
    hits = sum(iv.low <= 0 <= iv.high for iv in (median_interval(list(rng.standard_t(3, 9))) for _ in range(2000)))
    assert hits / 2000 >= 0.95


def test_a_goal_is_within_or_above_only_when_the_whole_interval_is():
    """The bench's goal lines (loop overhead ≤ 1.03, logging ≤ 2%): within when all of the interval is at or below
    the goal, above when all of it is above, undecided when it holds the goal — or is no interval worth the name
    (fewer than 5 rounds: their range covers the median with less than 90%)."""
    within = median_interval([0.99, 1.00, 1.01, 1.02, 1.03])
    above = median_interval([1.031, 1.05, 1.06, 1.07, 1.20])
    straddling = median_interval([0.93, 1.00, 1.05, 1.10, 1.16])  # 1.050 [0.93, 1.16]: issue 49's line
    assert goal_verdict(within, 1.03) == WITHIN and goal_verdict(above, 1.03) == ABOVE
    assert goal_verdict(straddling, 1.03) == UNDECIDED and goal_verdict(None, 1.03) == UNDECIDED
    few = median_interval([1.20, 1.21, 1.22, 1.23])  # all above, but 4 rounds: 87.5% coverage
    assert goal_verdict(few, 1.03) == UNDECIDED
    assert verdict_text(UNDECIDED, few, "≤ 1.03", 4) == "undecided: 4 rounds, too few for a 90% interval (5 at least)"
    assert verdict_text(UNDECIDED, straddling, "≤ 1.03", 5) == ("undecided: the interval holds the goal (≤ 1.03) "
                                                                "after 5 rounds")
    assert verdict_text(WITHIN, within, "≤ 1.03", 5) == "within (over 5 rounds)"


def test_ratios_pair_arms_round_by_round_and_name_the_rounds_that_disagree():
    rounds = {"fp32": [100.0, 100.0, 50.0, 100.0, 100.0], "bf16": [150.0, 150.0, 75.0, 150.0, 300.0],
              "fp16": [None, 80.0, 40.0, 80.0, 80.0]}
    arms = summarise(rounds)["arms"]
    assert arms["bf16"]["ratios"] == [1.5, 1.5, 1.5, 1.5, 3.0] and arms["bf16"]["speedup_vs_fp32"] == 1.5
    assert arms["bf16"]["disagreeing_rounds"] == [5] and arms["bf16"]["unstable"] is True  # [1.5, 3.0]
    assert arms["fp16"]["ratios"] == [0.8] * 4 and arms["fp16"]["unstable"] is False  # round 1: no fp16 value
    assert arms["fp16"]["speedup_vs_fp32_ci"] == [0.8, 0.8]
    assert "speedup_vs_fp32" not in arms["fp32"] and arms["fp32"]["samples_per_s"] == 100.0


def _hog_class():
    """``Hog`` of scripts/speed_under_load.py (the BENCHMARKS figures), the same load the test applies."""
    spec = importlib.util.spec_from_file_location("speed_under_load", ROOT / "scripts" / "speed_under_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Hog


ROUNDS, STEPS = 11, 80  # a round of 80 steps (8 windows, 7 counted) takes ~0.25 s here


@pytest.fixture
def two_fp32_timers():
    """The same arm twice (so the true ratio is exactly 1), through the pipeline's loop, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    params = validate({"train": {"device": "cpu", "batch_size": 64, "model": "mlp", "width": 256, "progress": False},
                       "speed": {"steps": STEPS, "window": 10, "warmup_steps": 10}})
    g = torch.Generator().manual_seed(0)
    n = 64 * STEPS
    train = Split(torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))
    val = Split(train.x[:64], train.y[:64])
    contract = {"input_shape": (1, 16, 16), "num_classes": 10}
    timers = [loop_arm("fp32", params, train, val, CLASSIFICATION, torch.device("cpu"), contract, sizes(params))
              for _ in "AB"]
    for t in timers:
        t.round(20, 10)  # warm-up
    yield dict(zip("AB", timers, strict=True))
    torch.set_num_threads(threads)


def _ratio(timers, between_rounds=None) -> tuple[float, list[float]]:
    """B/A through the harness, as the speed stage measures: (median over rounds, per round)."""
    rounds = measure(timers, Sizes(ROUNDS, STEPS, 10, 10), between_rounds).rounds
    ratios = [b / a for a, b in zip(rounds["A"], rounds["B"], strict=True)]
    return float(np.median(ratios)), ratios


class _Clocked:
    """A runner on a fake clock: each step costs ``seconds`` (its first call ``once`` more: a compile), each window
    reads 1 / seconds samples/s; it notes its calls as (steps, window) and ``seen`` its name."""

    def __init__(self, clock: list[float], seconds: float, once: float = 0.0, name: str = "", seen=None):
        self.clock, self.seconds, self.once, self.name, self.seen = clock, seconds, once, name, seen
        self.calls: list[tuple[int, int]] = []

    def round(self, steps: int, window: int) -> list[float]:
        self.calls.append((steps, window))
        if self.seen is not None:
            self.seen.append(self.name)
        once = self.once if len(self.calls) == 1 else 0.0  # in the call's first window
        self.clock[0] += steps * self.seconds + once
        windows = [window / (window * self.seconds)] * (steps // window)  # a sample a step
        if windows:
            windows[0] = window / (window * self.seconds + once)
        return windows


def _budgets(clock, names, seconds, reserve=0.0, shrink=True, **sizes):
    s = Sizes(**{"rounds": 5, "steps": 30, "window": 10, "warmup_steps": 10, "seconds": seconds, **sizes})
    return s, {n: Budget(s, reserve, clock=lambda: clock[0], shrink=shrink) for n in names}


def test_interleaving_alternates_the_order_round_by_round():
    """First calls and round 0 A B C, then C B A, A B C: a place in the round (first after a long arm, last before a
    load fades) falls to each arm alike over two rounds."""
    clock, seen = [0.0], []
    sizes, budgets = _budgets(clock, "ABC", None, rounds=2)
    out = measure({n: _Clocked(clock, 0.01, name=n, seen=seen) for n in "ABC"}, sizes, budgets=budgets).rounds
    assert "".join(seen) == "ABC" "ABC" "CBA" "ABC" and out == {n: [100.0, 100.0] for n in "ABC"}


def test_a_slow_arm_stops_at_its_budget_warm_up_and_all_and_says_what_was_cut():
    # 8 s a step (fp16 autocast at 16 samples/s of 128), 20 s: a second to build it, then its first call (two steps
    # in windows of one: 16 s, whatever they cost). No step more fits: no warm-up round, so the first call is round
    # 1 (its second window the speed), and the arm stops there, within its budget.
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["fp16"], 20.0)
    budgets["fp16"].charge("build", lambda: clock.__setitem__(0, clock[0] + 1.0))
    arm = _Clocked(clock, 8.0)
    measured = measure({"fp16": arm}, sizes, budgets=budgets)
    rec = measured.budgets["fp16"]
    assert arm.calls == [(2, 1)] and measured.rounds["fp16"] == [0.125, None, None, None, None]
    assert clock[0] == rec["seconds"] == 17.0 <= 20.0 and rec["cut_short"] and rec["first_call_is_round_1"]
    assert rec["phases"] == {"build": {"steps": 0, "seconds": 1.0}, "first call": {"steps": 2, "seconds": 16.0}}
    assert rec["cut"] == {"warm-up": "0 of 30 steps", "rounds": "1 of 5 rounds, 2 steps (its first call's two steps as "
                          "round 1) in windows of 1, not 5 × 30 in windows of 10"}


def test_a_budget_spreads_what_is_left_over_every_round_in_smaller_windows(monkeypatch):
    # 1 s a step: first call 2 s; round 0 takes at most half of what two steps for each of the 5 rounds leave free
    # (4 of its 30 steps); then the 14 s left are 5 rounds in windows of one step, each the steps that fit spread
    # over the rounds left, and the arm ends on its budget exactly.
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["bf16"], 20.0)
    arm = _Clocked(clock, 1.0)
    measured = measure({"bf16": arm}, sizes, budgets=budgets)
    rec = measured.budgets["bf16"]
    assert arm.calls == [(2, 1), (4, 10), (2, 1)] + [(3, 1)] * 4
    assert measured.rounds["bf16"] == [1.0] * 5 and rec["round_steps"] == [2, 3, 3, 3, 3] and rec["window"] == 1
    assert clock[0] == rec["seconds"] == 20.0
    assert rec["cut"] == {"warm-up": "4 of 30 steps",
                          "rounds": "5 of 5 rounds, 14 steps in windows of 1, not 5 × 30 in windows of 10"}
    # Without shrinking windows (the overhead check: its loops' cost comes every 10 steps), round 0 leaves room for
    # one round of two whole windows instead, and the rounds are fewer: 30 s, 2 for the first call, 4 of round 0,
    # then one round of two windows of 10.
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["bare"], 30.0, shrink=False, steps=20, warmup_steps=0)
    measured = measure({"bare": _Clocked(clock, 1.0)}, sizes, budgets=budgets)
    rec = measured.budgets["bare"]
    assert rec["window"] == 10 and rec["warmup_steps_run"] == 4 and rec["round_steps"] == [20] and clock[0] == 26.0
    assert rec["cut"]["rounds"] == "1 of 5 rounds, 20 steps in windows of 10, not 5 × 20 in windows of 10"
    # The reserve (steps' worth kept for what runs after the rounds: the bench's FLOP count) is left over.
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["bf16"], 20.0, reserve=2.0)
    measure({"bf16": _Clocked(clock, 1.0)}, sizes, budgets=budgets)
    assert 18.0 <= clock[0] <= 20.0 - 2.0


def test_a_first_call_that_compiles_does_not_make_a_fast_arm_look_slow():
    # The first call carries a 12 s compile in its first window: 6 s a step over the call, and one step would fit
    # the 8 s left. Its second window says what a step costs (10 ms), and the arm runs round 0 and every round in
    # full.
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["fp32"], 20.0)
    arm = _Clocked(clock, 0.01, once=12.0)
    measured = measure({"fp32": arm}, sizes, budgets=budgets)
    assert arm.calls == [(2, 1), (30, 10)] + [(30, 10)] * 5
    assert measured.rounds["fp32"] == [100.0] * 5 and not measured.budgets["fp32"]["cut_short"]


def test_without_a_budget_every_phase_runs_in_full():
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["fp16"], None)
    arm = _Clocked(clock, 5.0)  # the GPU profile: whatever it costs
    measured = measure({"fp16": arm}, sizes, budgets=budgets)
    assert arm.calls == [(2, 1), (30, 10)] + [(30, 10)] * 5 and not measured.budgets["fp16"]["cut_short"]


def test_rounds_are_added_while_undecided_until_a_budget_ends():
    """The overhead check's pair: a round more for both while ``more`` asks, until one loop's budget cannot fit
    one (both or neither: ratios pair the loops round by round), or the most rounds asked for."""
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["bare", "pipeline"], 20.0, rounds=2, steps=20, window=5, warmup_steps=0)
    runners = {"bare": _Clocked(clock, 0.1), "pipeline": _Clocked(clock, 0.2)}
    measured = measure(runners, sizes, budgets=budgets, more=lambda rounds: True, most_rounds=50)
    # pipeline: 0.4 s first call, 2 s round 0, 4 s a round: 2 planned + 2 more (18.4 s); 1.6 s left cannot hold two
    # windows (2 s), so the pair stops, bare with budget to spare.
    assert [len(v) for v in measured.rounds.values()] == [4, 4]
    rec = measured.budgets["pipeline"]
    assert rec["more_rounds"] == 2 and rec["round_steps"] == [20] * 4 and not rec["cut_short"]
    assert rec["seconds"] == pytest.approx(18.4) and measured.budgets["bare"]["seconds"] < 10
    clock = [0.0]
    sizes, budgets = _budgets(clock, ["bare", "pipeline"], None, rounds=2, steps=20, window=5, warmup_steps=0)
    runners = {"bare": _Clocked(clock, 0.1), "pipeline": _Clocked(clock, 0.2)}
    measured = measure(runners, sizes, budgets=budgets, more=lambda rounds: len(rounds["bare"]) < 3, most_rounds=50)
    assert [len(v) for v in measured.rounds.values()] == [3, 3]  # decided after a round more
    measured = measure(runners, sizes, more=lambda rounds: True, most_rounds=4)
    assert [len(v) for v in measured.rounds.values()] == [4, 4]  # no budget: the most rounds asked for


def test_sizes_that_cannot_measure_are_refused_before_anything_runs():
    with pytest.raises(ParamsError, match=r"^steps: 15 is less than 2 × the window \(10\)"):
        Sizes(rounds=3, steps=15, window=10, warmup_steps=0)
    with pytest.raises(ParamsError, match=r"^warmup_steps: -1 is below 0"):
        Sizes(rounds=3, steps=20, window=10, warmup_steps=-1)
    with pytest.raises(ParamsError, match=r"^speed.steps: 15 is less than 2 × the window"):
        validate({"speed": {"steps": 15, "window": 10}})  # the check stage's rule (config/rules.py)
    base = validate({})  # past the check (a params object built by hand): the speed stage says the same
    params = dataclasses.replace(base, speed=dataclasses.replace(base.speed, steps=15, window=10))
    with pytest.raises(ParamsError, match=r"^speed.steps: 15 is less than 2 × the window"):
        sizes(params)
    cut = Sizes(rounds=3, steps=20, window=10, warmup_steps=0).within(4)  # 4 batches a pass: windows of 4
    assert (cut.window, cut.window_cut, cut.first_round) == (4, True, 8)


@pytest.mark.timing
def test_a_neighbours_load_moves_the_interleaved_ratio_little_and_the_separate_one_a_lot(two_fp32_timers):
    """Rounds A B, B A, …: a hog (busy processes, three per core) runs through a third of them, from round 3 (its
    end lands inside a round); the median over rounds of B/A stays within 10% of the same measurement without the
    hog. Timed separately — all of A, then all of B while the hog runs, as each arm's training is timed in its own
    process at its own time — the ratio moves far off 1. Both timers are the same arm, so whatever else moves the
    ratio is the machine: when it is busy even without the hog (another job sharing the cores), the quiet rounds
    scatter and the comparison says nothing; the test then skips, saying how much they scattered."""
    timers = two_fp32_timers
    start = time.monotonic()
    quiet, quiet_rounds = _ratio(timers)
    spread = 1.4826 * float(np.median(np.abs(np.array(quiet_rounds) - quiet)))  # a robust sd of one round's ratio
    if spread > 0.06:  # the two medians' difference then has an sd above 0.03: 10% would no longer be 3 sd
        pytest.skip(f"this machine is busy without the hog: one round's B/A of the same arm scattered by "
                    f"±{spread:.2f} (sd) over {ROUNDS} quiet rounds, too much to see what the hog adds")
    round_seconds = (time.monotonic() - start) / ROUNDS
    Hog = _hog_class()
    hog = Hog()

    def load_part(r: int) -> None:
        if r == 3:
            hog.start()
            threading.Timer(ROUNDS / 3 * round_seconds, hog.stop).start()

    try:
        loaded, loaded_rounds = _ratio(timers, load_part)
    finally:
        hog.stop()
    assert abs(loaded / quiet - 1) <= 0.10, (quiet, loaded, quiet_rounds, loaded_rounds)
    # Separately: up to three tries, each all of A and then all of B under the hog. What is shown is that a neighbour
    # *can* move the separate ratio far off 1 (in one CI run a try came out at 0.98: the hog had not slowed B; run
    # alone the test then passed 6 times of 6), not that it moves it every time.
    separate: list[float] = []
    while len(separate) < 3 and min(separate, default=1.0) >= 0.8:
        separate.append(_separate(timers, Hog))
    assert min(separate) < 0.8, separate


def _separate(timers, Hog) -> float:
    """B's rounds under the hog over A's rounds just before it, quiet: the ratio of their medians."""
    quiet_a = float(np.median([fastest_after_first(timers["A"].round(STEPS, 10)) for _ in range(3)]))
    hog = Hog()
    hog.start()
    try:
        return float(np.median([fastest_after_first(timers["B"].round(STEPS, 10)) for _ in range(3)])) / quiet_a
    finally:
        hog.stop()


@pytest.mark.timing
def test_the_bench_and_the_speed_stage_measure_one_config_alike():
    """One config — mlp on 1×16×16 images, batch 64, fp32 and bf16, the same data — measured by `ampbench bench`
    and by the speed stage: one harness, so bf16's intervals of × fp32 over rounds overlap."""
    from ampbench.bench.config import BenchConfig
    from ampbench.bench.loop import _data
    from ampbench.bench.loop import measure as bench
    from ampbench.stages.speed import measure_arms

    rounds, steps, window, warmup, cpu = 7, 20, 5, 5, torch.device("cpu")
    cfg = BenchConfig(device="cpu", model="mlp", width=64, image_size=16, channels=1, classes=10, batch_size=64,
                      steps=steps, rounds=rounds, window=window, warmup_steps=warmup, arms=["fp32", "bf16"],
                      overhead_arms=[], mlflow=False, arm_budget=None)
    by_bench = bench(cfg)["arms"]["bf16"]["speedup_vs_fp32_ci"]
    params = validate({"train": {"device": "cpu", "batch_size": 64, "model": "mlp", "width": 64, "lr": 1e-3,
                                 "scheduler": "constant", "precisions": ["fp32", "bf16"], "progress": False},
                       "speed": {"rounds": rounds, "steps": steps, "window": window, "warmup_steps": warmup,
                                 "seconds_per_arm": None}})
    train, val = _data(cfg, steps * 64, cpu, 0), _data(cfg, 64, cpu, 1)
    by_stage = measure_arms(params, train, val, CLASSIFICATION, cpu, {"input_shape": (1, 16, 16), "num_classes": 10})
    by_stage = by_stage["arms"]["bf16"]["speedup_vs_fp32_ci"]
    assert by_bench[0] <= by_stage[1] and by_stage[0] <= by_bench[1], (by_bench, by_stage)
