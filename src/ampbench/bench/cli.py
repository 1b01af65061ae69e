"""``ampbench bench``'s command line and its table (torch-free: ``--help`` stays instant); ``loop.py`` measures.

Needs only torch and torchvision (a GPU box often has nothing else): run it as ``python -m ampbench.bench``
with ``src/`` on PYTHONPATH, or as ``ampbench bench``. Everything is measured in one process by the speed stage's
harness (``speed/harness.py``): interleaved round by round in alternating order after a warm-up round, each round's
fastest timing window (device synchronisation at window edges), ratios as the median of per-round ratios with an
interval.
It prints a table, writes JSON, and exits non-zero only on an error — never because a number is slow.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ampbench.bench.config import OVERHEAD_MOST_ROUNDS, BenchConfig
from ampbench.config.arms import NAMES
from ampbench.config.params import MODELS
from ampbench.config.rules import size_problem


def _cell(row: dict[str, Any], key: str, spec: str, width: int) -> str:
    return ("n/a" if row.get(key) is None else format(row[key], spec)).rjust(width)


def _inputs(c: dict[str, Any]) -> str:
    if c.get("task") == "language_model":
        return f"random sequences of {c['block_size']} byte tokens"
    return f"{c['channels']}×{c['image_size']}×{c['image_size']}"


def table(result: dict[str, Any]) -> str:
    """The human-readable summary of ``run``'s result."""
    fp = result["fingerprint"]
    c = result["config"]
    lines = [f"ampbench bench — {fp['device_name']}, torch {fp['torch_version']}, {result['date']}",
             f"model {c['model']} on {_inputs(c)}, batch {c['batch_size']}, two steps first, a warm-up round, then "
             f"{c['rounds']} interleaved rounds × {c['steps']} steps, windows of {c['window']} steps (a round's "
             f"fastest after its first), warm-up {c['warmup_steps']} steps"
             + (f", at most {c['arm_budget']:g} s per arm" if c.get("arm_budget") else ""), "",
             "Loop overhead (bare loop ÷ pipeline loop, samples/s: the median over rounds, with its interval; within "
             "or above the goal only when the whole interval is):"]
    for arm, o in result["loop_overhead"].items():
        lines.append(f"  {arm:14s} " + _overhead_text(o))
    lines.append(_logging_text(result["logging"]))
    lines += ["", f"{'arm':14s} {'samples/s':>12s} {'× fp32':>8s} {'[interval]':>14s} {'× tf32':>8s} {'peak MB':>9s} "
              f"{'mem × fp32':>10s} {'state B/param':>13s} {'16-bit FLOPs':>12s} {'TFLOP/s':>9s} {'of peak':>8s}"]
    for arm, a in result["arms"].items():
        if "skipped" in a:
            lines.append(f"{arm:14s} skipped: {a['skipped']}")
            continue
        ci = a.get("speedup_vs_fp32_ci") if len(a.get("ratios") or []) > 1 else None  # one round: no interval
        cells = [_cell(a, "samples_per_s", ",.0f", 12), _cell(a, "speedup_vs_fp32", ".2f", 8),
                 (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "").rjust(14), _cell(a, "speedup_vs_tf32", ".2f", 8),
                 _cell(a, "peak_memory_mb", ",.0f", 9),
                 _cell(a, "memory_vs_fp32", ".2f", 10), _cell(a, "state_bytes_per_parameter", ".1f", 13),
                 _cell(a, "low_precision_flop_share", ".0%", 12),
                 _cell(a, "achieved_tflops", ".3g", 9), _cell(a, "peak_share", ".1%", 8)]
        lines.append(f"{arm:14s} " + " ".join(cells))
    lines += _cut_short(result)
    if "memory_note" in result:
        lines.append(result["memory_note"])
    lines.append("state B/param: bytes of weights + gradients + optimizer state per parameter, counted tensor by "
                 "tensor (any device)")
    return "\n".join(lines)


def _overhead_text(o: dict[str, Any]) -> str:
    """One overhead arm's line: both loops' speeds, the ratio with its interval, the goal and the verdict."""
    if "skipped" in o:
        return f"skipped: {o['skipped']}"
    if o["ratio"] is None:
        return "no round in which both loops closed a timing window past its first: no ratio (undecided)"
    low, high = o["ratio_ci"]
    return (f"bare {o['bare_samples_per_s']:10,.0f}/s  pipeline {o['pipeline_samples_per_s']:10,.0f}/s  "
            f"ratio {o['ratio']:.3f} [{low:.3f}, {high:.3f}] (goal ≤ {o['goal']:.2f}): {o['verdict_text']}")


def _logging_text(lg: dict[str, Any]) -> str:
    """The logging share's line: the median epoch's share with its interval, the goal and the verdict."""
    if lg["share"] is None:
        return f"Logging ({lg['backend']}): no epoch measured, so no share (undecided)"
    low, high = lg["share_ci"]
    return (f"Logging: {lg['seconds'] * 1000:.1f} ms of {lg['train_seconds']:.2f} s training; an epoch's share "
            f"{100 * lg['share']:.2f}% [{100 * low:.2f}%, {100 * high:.2f}%] (the median over epochs, with its "
            f"interval; {lg['backend']}; goal ≤ {100 * lg['goal']:.0f}%): {lg['verdict_text']}")


def _cut_short(result: dict[str, Any]) -> list[str]:
    """A line per arm (and per loop of the overhead check) whose budget cut a phase: which phases, what each got."""
    out = []
    for arm, row in result["arms"].items():
        if row.get("cut_short"):
            out.append(_cut_line(f"{arm} (throughput)", row))
    for arm, row in result["loop_overhead"].items():
        for loop, rec in (row.get("budgets") or {}).items():
            if rec["cut_short"]:
                out.append(_cut_line(f"{arm} (loop overhead, {loop} loop)", rec))
    if out:
        out.append("(--arm-budget none runs every phase in full)")
    return out


def _cut_line(what: str, rec: dict[str, Any]) -> str:
    """``what`` was cut by its budget: the seconds it spent, and per phase cut what that phase got."""
    cut = "; ".join(f"{phase}: {got}" for phase, got in rec["cut"].items())
    return f"{what}: cut by its {rec['budget_s']:g} s budget ({rec['seconds']:.1f} s spent in all): {cut}"


def _budget(text: str) -> float | None:
    """``--arm-budget``: seconds (finite, > 0) or 'none'."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds or \"none\"") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds (or \"none\": "
                                         "no budget)")
    return value


def _whole(text: str) -> int:
    """A count option: a whole number (its bounds are ``_check``'s)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(prog="python -m ampbench.bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"], help="device to measure on")
    p.add_argument("--task", default=d.task, choices=["classification", "language_model"],
                   help="what the model learns: images → classes, or the next token (model gpt unless --model)")
    p.add_argument("--block-size", type=_whole, default=d.block_size, help="language_model: tokens per sequence")
    p.add_argument("--model", default=d.model,
                   help=f"model to train: {' | '.join(MODELS)} | torchvision.<name> | package.module:callable")
    p.add_argument("--width", type=_whole, default=d.width, help="width of a built-in model (see train.width)")
    p.add_argument("--image-size", type=_whole, default=d.image_size, help="synthetic image height = width")
    p.add_argument("--channels", type=_whole, default=d.channels, help="image channels")
    p.add_argument("--batch-size", type=_whole, default=d.batch_size, help="samples per step")
    p.add_argument("--steps", type=_whole, default=d.steps, help="optimizer steps per round")
    p.add_argument("--rounds", type=_whole, default=d.rounds,
                   help=f"interleaved A/B rounds (the overhead check adds rounds while its verdict is undecided, up "
                        f"to {OVERHEAD_MOST_ROUNDS}× this, within its budget)")
    p.add_argument("--window", type=_whole, default=d.window, help="steps per timing window")
    p.add_argument("--warmup-steps", type=_whole, default=d.warmup_steps, help="steps excluded from timing")
    p.add_argument("--arms", default=",".join(d.arms), help=f"comma-separated arms to compare ({', '.join(NAMES)})")
    p.add_argument("--overhead-arms", default=",".join(d.overhead_arms),
                   help="arms whose pipeline loop is timed against the bare loop (GPU: all four)")
    p.add_argument("--arm-budget", type=_budget, default=d.arm_budget, metavar="SECONDS",
                   help="wall seconds each arm may spend on everything it runs (building, its first two steps, the "
                        "warm-up round, the rounds, the FLOP count, memory; each loop of the overhead check its own): "
                        "past its first two steps a phase runs only the steps that fit, and the table names each "
                        "phase cut; 'none': every phase in full")
    p.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--sync-debug", action="store_true",
                   help="CUDA: run steady-state steps under torch.cuda.set_sync_debug_mode('error')")
    p.add_argument("--no-mlflow", action="store_true", help="time JSON logging instead of MLflow")
    p.add_argument("--json", dest="json_out", type=Path, default=Path("bench.json"), help="where to write JSON")
    return p


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every option that cannot measure, before anything is measured: one ``error:`` line and exit 2."""
    for name in ("width", "image_size", "channels", "batch_size", "block_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}")
    problem = size_problem(args.rounds, args.steps, args.window, args.warmup_steps, args.arm_budget)
    if problem:
        flag = {"seconds": "arm-budget"}.get(problem[0], problem[0].replace("_", "-"))
        parser.error(f"--{flag}: {problem[1]}")
    for option in ("arms", "overhead_arms"):
        unknown = [a for a in getattr(args, option).split(",") if a not in NAMES]
        if unknown:
            parser.error(f"--{option.replace('_', '-')}: unknown arm {', '.join(unknown)} (arms: {', '.join(NAMES)})")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    model = "gpt" if args.task == "language_model" and args.model == BenchConfig.model else args.model
    cfg = BenchConfig(device=args.device, task=args.task, block_size=args.block_size, model=model,
                      width=args.width, image_size=args.image_size, channels=args.channels,
                      batch_size=args.batch_size, steps=args.steps, rounds=args.rounds, window=args.window,
                      warmup_steps=args.warmup_steps, arms=args.arms.split(","),
                      overhead_arms=args.overhead_arms.split(","), channels_last=args.channels_last,
                      compile=args.compile, sync_debug=args.sync_debug, mlflow=not args.no_mlflow,
                      arm_budget=args.arm_budget)
    from ampbench.errors import interrupted_line
    from ampbench.runtime import signals

    signals.handle_signals_once()  # SIGTERM (a scheduler, `kill`) unwinds as Ctrl-C does: one line, exit 130
    try:
        # An interruption that C code wrapped in its own error (pydantic-core while MLflow is imported) is one too.
        with signals.interruptions_unwrapped():
            # torch is imported only now, so --help stays instant. A signal during the import is taken after it:
            # one that lands in C code running Python (pybind11) marks the interpreter to die of SIGINT at exit.
            with signals.signals_deferred():
                from ampbench.bench.loop import measure

            result = measure(cfg)
    except KeyboardInterrupt as exc:  # the scratch MLflow store is removed on the way; nothing else was written
        print(interrupted_line(exc) + f": nothing was written ({args.json_out} is as it was)", file=sys.stderr)
        return 130
    except Exception as exc:  # an error, not a slow result: say so and exit non-zero
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(table(result))
    args.json_out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nJSON: {args.json_out}")
    return 0
