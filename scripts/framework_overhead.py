"""What the pipeline adds to a framework job's step time: the example's training by the framework alone (Lightning's
Trainer with the arm's precision plugin, or the Hugging Face Trainer with the arm's flags; nothing of ours) against
the same training with the pipeline's read-back Callback, as the train stage adds it (sampled steps every
train.telemetry_every, loss and loss-scale bookkeeping every step).

Rounds interleave A B, B A, … on one model per side (each round a Trainer of --steps steps over the job's training
data, evaluation off); a round's value is B's seconds per step over A's. Prints one JSON object: the median ratio
over rounds with its distribution-free interval (speed/ratios.py) and the per-round values.

Run: .venv/bin/python scripts/framework_overhead.py [--framework lightning|hf] [--arm bf16] [--rounds 15]
[--steps 60] (BENCHMARKS.md: "Lightning and the Hugging Face Trainer: what the pipeline adds to the step").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def lightning_side(a, policy):
    """(seconds per step of one round) for 'alone' and 'pipeline': examples/lightning_classifier.py."""
    from examples.lightning_classifier import DigitsClassifier, DigitsData

    from ampbench.config.params import GradScalerParams
    from ampbench.frameworks import lightning
    from ampbench.frameworks.readback import StepBook

    modules = {side: DigitsClassifier(channels=a.channels) for side in ("alone", "pipeline")}
    data = DigitsData()

    def one(side: str) -> float:
        callbacks = ([lightning.ReadBack(StepBook(a.arm, policy, [], a.every, window=10, warmup=5), seed=0)]
                     if side == "pipeline" else [])
        trainer = lightning.L.Trainer(
            accelerator="cpu", devices=1, plugins=[lightning.plugin(policy, GradScalerParams())], max_epochs=-1,
            max_steps=a.steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        start = time.perf_counter()
        trainer.fit(modules[side], datamodule=data)
        return (time.perf_counter() - start) / a.steps
    return one


def hf_side(a, policy):
    """The same for examples/hf_trainer_lm.py: the Trainer of its parts with the arm's flags."""
    import dataclasses
    import tempfile

    from examples.hf_trainer_lm import build
    from transformers import PrinterCallback, Trainer

    from ampbench.frameworks import hf
    from ampbench.frameworks.readback import StepBook

    parts = {side: build(n_embd=a.channels * 4, n_layer=2) for side in ("alone", "pipeline")}

    def one(side: str) -> float:
        t = parts[side]
        args = dataclasses.replace(t.args, output_dir=tempfile.mkdtemp(), max_steps=a.steps, report_to=[],
                                   save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True,
                                   eval_strategy="no", **{k: v for k, v in hf.flags(policy).items() if v is not None})
        readback = hf.ReadBack(StepBook(a.arm, policy, [], a.every, window=10, warmup=5))
        trainer = Trainer(model=t.model, args=args, train_dataset=t.train_dataset,
                          callbacks=[readback] if side == "pipeline" else [])
        trainer.remove_callback(PrinterCallback)  # its log dicts on stdout, which holds the result
        readback.trainer = trainer
        start = time.perf_counter()
        trainer.train()
        return (time.perf_counter() - start) / a.steps
    return one


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", default="lightning", choices=("lightning", "hf"), help="which example job")
    ap.add_argument("--arm", default="bf16", help="the precision arm (its Lightning plugin, its Trainer flags)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (pairs A, B)")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per side and round")
    ap.add_argument("--channels", type=int, default=16, help="the example's width (the GPT's: 4× this)")
    ap.add_argument("--every", type=int, default=10, help="train.telemetry_every: steps between sampled steps")
    a = ap.parse_args()

    import torch

    from ampbench.precision.policy import resolve_policy
    from ampbench.speed.ratios import median_interval

    torch.manual_seed(0)
    policy = resolve_policy(a.arm, torch.device("cpu"))
    policy.apply_backend_flags()
    one = (lightning_side if a.framework == "lightning" else hf_side)(a, policy)
    one("alone"), one("pipeline")  # warm-up: imports, allocator, first optimizer state
    per_round = []
    for r in range(a.rounds):
        order = ("alone", "pipeline") if r % 2 == 0 else ("pipeline", "alone")
        t = {side: one(side) for side in order}
        per_round.append(t["pipeline"] / t["alone"])
    iv = median_interval(per_round)
    print(json.dumps({"framework": a.framework, "arm": a.arm, "steps": a.steps, "rounds": a.rounds,
                      "channels": a.channels, "telemetry_every": a.every, "ratio_median": iv.median,
                      "ratio_interval": [iv.low, iv.high], "coverage": iv.coverage,
                      "per_round": [round(x, 4) for x in per_round]}, indent=1))


if __name__ == "__main__":
    main()
