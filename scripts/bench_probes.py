"""What the numerics probes cost the training loop: the pipeline's loop with activation sampling and without it
(the probe patched out), and the tutorial's bare loop, in one process, round by round interleaved.

    PYTHONPATH=src .venv/bin/python scripts/bench_probes.py --arm fp32 --rounds 12

Prints median samples/s over the timing windows of each, and the ratios. Same model, data and windows as
``ampbench bench`` (small_cnn on 3×16×16, batch 128).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ampbench.bench import loop as benchloop
from ampbench.bench.config import BenchConfig
from ampbench.training import watchers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="fp32", help="precision arm to time")
    p.add_argument("--rounds", type=int, default=12, help="interleaved rounds")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args()
    cfg = BenchConfig(device=args.device, arms=[args.arm], overhead_arms=[], mlflow=False)
    device = torch.device(args.device)
    train = benchloop._data(cfg, cfg.batch_size * cfg.steps, device, 0)
    val = benchloop._data(cfg, cfg.batch_size, device, 1)
    with_probe = benchloop._PipelineArm(cfg, args.arm, device, train, val, lambda row, steps: None)
    without = benchloop._PipelineArm(cfg, args.arm, device, train, val, lambda row, steps: None)
    bare = benchloop._BareArm(cfg, args.arm, device, train)
    probe = watchers.ActivationProbe
    try:
        for _ in range(args.rounds):
            watchers.ActivationProbe = probe
            with_probe.round()
            watchers.ActivationProbe = lambda *a: None  # fit() then runs without activation sampling
            without.round()
            bare.round()
    finally:
        watchers.ActivationProbe = probe
    w, wo, b = (statistics.median(r.windows) for r in (with_probe, without, bare))
    print(f"{args.arm}: with probes {w:,.0f}/s, without {wo:,.0f}/s, bare loop {b:,.0f}/s; "
          f"probe cost {wo / w:.3f}×, pipeline with probes vs bare {b / w:.3f}× (goal ≤ 1.03)")


if __name__ == "__main__":
    main()
