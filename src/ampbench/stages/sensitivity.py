"""``ampbench sensitivity ARM``: which module of the trained float32 model to keep in float32 for an autocast arm,
ranked without training (``training/sensitivity.py``), and the ``-S`` line that keeps the best one.

It reads what the pipeline wrote: params.yaml, the prepared data (the validation split's first examples are the
inputs) and the fp32 arm's final checkpoint of one seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ampbench.config import arms
from ampbench.config.arms import BASELINE, no_islands
from ampbench.config.layout import MODELS, PREPARED, ArmFiles
from ampbench.config.params import Params
from ampbench.config.validation import load_params
from ampbench.data.prepare import load_prepared
from ampbench.errors import ParamsError
from ampbench.precision.policy import resolve_device, resolve_policy
from ampbench.report.advice import fix_line
from ampbench.tasks.resolve import resolve_task
from ampbench.training.checkpoint import load_final_model
from ampbench.training.sensitivity import Ranking, rank

FIXED = 0.5  # a module whose float32 island leaves at most this share of the arm's error is offered as the fix


def rank_in_project(arm: str, root: Path, seed: int | None = None, examples: int = 256) -> Ranking:
    """``rank_modules`` on what `dvc repro` left in the project at ``root``: params.yaml, data/prepared, models/.
    A model or task of yours (``package.module:callable``) imports from ``root``, as in the stages."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return rank_modules(arm, load_params(root / "params.yaml"), root / PREPARED, root / MODELS, seed, examples)


def rank_modules(arm: str, params: Params, data_dir: Path, models_dir: Path, seed: int | None = None,
                 examples: int = 256, batch_size: int = 64) -> Ranking:
    """Rank the modules of the fp32 arm's final model of ``seed`` (default: the first of train.seeds) for ``arm``
    on the first ``examples`` validation examples. ParamsError or DataError (one line) for what cannot be ranked."""
    tp = params.train
    if arm not in tp.precisions or arm == BASELINE:
        raise ParamsError(f"{arm!r}: not an arm of this run to rank against fp32 (train.precisions: {tp.precisions})")
    if no_islands(arms.get(arm)):
        raise ParamsError(f"{arm}: {no_islands(arms.get(arm))}: no module of it to keep in float32")
    seed = tp.seeds[0] if seed is None else seed
    if seed not in tp.seeds:
        raise ParamsError(f"--seed {seed}: not one of train.seeds {tp.seeds}")
    device = resolve_device(tp.device)
    policy = resolve_policy(arm, device)  # the arm as such: train.fp32_modules are what the ranking is about
    task = resolve_task(tp.task, tp.block_size)
    val = task.view(load_prepared(data_dir)).val
    model = load_final_model(ArmFiles(models_dir / BASELINE).checkpoint(seed), BASELINE, seed, device,
                             "train the fp32 arm first (dvc repro)")
    n = min(examples, len(val))
    inputs = [val.inputs(val.x[i:min(i + batch_size, n)].to(device)) for i in range(0, n, batch_size)]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return rank(model, policy, inputs, task)


def ranking_lines(r: Ranking, top: int) -> list[str]:
    """The ranking as a table (``top`` rows), then the ``-S`` line of the best fix, or why there is none."""
    lines = [f"{r.arm}: the output's error against fp32 on {r.inputs} validation examples, relative to how much it "
             f"varies between them: {_e(r.arm_error)} with the whole model in {r.arm}.",
             "", "| module | kind | parameters | error, this one kept in float32 | error, this one alone in "
             f"{r.arm} |", "|---|---|---|---|---|"]
    lines += [f"| {m.module} | {m.kind} | {m.parameters:,} | {_e(m.kept)} | {_e(m.alone)} |" for m in r.modules[:top]]
    best = r.modules[0]
    lines.append("")
    if r.arm_error == 0 or best.kept > FIXED * r.arm_error:
        lines.append(f"No single module kept in float32 removes most of {r.arm}'s error here (the best, "
                     f"{best.module}, leaves {_e(best.kept)}): several may be needed together; start from the top.")
    else:
        lines.append(f"Keeping {best.module} in float32 leaves {_e(best.kept)} of {_e(r.arm_error)}. Train with it "
                     f"and let the verdict judge: {fix_line([best.module])}")
    lines.append("A ranking on a few batches of the trained fp32 model, not a verdict (docs/finding-the-layer.md).")
    return lines


def _e(x: float) -> str:
    return "inf (not finite)" if x == float("inf") else "—" if x != x else f"{x:.3g}"
