"""Speed ratios under a changing load: the speed stage's interleaved measurement against timing each arm in its own
period (what training-time throughput does), quiet and with a CPU hog (busy processes, three per core) running
during part of it. The figures of BENCHMARKS.md's "Speed under load"; tests/test_interleaved.py uses ``Hog``.

Run: .venv/bin/python scripts/speed_under_load.py [--params params.yaml] [--data data/prepared] [--arm bf16]
(after `make repro`, which prepares the data). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spin(ready, stop) -> None:
    ready.release()
    x = 0
    while not stop.is_set():  # the event's lock, shared by every hog: taken once per 200,000 additions (~5 ms),
        for _ in range(200_000):  # or the hogs spend their time queued on it instead of on the cores
            x += 1


class Hog:
    """Busy processes, three per core (a CPU quota the container shares is used up too), running from ``start``
    (which returns once every one of them spins) until ``stop``."""

    def __init__(self):
        self.procs: list = []

    def start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        n = 3 * (os.cpu_count() or 2)
        ready, self.stop_event = ctx.Semaphore(0), ctx.Event()
        self.procs = [ctx.Process(target=_spin, args=(ready, self.stop_event), daemon=True) for _ in range(n)]
        for p in self.procs:
            p.start()
        for _ in range(n):
            ready.acquire()

    def stop(self) -> None:
        if self.procs:
            self.stop_event.set()
            for p in self.procs:
                p.join()


def _separate(timers: dict, arm: str, rounds: int, steps: int, window: int, load_second: bool) -> float:
    """fp32's rounds all first, then ``arm``'s (under the hog when ``load_second``): the ratio of their medians."""
    from ampbench.speed.harness import fastest_after_first

    base = statistics.median(fastest_after_first(timers["fp32"].round(steps, window)) for _ in range(rounds))
    hog = Hog()
    if load_second:
        hog.start()
    try:
        other = statistics.median(fastest_after_first(timers[arm].round(steps, window)) for _ in range(rounds))
    finally:
        hog.stop()
    return other / base


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from ampbench.config.validation import load_params
    from ampbench.data.prepare import load_prepared
    from ampbench.precision.policy import resolve_device
    from ampbench.stages import speed
    from ampbench.tasks.resolve import resolve_task

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="params file (speed and train)")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "prepared", help="prepared data folder")
    ap.add_argument("--arm", default="bf16", help="the arm compared with fp32")
    args = ap.parse_args(argv)
    loaded = load_params(args.params)
    raw = {**loaded.to_dict(), "train": {**loaded.train.to_dict(), "precisions": ["fp32", args.arm]}}
    from ampbench.config.validation import validate

    params = validate(raw)
    device = resolve_device(params.train.device)
    task = resolve_task(params.train.task, params.train.block_size)
    data = task.view(load_prepared(args.data))
    contract = task.model_args(data.meta)
    sp, bs = params.speed, params.train.batch_size
    train = data.train
    val = type(train)(data.val.x[:bs], data.val.y[:bs], data.val.norm)
    out: dict = {"date": time.strftime("%F"), "arm": args.arm, "speed": sp.to_dict(), "device": str(device)}

    t0 = time.monotonic()
    out["interleaved_quiet"] = speed.measure_arms(params, train, val, task, device, contract)["arms"][args.arm][
        "speedup_vs_fp32"]
    seconds = time.monotonic() - t0
    hog = Hog()

    def load_part(r: int) -> None:  # the hog from round 3 for a third of the measurement; its end lands mid-round
        if r == 3:
            hog.start()
            threading.Timer(seconds / 3, hog.stop).start()

    try:
        loaded_run = speed.measure_arms(params, train, val, task, device, contract, between_rounds=load_part)
    finally:
        hog.stop()
    out["interleaved_loaded"] = loaded_run["arms"][args.arm]["speedup_vs_fp32"]
    sizes = speed.sizes(params, len(train) // bs)
    timers = {a: speed.loop_arm(a, params, train, val, task, device, contract, sizes) for a in ("fp32", args.arm)}
    for t in timers.values():
        t.round(sp.warmup_steps + 2 * sizes.window, sizes.window)
    out["separate_quiet"] = _separate(timers, args.arm, sp.rounds, sp.steps, sizes.window, load_second=False)
    out["separate_loaded"] = _separate(timers, args.arm, sp.rounds, sp.steps, sizes.window, load_second=True)
    out["interleaved_moved"] = out["interleaved_loaded"] / out["interleaved_quiet"] - 1
    out["separate_moved"] = out["separate_loaded"] / out["separate_quiet"] - 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
