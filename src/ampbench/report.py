"""Turn evaluated arms into what people read: a Markdown table, PNG curves and DVC plot rows.

``ArmReport`` holds one arm's results; functions here only format them (the evaluate stage writes the files).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ampbench.arms import BASELINE, TF32_REFERENCE, adoption_code
from ampbench.arms import get as get_arm

CURVE_KEYS = ("train_loss", "val_loss", "val_accuracy", "loss_scale")
# Also written to the DVC plot rows (not drawn in the PNG): the scaler and underflow story per epoch.
PLOT_EXTRA_KEYS = ("grad_underflow_frac", "scaled_grad_underflow_frac", "grad_zero_frac", "grad_norm",
                   "skipped_steps")


HEALTHY_SKIP_SHARE = 0.02  # a scaler that skips more optimizer steps than this is fighting overflow, not settling
MIN_SPEEDUP = 1.05  # smaller throughput gains are within timing noise and are not called faster
INPUT_BOUND_SHARE = 0.2  # an arm that waits for batches this share of its training time is input-bound


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
    numerics: dict[str, Any] = field(default_factory=dict)  # flops, peak_tflops, first_nonfinite, activations

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


def _why_not(arm: str, c: dict[str, Any]) -> str | None:
    """Why ``arm`` cannot be recommended (None: it can, speed aside)."""
    if c["status"] != "ok":
        return f"{arm}: {c['status']}"
    why = [f"{what} {c[key]}" for what, key in (("accuracy", "verdict"), ("loss", "loss_verdict"))
           if c[key] != "equivalent"]
    steps, skipped = c.get("optimizer_steps") or 0, c.get("skipped_steps") or 0
    if skipped > HEALTHY_SKIP_SHARE * steps:
        why.append(f"its scaler skipped {skipped} of {steps} optimizer steps")
    return f"{arm}: {' and '.join(why)}" if why else None


def input_bound(merged: dict[str, dict]) -> list[str]:
    """The arms that waited for their next batch at least INPUT_BOUND_SHARE of their training time."""
    return [a for a, c in merged.items() if (c.get("input_wait_share") or 0) >= INPUT_BOUND_SHARE]


def recommendation(merged: dict[str, dict], context: dict[str, Any]) -> tuple[str, str]:
    """(one line, code): the fastest arm whose accuracy and loss verdicts are both equivalent, whose scaler stayed
    healthy and which is measurably faster than fp32, with its speed and memory gain and the code that adopts it;
    or "stay on fp32" and why. ``merged``: comparison and speed rows per arm."""
    candidates = {a: c for a, c in merged.items() if a != BASELINE and not c.get("ablation")}
    reasons, fit = [], []
    for arm, c in candidates.items():
        why = _why_not(arm, c)
        if why:
            reasons.append(why)
        elif (c.get("speedup_vs_fp32") or 0) < MIN_SPEEDUP:
            reasons.append(f"{arm}: equivalent, but {c.get('speedup_vs_fp32') or 0:.2f}× fp32's samples/s")
        else:
            fit.append(arm)
    cpu = (" Measured on a CPU: mixed-precision speed on a GPU is a different story; rerun there before "
           "deciding." if context.get("device_type") == "cpu" else "")
    bound = input_bound(merged)
    if bound:
        cpu += (f" Input-bound ({', '.join(bound)}): the speed ratios show the input pipeline more than the "
                "precision.")
    if fit:
        best = max(fit, key=lambda a: merged[a]["samples_per_s"])
        c = merged[best]
        vs_tf32 = (f", {c['speedup_vs_tf32']:.2f}× tf32's" if c.get("speedup_vs_tf32") and best != TF32_REFERENCE
                   else "")
        memory = f", {c['memory_vs_fp32']:.2f}× its peak memory" if c.get("memory_vs_fp32") else ""
        line = (f"**Recommendation: switch to {best}.** Accuracy and loss are equivalent to fp32 "
                f"(Δaccuracy {c['delta_accuracy_pp']:+.2f} pp [{c['delta_accuracy_pp_ci_low']:+.2f}, "
                f"{c['delta_accuracy_pp_ci_high']:+.2f}]), the loss scaler stayed healthy, and it runs at "
                f"{c['speedup_vs_fp32']:.2f}× fp32's samples/s{vs_tf32}{memory}. In your own training step:{cpu}")
        return line, adoption_code(get_arm(best), "cuda" if context.get("device_type") != "cpu" else "cpu")
    inconclusive = any(c.get("verdict") == "inconclusive" or c.get("loss_verdict") == "inconclusive"
                       for c in candidates.values())
    more = (" More seeds narrow the intervals: `dvc exp run --temp -S 'train.seeds=[0,1,2,3,4]'`."
            if inconclusive else "")
    why = "; ".join(reasons) if reasons else "no mixed-precision arm was trained"
    return f"**Recommendation: stay on fp32.** No arm is both equivalent and faster ({why}).{more}{cpu}", ""


def markdown_report(arms: list[ArmReport], comparison: dict[str, dict], context: dict[str, Any]) -> str:
    """The table a person reads first (arm, Δaccuracy with CI, verdict, speed ×, memory ×, skipped steps),
    then the reasons for each verdict and what ran."""
    seeds = context.get("seeds", [])
    conf = int(round(100 * context.get("confidence", 0.95)))
    margins, noise = context["margins"], context["noise"]
    rec, code = recommendation(comparison, context)
    acc_margin = f"±{100 * margins.accuracy:.2f} pp" + (" (auto: fp32's seed sd)" if margins.accuracy_rule == "auto"
                                                         else "")
    loss_margin = f"±{margins.loss:.3f} nats" + (" (auto)" if margins.loss_rule == "auto" else "")
    floor = ("fp32's seed-to-seed variation: one seed only, unknown" if noise.accuracy_sd is None else
             f"fp32's own seed-to-seed variation: test accuracy sd {100 * noise.accuracy_sd:.2f} pp, test loss sd "
             f"{noise.loss_sd:.4f} nats; two fp32 seeds disagree on {100 * noise.disagreement:.2f}% of test "
             "predictions")
    lines = [
        "# ampbench: mixed precision vs strict fp32",
        "",
        rec,
        *([""] + ["```python", code, "```"] if code else []),
        "",
        f"Model {model_line(context['model'])}.",
        "",
        f"Data `{context.get('dataset')}`, device `{context.get('device_name')}`, "
        f"{len(seeds)} seed(s) {seeds}, {context.get('epochs')} epoch(s). Test split. Δ = arm − fp32 of the same "
        f"seed on the same test examples. The {conf}% intervals of Δaccuracy and Δloss use every seed's "
        "per-example paired outcomes (a score interval on the discordant pairs, widened when the same examples "
        "flip in every seed, joined with the Student-t interval over the per-seed differences; README: An honest "
        f"verdict). Verdict: *equivalent* when the whole interval lies within the margin (accuracy {acc_margin}, "
        f"loss {loss_margin}; its ends included), *worse*/*better* when wholly outside, *invalid* when a value is "
        f"not finite, else *inconclusive*. {floor}.",
        "",
        f"| arm | verdict | Δaccuracy, pp [{conf}% CI] | right only in fp32 / only in arm | vs fp32 seed noise "
        "| test accuracy | loss verdict | Δloss [CI] | agreement | KL(fp32‖arm) | ΔECE | speed × fp32 | speed × tf32 "
        "| memory × fp32 | skipped steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        name = f"{a.arm} (ablation)" if a.ablation else a.arm
        if not a.ran:
            lines.append(f"| {name} | **{a.status}** | {a.skipped_reason} |" + " |" * 12)
            continue
        c = comparison[a.arm]
        if a.arm == BASELINE:
            delta = flips = noise_label = "—"
            dloss = f"{c['delta_loss']:+.4f}"
        else:
            ci = ("" if c.get("delta_accuracy_pp_ci_low") is None
                  else f" [{c['delta_accuracy_pp_ci_low']:+.2f}, {c['delta_accuracy_pp_ci_high']:+.2f}]")
            delta = f"{_fmt(c.get('delta_accuracy_pp'), '+.2f')}{ci}"
            flips = f"{c['fp32_right_arm_wrong']} / {c['arm_right_fp32_wrong']} of {c['paired_examples']}"
            noise_label = c["vs_seed_noise"]
            lci = ("" if c.get("delta_loss_ci_low") is None
                   else f" [{c['delta_loss_ci_low']:+.4f}, {c['delta_loss_ci_high']:+.4f}]")
            dloss = f"{_fmt(c.get('delta_loss'), '+.4f')}{lci}"
        lines.append(
            f"| {name} | **{c['verdict']}** | {delta} | {flips} | {noise_label} | {100 * c['test_accuracy']:.2f}% "
            f"| {c['loss_verdict']} | {dloss} | {100 * c['agreement_vs_fp32']:.2f}% | {c['kl_vs_fp32']:.2e} "
            f"| {c['delta_ece']:+.4f} | {_fmt(c.get('speedup_vs_fp32'), '.2f', '×')} "
            f"| {_fmt(c.get('speedup_vs_tf32'), '.2f', '×')} | {_fmt(c.get('memory_vs_fp32'), '.2f', '×')} "
            f"| {c['skipped_steps']} |")
    lines += ["", "Why each verdict:", ""]
    for a in arms:
        if a.ran and a.arm != BASELINE:
            lines.append(f"- **{a.arm}**: {a.stats['verdict']}: {a.stats['verdict_reason']}. "
                         f"Loss: {a.stats['loss_verdict']}: {a.stats['loss_verdict_reason']}.")
    lines += ["", "Throughput (median over timing windows after warm-up), peak memory, and the share of training "
              "time spent waiting for the next batch:", ""]
    for a in arms:
        if a.ran:
            c = comparison[a.arm]
            wait = c.get("input_wait_share")
            path = a.train.get("input_path")
            lines.append(f"- **{a.arm}**: {c['samples_per_s']:,.0f} samples/s, peak memory "
                         f"{c['peak_memory_mb']:,.0f} MB" + (f", input {path}" if path else "")
                         + (f", waiting for batches {100 * wait:.1f}% of the time" if wait is not None else ""))
    for arm in input_bound(comparison):
        share = comparison[arm]["input_wait_share"]
        lines.append(f"- **{arm} is input-bound**: it waited for batches {100 * share:.0f}% of its training time, so "
                     "its speed shows the input pipeline, not its precision. More "
                     "train.loader_workers, train.data_on_device: true (if it fits) or a larger batch help.")
    lines += ["", "What ran per arm (read back from torch):", ""]
    for a in arms:
        if a.ran:
            ran = ", ".join(f"{k}={v}" for k, v in a.train.get("policy", {}).items() if k != "precision")
            lines.append(f"- **{a.arm}**: {ran}")
    lines += numerics_lines(arms, comparison, context)
    if context.get("note"):
        lines += ["", context["note"]]
    return "\n".join(lines) + "\n"


NO_EFFECT_SHARE = 0.05  # an autocast arm with less of its matmul/conv/attention FLOPs in 16 bits did not use them
ACTIVATION_ROWS = 8  # modules shown in the report's activation table


def fix_line(modules: list[str]) -> str:
    """The rerun that keeps ``modules`` in float32 (train.fp32_modules), as a user types it."""
    listed = ", ".join(f'"{m}"' for m in modules)  # quoted: YAML would read a Sequential's "2" as a number
    return f".venv/bin/dvc exp run --temp -S 'train.fp32_modules=[{listed}]'"


def _finite_or(x: float | None, spec: str, otherwise: str) -> str:
    """``x`` formatted, or ``otherwise`` where it is not finite (null in the JSON files)."""
    return otherwise if x is None or not math.isfinite(x) else f"{x:{spec}}"


COMPUTE_BOUND_SHARE = 0.4  # of the dense peak: the tensor cores are busy; a lower precision is what helps
FAR_FROM_PEAK_SHARE = 0.1  # below this the step waits on memory traffic or kernel launches, not arithmetic


def bound_by(c: dict[str, Any]) -> str:
    """What limits an arm on a GPU, from its share of the dense peak and of time spent waiting for batches."""
    if (c.get("input_wait_share") or 0) >= INPUT_BOUND_SHARE:
        return "input-bound (waits for batches; see above)"
    if c["peak_share"] >= COMPUTE_BOUND_SHARE:
        return "compute-bound"
    if c["peak_share"] < FAR_FROM_PEAK_SHARE:
        return ("far from the compute peak: memory- or launch-bound (small kernels, elementwise work), so a 16-bit "
                "arm gains less than its tensor-core rate suggests; a larger batch or model, or compile, helps")
    return "between compute- and memory-bound"


def no_effect(arm: ArmReport) -> bool:
    """An autocast arm whose counted step ran (almost) nothing in 16 bits: autocast had no effect."""
    flops, policy = arm.numerics.get("flops"), arm.train.get("policy") or {}
    return bool(flops and flops["total"] and policy.get("autocast_dtype", "off") != "off"
                and flops["low_precision_share"] < NO_EFFECT_SHARE)


def numerics_lines(arms: list[ArmReport], comparison: dict[str, dict], context: dict[str, Any]) -> list[str]:
    """What ran in which dtype and how close to the hardware; the first non-finite module per arm and the fix;
    the modules whose outputs come closest to float16's limits."""
    lines = ["", "## Numerics", "", "Matmul, convolution and attention FLOPs of one training step (forward and "
             "backward) counted at the dispatcher, by the dtype they computed in; achieved FLOP/s = counted FLOPs "
             "per sample × samples/s (a share of the GPU's dense peak for that dtype where the GPU is known):", ""]
    for a in arms:
        flops = a.numerics.get("flops")
        if not flops or not flops["total"]:
            continue
        dtypes = ", ".join(f"{d} {100 * n / flops['total']:.0f}%" for d, n in
                           sorted(flops["by_dtype"].items(), key=lambda kv: -kv[1]))
        c = comparison.get(a.arm, {})
        speed = ""
        if c.get("achieved_tflops") is not None:
            speed = f"; achieved {_count(c['achieved_tflops'] * 1e12)} FLOP/s"
            if c.get("peak_share") is not None:
                speed += (f", {100 * c['peak_share']:.1f}% of this GPU's {flops['dominant_dtype']} peak "
                          f"({a.numerics['peak_tflops']:g} TFLOP/s): {bound_by(c)}")
        flag = (" — **autocast had no effect**: its matmuls and convolutions ran in float32 (a model that casts "
                "its own inputs, or an op autocast does not cover)" if no_effect(a) else "")
        lines.append(f"- **{a.arm}**: {100 * flops['low_precision_share']:.0f}% of matmul/conv/attention FLOPs in "
                     f"16 bits ({dtypes}; {_count(flops['per_sample'])} FLOPs per training sample){speed}{flag}")
    found = [(a, seed, c) for a in arms for seed, c in sorted(a.numerics.get("first_nonfinite", {}).items())]
    if found:
        lines += ["", "First non-finite module (hooks on the step that went bad, or a replay of it: outputs in "
                  "forward order, then input gradients in backward order, naming the module whose backward made "
                  "them, then weight gradients):", ""]
        for a, seed, c in found:
            note = ""
            if a.status == "diverged":
                note = f" — the arm diverged; to keep that module in float32: `{fix_line([c['module']])}`"
            elif c["loss_scale"] >= 2.0**15 and c["phase"] != "forward":
                note = " (the scaler's first calibration steps at its initial scale: expected)"
            lines.append(f"- **{a.arm}** seed {seed}: {c['message']} ({c['how']}){note}")
    ref = next((a for a in arms if a.arm == BASELINE and a.numerics.get("activations")), None)
    if ref is not None:
        others = [a for a in arms if a.arm != BASELINE and a.numerics.get("activations")
                  and (a.status == "diverged" or (a.train.get("policy") or {}).get("autocast_dtype", "off") != "off")]
        tables = {a.arm: {r["module"]: r for r in a.numerics["activations"]} for a in others}
        head = " | ".join(f"{a.arm} max | {a.arm} → inf / → 0" for a in others)
        lines += ["", "Module outputs closest to float16's limits (largest |output| over the sampled steps; headroom "
                  "= log₂(65504 / max), negative: float16 overflows; the shares of outputs float16 turns into inf "
                  "and of non-zero outputs it flushes to 0), ranked by the fp32 arm:", "",
                  f"| module | type | fp32 max | headroom | {head} |",
                  "|---|---|---|---|" + "---|---|" * len(others)]  # max: the largest |output|
        for row in ref.numerics["activations"][:ACTIVATION_ROWS]:
            cells = []
            for a in others:
                o = tables[a.arm].get(row["module"])
                shares = None if o is None else f"{100 * o['overflow_frac']:.2f}% / {100 * o['underflow_frac']:.2f}%"
                cells += ["—", "—"] if o is None else [_finite_or(o["max_abs"], ".3g", "inf/NaN"), shares]
            lines.append(f"| `{row['module']}` | {row['type']} | {_finite_or(row['max_abs'], '.3g', 'inf/NaN')} | "
                         f"{_finite_or(row['headroom_log2'], '+.1f', '−∞')} | " + " | ".join(cells) + " |")
    return lines


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
    ax.set_xlabel("Δ test accuracy vs fp32 (percentage points), with its paired CI (seeds × test examples)")
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
