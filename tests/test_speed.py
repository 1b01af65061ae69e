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
from ampbench.speed.harness import interleave, measure
from ampbench.speed.ratios import median_interval, summarise
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
        t.round(20)  # warm-up
    yield dict(zip("AB", timers, strict=True))
    torch.set_num_threads(threads)


def _ratio(timers, between_rounds=None) -> tuple[float, list[float]]:
    """B/A through the harness, as the speed stage measures: (median over rounds, per round)."""
    rounds = measure(timers, Sizes(ROUNDS, STEPS, 10, 10), between_rounds).rounds
    ratios = [b / a for a, b in zip(rounds["A"], rounds["B"], strict=True)]
    return float(np.median(ratios)), ratios


class _Steps:
    """A budget that gives ``steps(r)`` steps in round r, for ``total`` rounds."""

    def __init__(self, total, steps):
        self.total_rounds, self.steps = total, steps

    def steps_for(self, r):
        return self.steps(r)

    def run(self, steps, one_round):
        return one_round(steps)


def test_interleaving_alternates_the_order_round_by_round():
    """A B C, then C B A: a place in the round (first after a long arm, last before a load fades) falls to each
    arm alike over two rounds."""
    seen = []

    class Timer:
        def __init__(self, name):
            self.name = name

        def round(self, steps):
            seen.append(self.name)
            return float(steps)

    budgets = {n: _Steps(3, lambda r, n=n: 0 if (n, r) == ("B", 2) else 5) for n in "ABC"}
    out = interleave({n: Timer(n) for n in "ABC"}, budgets)
    assert "".join(seen) == "ABCCBAAC" and out == {"A": [5.0] * 3, "B": [5.0, 5.0, None], "C": [5.0] * 3}


def _fake_clock_rounds(monkeypatch, seconds_per_step: float, seconds: float | None) -> tuple[list[int], dict]:
    """The steps of each round ``Budget`` lets an arm run at a fixed cost per step (a fake clock)."""
    from types import SimpleNamespace

    from ampbench.speed import budget as budget_module

    clock = [0.0]
    monkeypatch.setattr(budget_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    b, ran = Budget(Sizes(rounds=5, steps=30, window=10, warmup_steps=10, seconds=seconds)), []

    def one_round(steps: int) -> None:
        ran.append(steps)
        clock[0] += steps * seconds_per_step

    for r in range(b.total_rounds):
        steps = b.steps_for(r)
        if steps:
            b.run(steps, one_round)
    return ran, b.record()


def test_a_slow_arm_is_cut_to_its_time_budget(monkeypatch):
    # 0.5 s per step, 20 s: round 0 (warm-up + two windows, 15 s) and two windows of round 1 (10 s) always, the
    # least that measures a speed; then two windows while they fit: none.
    ran, rec = _fake_clock_rounds(monkeypatch, 0.5, 20.0)
    assert ran == [30, 20] and rec == {"budget_s": 20.0, "steps_measured": 50, "rounds_run": 2, "cut_short": True}
    # 0.1 s per step: round 0 costs 3 s; 17 s left over 5 rounds is 34 steps a round, cut to 30: every round.
    ran, rec = _fake_clock_rounds(monkeypatch, 0.1, 20.0)
    assert ran == [30] * 6 and not rec["cut_short"]
    # 0.2 s per step: round 0 costs 6 s; 14 s over 5 rounds is 14 steps a round, below two windows: rounds of two
    # windows while the budget holds them (4 s each: three), then it stops, cut short.
    ran, rec = _fake_clock_rounds(monkeypatch, 0.2, 20.0)
    assert ran == [30, 20, 20, 20] and rec["cut_short"] and rec["rounds_run"] == 4


def test_without_a_budget_every_round_runs_in_full(monkeypatch):
    ran, rec = _fake_clock_rounds(monkeypatch, 5.0, None)  # the GPU profile: whatever it costs
    assert ran == [30] * 6 and not rec["cut_short"]


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
    a, b = timers["A"], timers["B"]
    quiet_a = float(np.median([a.round(STEPS) for _ in range(3)]))
    hog = Hog()
    hog.start()
    try:
        loaded_b = float(np.median([b.round(STEPS) for _ in range(3)]))
    finally:
        hog.stop()
    separate = loaded_b / quiet_a
    assert abs(loaded / quiet - 1) <= 0.10, (quiet, loaded, quiet_rounds, loaded_rounds)
    assert separate < 0.8, separate


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
