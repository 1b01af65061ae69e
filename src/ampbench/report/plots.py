"""The DVC plot rows the evaluate stage writes: per-epoch curves (reports/curves.json) and validation loss against
time (reports/quality.json), long format, one row per arm, seed and point; ``figures.py`` draws the same curves.
"""

from __future__ import annotations

from typing import Any

from ampbench.verdict.comparison import ArmReport
from ampbench.verdict.quality import curve_rows as quality_curve

CURVE_KEYS = ("train_loss", "val_loss", "val_accuracy", "loss_scale")
# Also written to the DVC plot rows (not drawn in the PNG): the scaler and underflow story per epoch.
PLOT_EXTRA_KEYS = ("grad_underflow_frac", "scaled_grad_underflow_frac", "grad_zero_frac", "grad_norm",
                   "skipped_steps")


def has_scaler(a: ArmReport) -> bool:
    """Whether the arm trained with a GradScaler (what ran, read back from its summary)."""
    return a.trained.policy.get("grad_scaler") == "on"


def curve_rows(arms: list[ArmReport]) -> list[dict[str, Any]]:
    """Long-format per-epoch rows (one per arm, seed and epoch) for ``dvc plots``; ``run`` names the line."""
    rows = []
    for a in arms:
        # An arm without a scaler has no loss scale: null, which the plot leaves out (DVC needs the field in every
        # row), rather than a constant 1 drawn beside fp16's 65,536.
        scaled = has_scaler(a)
        for seed, history in sorted(a.histories.items()):
            for r in history:
                rows.append({"run": f"{a.arm}-seed{seed}", "arm": a.arm, "seed": seed, "epoch": r["epoch"],
                             **{k: r[k] for k in CURVE_KEYS + PLOT_EXTRA_KEYS if k in r},
                             **({} if scaled else {"loss_scale": None})})
    return rows


def quality_rows(arms: list[ArmReport], batch_size: int) -> list[dict[str, Any]]:
    """Validation loss against time for ``dvc plots`` and the figure (``quality.curve_rows``): time is optimizer
    steps × each arm's time per step from the speed stage (the training processes' own seconds without it)."""
    rows = []
    for a in arms:
        if a.ran:
            sps = a.speed.samples_per_s if a.speed else None
            rows += quality_curve(a.arm, a.evaluations, batch_size / sps if sps else None)
    return rows
