"""Turn evaluated arms into what people read: a Markdown table, PNG curves and DVC plot rows.

``ArmReport`` holds one arm's results; functions here only format them (the evaluate stage writes the files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampbench.arms import BASELINE

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
    train: dict[str, Any] = field(default_factory=dict)  # samples_per_s, peak memory, skipped_steps, what ran
    stats: dict[str, Any] = field(default_factory=dict)  # paired CIs and verdicts vs fp32

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


def _fmt(x, spec: str, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def _count(n: float) -> str:
    """1234567 → "1.23M"."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def model_line(model: dict[str, Any]) -> str:
    """The model's identity in words: name, arguments, parameters, FLOPs per sample."""
    args = ", ".join(f"{k}={v}" for k, v in model.get("args", {}).items())
    width = f", width {model['width']}" if model.get("width") is not None else ""
    return (f"`{model['name']}`{f' ({args})' if args else ''}{width}: {_count(model['parameters'])} parameters, "
            f"{_count(model['flops_per_sample'])} FLOPs per sample (forward)")


def markdown_report(arms: list[ArmReport], comparison: dict[str, dict], context: dict[str, Any]) -> str:
    """The table a person reads first (arm, Δaccuracy with CI, verdict, speed ×, memory ×, skipped steps),
    then the reasons for each verdict and what ran."""
    seeds = context.get("seeds", [])
    conf = int(round(100 * context.get("confidence", 0.95)))
    lines = [
        "# ampbench: mixed precision vs strict fp32",
        "",
        f"Model {model_line(context['model'])}.",
        "",
        f"Data `{context.get('dataset')}`, device `{context.get('device_name')}`, "
        f"{len(seeds)} seed(s) {seeds}, {context.get('epochs')} epoch(s). Test split. Δ = arm − fp32 of the same "
        f"seed, mean over seeds with its {conf}% Student-t interval. Verdict: *equivalent* when the whole interval "
        f"lies within ±{context.get('margin_pp')} pp (its ends included), *worse*/*better* when wholly outside, "
        "*invalid* when a metric is not finite, else *inconclusive*.",
        "",
        f"| arm | verdict | Δaccuracy, pp [{conf}% CI] | test accuracy | Δloss | agreement | KL(fp32‖arm) "
        "| ΔECE | speed × fp32 | speed × tf32 | memory × fp32 | skipped steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        name = f"{a.arm} (ablation)" if a.ablation else a.arm
        if not a.ran:
            lines.append(f"| {name} | **{a.status}** | {a.skipped_reason} | | | | | | | | | |")
            continue
        c = comparison[a.arm]
        ci = ("" if c.get("delta_accuracy_pp_ci_low") is None
              else f" [{c['delta_accuracy_pp_ci_low']:+.2f}, {c['delta_accuracy_pp_ci_high']:+.2f}]")
        delta = "—" if a.arm == BASELINE else f"{c['delta_accuracy_pp']:+.2f}{ci}"
        lines.append(
            f"| {name} | **{c['verdict']}** | {delta} | {100 * c['test_accuracy']:.2f}% | {c['delta_loss']:+.4f} "
            f"| {100 * c['agreement_vs_fp32']:.2f}% | {c['kl_vs_fp32']:.2e} | {c['delta_ece']:+.4f} "
            f"| {_fmt(c.get('speedup_vs_fp32'), '.2f', '×')} | {_fmt(c.get('speedup_vs_tf32'), '.2f', '×')} "
            f"| {_fmt(c.get('memory_vs_fp32'), '.2f', '×')} | {c['skipped_steps']} |")
    lines += ["", "Why each verdict:", ""]
    for a in arms:
        if a.ran and a.arm != BASELINE:
            lines.append(f"- **{a.arm}**: {a.stats['verdict']}: {a.stats['verdict_reason']}. "
                         f"Loss: {a.stats['loss_verdict']}: {a.stats['loss_verdict_reason']}.")
    lines += ["", "Throughput (median over timing windows after warm-up) and peak memory:", ""]
    for a in arms:
        if a.ran:
            c = comparison[a.arm]
            lines.append(f"- **{a.arm}**: {c['samples_per_s']:,.0f} samples/s, "
                         f"peak memory {c['peak_memory_mb']:,.0f} MB")
    lines += ["", "What ran per arm (read back from torch):", ""]
    for a in arms:
        if a.ran:
            ran = ", ".join(f"{k}={v}" for k, v in a.train.get("policy", {}).items() if k != "precision")
            lines.append(f"- **{a.arm}**: {ran}")
    if context.get("note"):
        lines += ["", context["note"]]
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def accuracy_delta_figure(arms: list[ArmReport], margin_pp: float):
    """Δaccuracy vs fp32 per arm (pp) with its confidence interval, and the equivalence margin shaded."""
    plt = _pyplot()
    ran = [a for a in arms if a.ran and a.arm != BASELINE]
    fig, ax = plt.subplots(figsize=(7, 0.6 * max(len(ran), 1) + 1.6))
    ax.axvspan(-margin_pp, margin_pp, color="tab:green", alpha=0.12, label=f"±{margin_pp} pp margin")
    ax.axvline(0, color="grey", lw=0.8)
    for i, a in enumerate(ran):
        acc = a.stats["delta_accuracy_vs_fp32"]
        mean = 100 * acc["mean"]
        if acc["ci_low"] is not None:
            lo, hi = 100 * acc["ci_low"], 100 * acc["ci_high"]
            ax.errorbar(mean, i, xerr=[[mean - lo], [hi - mean]], fmt="o", capsize=4)
        else:
            ax.plot(mean, i, "o")
        ax.annotate(a.stats["verdict"], (mean, i), textcoords="offset points", xytext=(0, 8), ha="center",
                    fontsize=8)
    ax.set_yticks(range(len(ran)), [a.arm for a in ran])
    ax.set_ylim(-0.7, len(ran) - 0.3)
    ax.set_xlabel("Δ test accuracy vs fp32 (percentage points), mean and CI over seeds")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def speed_memory_figure(comparison: dict[str, dict]):
    """Throughput and peak memory per arm, as ratios to fp32."""
    plt = _pyplot()
    arms = [a for a, c in comparison.items() if c["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "speedup_vs_fp32", "throughput × fp32"),
                           (axes[1], "memory_vs_fp32", "peak memory × fp32")):
        values = [comparison[a].get(key) or 0 for a in arms]
        ax.bar(arms, values, color=["tab:grey" if a == BASELINE else "tab:blue" for a in arms])
        ax.axhline(1, color="black", lw=0.8)
        for i, v in enumerate(values):
            ax.annotate(f"{v:.2f}×", (i, v), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def curves_figure(arms: list[ArmReport]):
    """One figure, four panels (train loss, val loss, val accuracy, loss scale) with every arm and seed."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, a in enumerate(x for x in arms if x.ran):
        for j, (seed, history) in enumerate(sorted(a.histories.items())):
            epochs = [r["epoch"] for r in history]
            for ax, key in zip(axes.flat, CURVE_KEYS, strict=True):
                ax.plot(epochs, [r[key] for r in history], color=colours[i % len(colours)], alpha=0.85,
                        linestyle=("-", "--", ":", "-.")[j % 4], label=f"{a.arm} seed{seed}")
    for ax, key in zip(axes.flat, CURVE_KEYS, strict=True):
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes.flat[3].set_yscale("log", base=2)
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle("ampbench: training curves per precision arm")
    fig.tight_layout()
    return fig
