"""Turn evaluated arms into what people read: a Markdown table, PNG curves and DVC plot rows.

``ArmReport`` holds one arm's results; functions here only format them (the evaluate stage writes the files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CURVE_KEYS = ("train_loss", "val_loss", "val_accuracy", "loss_scale")
# Also written to the DVC plot rows (not drawn in the PNG): the scaler and underflow story per epoch.
PLOT_EXTRA_KEYS = ("grad_underflow_frac", "scaled_grad_underflow_frac", "grad_zero_frac", "grad_norm",
                   "skipped_steps")


@dataclass
class ArmReport:
    """One precision arm: evaluated (``summary`` = means over seeds), or skipped/diverged with a reason."""

    arm: str
    skipped_reason: str | None = None
    status: str = "ok"  # ok | skipped (device cannot run it) | diverged (stopped by the guard)
    ablation: bool = False
    summary: dict[str, float] = field(default_factory=dict)
    per_seed: dict[int, dict[str, float]] = field(default_factory=dict)
    histories: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)  # samples_per_s, skipped_steps, what ran

    @property
    def ran(self) -> bool:
        return self.skipped_reason is None


def curve_rows(arms: list[ArmReport]) -> list[dict[str, Any]]:
    """Long-format per-epoch rows (one per arm, seed and epoch) for ``dvc plots``; ``run`` names the line."""
    rows = []
    for a in arms:
        for seed, history in sorted(a.histories.items()):
            for r in history:
                rows.append({"run": f"{a.arm}-seed{seed}", "arm": a.arm, "seed": seed, "epoch": r["epoch"],
                             **{k: r[k] for k in CURVE_KEYS + PLOT_EXTRA_KEYS if k in r}})
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def markdown_table(arms: list[ArmReport], context: dict[str, Any]) -> str:
    """The comparison a person reads first: one row per arm, fp32 first, means over seeds (± std)."""
    seeds = context.get("seeds", [])
    lines = [
        f"# ampbench: mixed precision vs strict fp32",
        "",
        f"Data `{context.get('dataset')}`, model `{context.get('model')}`, device `{context.get('device_name')}`, "
        f"{len(seeds)} seed(s) {seeds}, {context.get('epochs')} epoch(s). Test split, means over seeds (± std). "
        "Δ = arm − fp32 of the same seed; agreement, KL and max |Δlogit| compare each arm's test predictions "
        "with fp32's.",
        "",
        "| arm | test accuracy | Δaccuracy vs fp32 (pp) | test loss | agreement | KL(fp32‖arm) | max abs Δlogit "
        "| samples/s | speed × fp32 | skipped steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = next((a for a in arms if a.arm == "fp32" and a.ran), None)
    base_rate = base.train.get("samples_per_s") if base else None
    for a in arms:
        name = f"{a.arm} (ablation)" if a.ablation else a.arm
        if not a.ran:
            lines.append(f"| {name} | **{a.status}**: {a.skipped_reason} | | | | | | | | |")
            continue
        s = a.summary
        rate = a.train.get("samples_per_s", float("nan"))
        speed = f"{rate / base_rate:.2f}×" if base_rate else "n/a"
        delta = "—" if a.arm == "fp32" else f"{100 * s['delta_accuracy_vs_fp32']:+.2f} ± {100 * s['delta_accuracy_vs_fp32_std']:.2f}"
        lines.append(
            f"| {name} | {_pct(s['test_accuracy'])} ± {100 * s['test_accuracy_std']:.2f} | {delta} "
            f"| {s['test_loss']:.4f} | {_pct(s['agreement_vs_fp32'])} | {s['kl_vs_fp32']:.2e} "
            f"| {s['max_abs_logit_diff_vs_fp32']:.3g} | {rate:,.0f} | {speed} | {a.train.get('skipped_steps', 0)} |"
        )
    lines += ["", "What ran per arm (read back from torch):", ""]
    for a in arms:
        if a.ran:
            ran = ", ".join(f"{k}={v}" for k, v in a.train.get("policy", {}).items() if k != "precision")
            lines.append(f"- **{a.arm}**: {ran}")
    if context.get("note"):
        lines += ["", context["note"]]
    return "\n".join(lines) + "\n"


def curves_figure(arms: list[ArmReport]):
    """One figure, four panels (train loss, val loss, val accuracy, loss scale) with every arm and seed."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, a in enumerate(x for x in arms if x.ran):
        for j, (seed, history) in enumerate(sorted(a.histories.items())):
            epochs = [r["epoch"] for r in history]
            for ax, key in zip(axes.flat, CURVE_KEYS):
                ax.plot(epochs, [r[key] for r in history], color=colours[i % len(colours)], alpha=0.85,
                        linestyle=("-", "--", ":", "-.")[j % 4], label=f"{a.arm} seed{seed}")
    for ax, key in zip(axes.flat, CURVE_KEYS):
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes.flat[3].set_yscale("log", base=2)
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle("ampbench: training curves per precision arm")
    fig.tight_layout()
    return fig
