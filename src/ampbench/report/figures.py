"""The report's figures (PNG, matplotlib without a display): Δaccuracy with its interval per arm, speed and memory
× fp32, the training curves of every arm and seed, and validation loss against time.
"""

from __future__ import annotations

from ampbench.config.arms import BASELINE
from ampbench.report.plots import CURVE_KEYS, has_scaler
from ampbench.verdict.comparison import ArmReport


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
        acc = a.stats.accuracy.interval
        mean = 100 * acc.mean
        if acc.ci_low is not None:
            lo, hi = 100 * acc.ci_low, 100 * acc.ci_high
            ax.errorbar(mean, i, xerr=[[mean - lo], [hi - mean]], fmt="o", capsize=4)
        else:
            ax.plot(mean, i, "o")
        ax.annotate(a.stats.decided.verdict, (mean, i), textcoords="offset points", xytext=(0, 8), ha="center",
                    fontsize=8)
    ax.set_yticks(range(len(ran)), [a.arm for a in ran])
    ax.set_ylim(-0.7, len(ran) - 0.3)
    ax.set_xlabel("Δ test accuracy vs fp32 (percentage points), with its paired CI (seeds × test examples)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def speed_memory_figure(comparison: dict[str, dict]):
    """Throughput and peak memory per arm, as ratios to fp32; a ratio that has no value (peak memory on a CPU,
    which cannot be attributed to one arm: ``runtime.memory``) is written n/a, not drawn."""
    plt = _pyplot()
    arms = [a for a, c in comparison.items() if c["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "speedup_vs_fp32", "throughput × fp32"),
                           (axes[1], "memory_vs_fp32", "peak memory × fp32")):
        values = [comparison[a].get(key) for a in arms]
        ax.bar(arms, [v or 0 for v in values], color=["tab:grey" if a == BASELINE else "tab:blue" for a in arms])
        ax.axhline(1, color="black", lw=0.8)
        for i, v in enumerate(values):
            ax.annotate("n/a" if v is None else f"{v:.2f}×", (i, v or 0), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=8)
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
                if key == "loss_scale" and not has_scaler(a):  # no scaler, no loss scale to draw
                    continue
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


def quality_figure(rows: list[dict], comparison: dict[str, dict]):
    """Validation loss against time per arm (``markdown.quality_rows``: steps × the speed stage's time per step),
    one colour per arm and a dash per seed; each arm's time to fp32's quality in its legend entry."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for i, arm in enumerate(arms):
        seeds = sorted({r["seed"] for r in rows if r["arm"] == arm})
        for j, seed in enumerate(seeds):
            points = [r for r in rows if r["arm"] == arm and r["seed"] == seed]
            ratio = comparison.get(arm, {}).get("time_to_fp32_quality_vs_fp32")
            label = (f"{arm} ({'baseline' if arm == BASELINE else 'n/a' if ratio is None else f'{ratio:.2f}× fp32'}"
                     " to fp32's loss)") if j == 0 else None
            ax.plot([p["seconds"] for p in points], [p["val_loss"] for p in points], color=colours[i % len(colours)],
                    linestyle=("-", "--", ":", "-.")[j % 4], alpha=0.85, label=label)
    ax.set_xlabel("time, s (optimizer steps × the speed stage's time per step)")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3)
    if arms:
        ax.legend(fontsize=8)
    ax.set_title("validation loss against time: time to fp32's quality")
    fig.tight_layout()
    return fig
