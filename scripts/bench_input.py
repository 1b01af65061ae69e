"""Input-path benchmark: preparing Fashion-MNIST from its .gz files, and training throughput with the training split
as device tensors vs streamed through a DataLoader (same model, same batches), A/B interleaved in one process.

Run: .venv/bin/python scripts/bench_input.py [--raw /usr/share/datasets/fashion-mnist] [--rounds 5] [--steps 60]
Prints a Markdown table (for BENCHMARKS.md). Goals (issue 12): prepare ≤ 30 s; streaming ≥ 0.85× the samples/s of
the device path (fp32, no augmentation).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


@click.command()
@click.option("--raw", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path("/usr/share/datasets/fashion-mnist"), show_default=True,
              help="Folder with Fashion-MNIST's four idx .gz files.")
@click.option("--rounds", default=5, show_default=True, help="A/B rounds (each path once per round).")
@click.option("--steps", default=60, show_default=True, help="Timed optimizer steps per path and round.")
@click.option("--batch-size", default=128, show_default=True, help="Samples per step.")
@click.option("--workers", default=2, show_default=True, help="DataLoader workers of the streaming path.")
def main(raw: Path, rounds: int, steps: int, batch_size: int, workers: int) -> None:
    """Measure and print the table."""
    import torch

    from ampbench.config.params import PrepareParams, TrainParams
    from ampbench.data.loader import InputPipeline
    from ampbench.data.prepare import prepare
    from ampbench.models.builtins import build_builtin
    from ampbench.precision.policy import resolve_policy
    from ampbench.training.step import train_step

    start = time.perf_counter()
    data = prepare(PrepareParams(dataset="fashion_mnist", raw_dir=str(raw)), raw)
    prep_s = time.perf_counter() - start
    cpu = torch.device("cpu")
    policy, tp = resolve_policy("fp32", cpu), TrainParams(batch_size=batch_size)
    torch.manual_seed(0)
    model = build_builtin("small_cnn", data.input_shape, data.num_classes, None)
    opt = policy.make_optimizer(tp, model.parameters(), cpu)
    scaler = policy.grad_scaler(tp.grad_scaler)
    paths = {"device tensors": InputPipeline(data.train, cpu, on_device=True, batch_size=batch_size,
                                             augment="none", seed=0),
             f"streaming, {workers} workers": InputPipeline(data.train, cpu, on_device=False, batch_size=batch_size,
                                                            augment="none", seed=0, workers=workers)}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    waits: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(rounds + 1):  # round 0 warms up (worker start, allocator) and is not counted
        for name, pipe in paths.items():
            batches = pipe.epoch(torch.Generator().manual_seed(r), 0)
            for _ in range(3):  # untimed: fill the prefetch queue
                b = next(batches)
                train_step(model, opt, scaler, policy, b.x, b.y, tp)
            pipe.wait_seconds = 0.0
            t0, seen = time.perf_counter(), 0
            for _ in range(steps):
                b = next(batches)
                train_step(model, opt, scaler, policy, b.x, b.y, tp)
                seen += b.size
            elapsed = time.perf_counter() - t0
            if r:
                rates[name].append(seen / elapsed)
                waits[name].append(pipe.wait_seconds / elapsed)
            batches.close()
    base = statistics.median(rates["device tensors"])
    print(f"prepare (Fashion-MNIST from .gz, 70,000 images): {prep_s:.1f} s")
    print()
    print("| input path | samples/s (median) | × device tensors | waiting for batches |")
    print("|---|---|---|---|")
    for name in paths:
        med = statistics.median(rates[name])
        print(f"| {name} | {med:,.0f} | {med / base:.2f}× | {100 * statistics.median(waits[name]):.1f}% |")


if __name__ == "__main__":
    main()
