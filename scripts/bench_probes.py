"""What the numerics probes cost the training loop: the pipeline's loop with activation sampling and without it
(the probe patched out), and the tutorial's bare loop, in one process, round by round interleaved.

    PYTHONPATH=src .venv/bin/python scripts/bench_probes.py --arm fp32 --rounds 12

Prints the median over rounds of each one's samples/s and the ratios with their intervals, through the speed harness
``ampbench bench`` uses (same model, data and windows: small_cnn on 3×16×16, batch 128).
"""

from __future__ import annotations

import argparse

import torch

from ampbench.bench import loop as benchloop
from ampbench.bench.config import BenchConfig
from ampbench.speed import harness
from ampbench.speed.ratios import median_value, ratio
from ampbench.training import watchers


class _WithoutProbe:
    """A runner whose rounds run with activation sampling patched out of ``fit`` (the probe's cost is the gap)."""

    def __init__(self, runner):
        self.runner = runner

    def round(self, steps: int, window: int) -> list[float]:
        probe = watchers.ActivationProbe
        watchers.ActivationProbe = lambda *a: None  # fit() then runs without activation sampling
        try:
            return self.runner.round(steps, window)
        finally:
            watchers.ActivationProbe = probe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="fp32", help="precision arm to time")
    p.add_argument("--rounds", type=int, default=12, help="interleaved rounds")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args()
    cfg = BenchConfig(device=args.device, rounds=args.rounds, arms=[args.arm], overhead_arms=[], mlflow=False,
                      arm_budget=None)
    device = torch.device(args.device)
    train = benchloop._data(cfg, cfg.batch_size * cfg.steps, device, 0)
    val = benchloop._data(cfg, cfg.batch_size, device, 1)
    runners = {"with probes": benchloop.pipeline_arm(cfg, args.arm, device, train, val),
               "without": _WithoutProbe(benchloop.pipeline_arm(cfg, args.arm, device, train, val)),
               "bare": benchloop.BareArm(cfg, args.arm, device, train)}
    rounds = harness.measure(runners, cfg.sizes()).rounds
    w, wo, b = (median_value(rounds[name]) for name in runners)
    cost, vs_bare = ratio(rounds["without"], rounds["with probes"]), ratio(rounds["bare"], rounds["with probes"])
    print(f"{args.arm}: with probes {w:,.0f}/s, without {wo:,.0f}/s, bare loop {b:,.0f}/s; probe cost "
          f"{cost.interval.median:.3f}× [{cost.interval.low:.3f}, {cost.interval.high:.3f}], pipeline with probes "
          f"vs bare {vs_bare.interval.median:.3f}× [{vs_bare.interval.low:.3f}, {vs_bare.interval.high:.3f}] "
          "(goal ≤ 1.03)")


if __name__ == "__main__":
    main()
