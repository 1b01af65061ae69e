"""Turn evaluated arms into what people read: the Markdown report and the DVC plot rows.

Only rendering: the numbers come from ``comparison.py`` (one ``ArmReport`` per arm and the merged comparison and
speed rows), the recommendation and its reasons from ``advice.py``; the evaluate stage writes the files.
"""

from __future__ import annotations

import math
from typing import Any

from ampbench.advice import bound_by, fix_line, input_bound, no_effect
from ampbench.arms import BASELINE
from ampbench.comparison import ArmReport, decided_by_loss

CURVE_KEYS = ("train_loss", "val_loss", "val_accuracy", "loss_scale")
# Also written to the DVC plot rows (not drawn in the PNG): the scaler and underflow story per epoch.
PLOT_EXTRA_KEYS = ("grad_underflow_frac", "scaled_grad_underflow_frac", "grad_zero_frac", "grad_norm",
                   "skipped_steps")
ACTIVATION_ROWS = 8  # modules shown in the report's activation table


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


def has_scaler(a: ArmReport) -> bool:
    """Whether the arm trained with a GradScaler (what ran, read back from its summary)."""
    return a.train.get("policy", {}).get("grad_scaler") == "on"


def _fmt(x, spec: str, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def _count(n: float) -> str:
    """1234567 → "1.23M"."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _finite_or(x: float | None, spec: str, otherwise: str) -> str:
    """``x`` formatted, or ``otherwise`` where it is not finite (null in the JSON files)."""
    return otherwise if x is None or not math.isfinite(x) else f"{x:{spec}}"


def model_line(model: dict[str, Any]) -> str:
    """The model's identity in words: name, arguments, parameters, FLOPs per sample."""
    args = ", ".join(f"{k}={v}" for k, v in model.get("args", {}).items())
    width = f", width {model['width']}" if model.get("width") is not None else ""
    return (f"`{model['name']}`{f' ({args})' if args else ''}{width}: {_count(model['parameters'])} parameters, "
            f"{_count(model['flops_per_sample'])} FLOPs per sample (forward)")


def markdown_report(arms: list[ArmReport], comparison: dict[str, dict], context: dict[str, Any],
                    advice: tuple[str, str]) -> str:
    """The report: ``advice`` (the recommendation line and the code that adopts it, ``advice.recommendation``),
    the table a person reads first (arm, Δaccuracy with CI, verdict, speed ×, memory ×, skipped steps), then the
    reasons for each verdict, throughput, what ran, and the numerics."""
    rec, code = advice
    lines = ["# ampbench: mixed precision vs strict fp32", "", rec,
             *([""] + ["```python", code, "```"] if code else []), "",
             f"Model {model_line(context['model'])}.", "", _method(context), ""]
    by_loss = decided_by_loss(context.get("task"))
    lines += _loss_table(arms, comparison, context) if by_loss else _table(arms, comparison, context)
    lines += ["", "Why each verdict:", ""]
    for a in arms:
        if a.ran and a.arm != BASELINE:
            st, task = a.stats, context.get("task")
            first, second = ("loss", "accuracy") if by_loss else ("accuracy", "loss")
            name = {"accuracy": getattr(task, "accuracy_label", "accuracy"),
                    "loss": getattr(task, "loss_label", "loss")}
            lines.append(f"- **{a.arm}**: " + " ".join(
                f"{name[m].capitalize()}: not worse? **{st[f'{m}_not_worse']}**: {st[f'{m}_not_worse_reason']}; "
                f"equivalent? {st[f'{m}_verdict']}: {st[f'{m}_verdict_reason']}." for m in (first, second)))
    lines += _throughput(arms, comparison)
    lines += ["", "What ran per arm (read back from torch):", ""]
    for a in arms:
        if a.ran:
            ran = ", ".join(f"{k}={v}" for k, v in a.train.get("policy", {}).items() if k != "precision")
            lines.append(f"- **{a.arm}**: {ran}")
    lines += numerics_lines(arms, comparison)
    if context.get("note"):
        lines += ["", context["note"]]
    return "\n".join(lines) + "\n"


def _method(context: dict[str, Any]) -> str:
    """The paragraph that says what was compared, how the intervals are made and what each verdict means."""
    seeds = context.get("seeds", [])
    conf = int(round(100 * context.get("confidence", 0.95)))
    margins, noise = context["margins"], context["noise"]
    acc_margin = f"±{100 * margins.accuracy:.2f} pp" + (" (auto: fp32's seed sd)" if margins.accuracy_rule == "auto"
                                                         else "")
    loss_margin = f"±{margins.loss:.3f} nats" + (" (auto)" if margins.loss_rule == "auto" else "")
    floor = ("fp32's seed-to-seed variation: one seed only, unknown" if noise.accuracy_sd is None else
             f"fp32's own seed-to-seed variation: test accuracy sd {100 * noise.accuracy_sd:.2f} pp, test loss sd "
             f"{noise.loss_sd:.4f} nats; two fp32 seeds disagree on {100 * noise.disagreement:.2f}% of test "
             "predictions")
    if decided_by_loss(context.get("task")):
        return (f"Data `{context.get('dataset')}`, device `{context.get('device_name')}`, {len(seeds)} seed(s) "
                f"{seeds}, {context.get('epochs')} epoch(s). Test split. Δ = arm − fp32 of the same seed on the same "
                f"test sequences. The {conf}% intervals of Δloss (nats per token) and Δ next-token accuracy use every "
                "seed's per-sequence paired outcomes (sequences and seeds as clusters; docs/verdict.md). The verdict "
                f"is the loss's: *equivalent* when its whole interval lies within ±{margins.loss:.3f} nats per token"
                f"{' (auto)' if margins.loss_rule == 'auto' else ''} (next-token accuracy: {acc_margin}; the ends "
                "included), *worse*/*better* when wholly outside, *invalid* when a value is not finite, else "
                f"*inconclusive*. {_not_worse_sentence(conf)} "
                f"{floor.replace('predictions', 'next-token predictions')}.")
    return (f"Data `{context.get('dataset')}`, device `{context.get('device_name')}`, "
            f"{len(seeds)} seed(s) {seeds}, {context.get('epochs')} epoch(s). Test split. Δ = arm − fp32 of the same "
            f"seed on the same test examples. The {conf}% intervals of Δaccuracy and Δloss use every seed's "
            "per-example paired outcomes (a score interval on the discordant pairs, widened when the same examples "
            "flip in every seed, joined with the Student-t interval over the per-seed differences; docs/verdict.md)."
            f" Verdict: *equivalent* when the whole interval lies within the margin (accuracy {acc_margin}, "
            f"loss {loss_margin}; its ends included), *worse*/*better* when wholly outside, *invalid* when a value "
            f"is not finite, else *inconclusive*. {_not_worse_sentence(conf)} {floor}.")


def _not_worse_sentence(conf: int) -> str:
    """What *not worse* means: the question the recommendation asks (non-inferiority)."""
    return (f"*Not worse* asks whether anything degraded, and decides the recommendation: the one-sided {conf}% "
            "bound on the bad side (accuracy's lower, loss's upper) is within the margin, so a better arm is not "
            "worse; *worse* when even the other bound is past it.")


def _table(arms: list[ArmReport], comparison: dict[str, dict], context: dict[str, Any]) -> list[str]:
    """The main table of a task whose verdict is its accuracy's (image classification): one row per arm."""
    conf = int(round(100 * context.get("confidence", 0.95)))

    def row(a: ArmReport, c: dict[str, Any]) -> str:
        base = a.arm == BASELINE
        delta = "—" if base else _with_ci(c, "delta_accuracy_pp", "+.2f")
        flips = ("—" if base else
                 f"{c['fp32_right_arm_wrong']} / {c['arm_right_fp32_wrong']} of {c['paired_examples']}")
        dloss = f"{c['delta_loss']:+.4f}" if base else _with_ci(c, "delta_loss", "+.4f")
        return (f"**{c['not_worse']}** | {c['verdict']} | {delta} | {flips} | {'—' if base else c['vs_seed_noise']} "
                f"| {100 * c['test_accuracy']:.2f}% | {c['loss_verdict']} | {dloss} "
                f"| {100 * c['agreement_vs_fp32']:.2f}% | {c['kl_vs_fp32']:.2e} | {c['delta_ece']:+.4f}")

    return _arm_table(arms, comparison, f"not worse? | equivalent? | Δaccuracy, pp [{conf}% CI] "
                      "| right only in fp32 / only in arm "
                      "| vs fp32 seed noise | test accuracy | loss verdict | Δloss [CI] | agreement | KL(fp32‖arm) "
                      "| ΔECE", row)


def _loss_table(arms: list[ArmReport], comparison: dict[str, dict], context: dict[str, Any]) -> list[str]:
    """The main table of a task whose verdict is its loss's (a language model: nats per token)."""
    conf = int(round(100 * context.get("confidence", 0.95)))

    task = context.get("task")

    def row(a: ArmReport, c: dict[str, Any]) -> str:
        base = a.arm == BASELINE
        return (f"**{c['not_worse']}** | {c['verdict']} | {'—' if base else _with_ci(c, 'delta_loss', '+.4f')} "
                f"| {'—' if base else c['vs_seed_noise']} | {c['test_loss']:.4f} | {_fmt(c.get('perplexity'), '.3f')} "
                f"| {100 * c['test_accuracy']:.2f}% | {c['accuracy_verdict']} "
                f"| {'—' if base else _with_ci(c, 'delta_accuracy_pp', '+.2f')} | {100 * c['agreement_vs_fp32']:.2f}% "
                f"| {c['kl_vs_fp32']:.2e}")

    return _arm_table(arms, comparison, f"not worse? | equivalent? | Δloss, nats/token [{conf}% CI] "
                      "| vs fp32 seed noise "
                      f"| {task.loss_label} | perplexity | {task.accuracy_label} | accuracy verdict "
                      "| Δaccuracy, pp [CI] | agreement | KL(fp32‖arm)", row)


def _arm_table(arms: list[ArmReport], comparison: dict[str, dict], columns: str, row) -> list[str]:
    """A row per arm: ``row(arm, its comparison row)`` gives the task's columns, then speed, memory and skipped
    steps; a skipped or diverged arm says why."""
    header = f"| arm | {columns} | speed × fp32 | speed × tf32 | memory × fp32 | skipped steps |"
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for a in arms:
        name = f"{a.arm} (ablation)" if a.ablation else a.arm
        if not a.ran:
            lines.append(f"| {name} | **{a.status}** | {a.skipped_reason} |" + " |" * (header.count(" | ") - 2))
            continue
        c = comparison[a.arm]
        lines.append(f"| {name} | {row(a, c)} | {_fmt(c.get('speedup_vs_fp32'), '.2f', '×')} "
                     f"| {_fmt(c.get('speedup_vs_tf32'), '.2f', '×')} | {_fmt(c.get('memory_vs_fp32'), '.2f', '×')} "
                     f"| {c['skipped_steps']} |")
    return lines


def _with_ci(c: dict[str, Any], key: str, spec: str) -> str:
    """``c[key]`` with its interval ``[key_ci_low, key_ci_high]`` when there is one."""
    ci = "" if c.get(f"{key}_ci_low") is None else f" [{c[f'{key}_ci_low']:{spec}}, {c[f'{key}_ci_high']:{spec}}]"
    return f"{_fmt(c.get(key), spec)}{ci}"


def _throughput(arms: list[ArmReport], comparison: dict[str, dict]) -> list[str]:
    """Throughput, peak memory and input wait per arm; a line for each input-bound arm."""
    lines = ["", "Throughput (median over timing windows after warm-up), peak memory, and the share of training "
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
    return lines


def numerics_lines(arms: list[ArmReport], comparison: dict[str, dict]) -> list[str]:
    """What ran in which dtype and how close to the hardware; the first non-finite module per arm and the fix;
    the modules whose outputs come closest to float16's limits."""
    lines = ["", "## Numerics", "", "Matmul, convolution and attention FLOPs of one training step (forward and "
             "backward) counted at the dispatcher, by the dtype they computed in; achieved FLOP/s = counted FLOPs "
             "per sample × samples/s (a share of the GPU's dense peak for that dtype where the GPU is known):", ""]
    lines += [line for a in arms if (line := _flop_line(a, comparison.get(a.arm, {})))]
    return lines + _nonfinite_lines(arms) + _activation_table(arms)


def _flop_line(a: ArmReport, c: dict[str, Any]) -> str | None:
    """One arm's FLOPs by dtype and achieved FLOP/s (None when nothing was counted)."""
    flops = a.numerics.get("flops")
    if not flops or not flops["total"]:
        return None
    dtypes = ", ".join(f"{d} {100 * n / flops['total']:.0f}%" for d, n in
                       sorted(flops["by_dtype"].items(), key=lambda kv: -kv[1]))
    speed = ""
    if c.get("achieved_tflops") is not None:
        speed = f"; achieved {_count(c['achieved_tflops'] * 1e12)} FLOP/s"
        if c.get("peak_share") is not None:
            speed += (f", {100 * c['peak_share']:.1f}% of this GPU's {flops['dominant_dtype']} peak "
                      f"({a.numerics['peak_tflops']:g} TFLOP/s): {bound_by(c)}")
    flag = (" — **autocast had no effect**: its matmuls and convolutions ran in float32 (a model that casts "
            "its own inputs, or an op autocast does not cover)" if no_effect(a) else "")
    return (f"- **{a.arm}**: {100 * flops['low_precision_share']:.0f}% of matmul/conv/attention FLOPs in "
            f"16 bits ({dtypes}; {_count(flops['per_sample'])} FLOPs per training sample){speed}{flag}")


def _nonfinite_lines(arms: list[ArmReport]) -> list[str]:
    """The first non-finite module per arm and seed; for a diverged arm the rerun that keeps it in float32."""
    found = [(a, seed, c) for a in arms for seed, c in sorted(a.numerics.get("first_nonfinite", {}).items())]
    if not found:
        return []
    lines = ["", "First non-finite module (hooks on the step that went bad, or a replay of it: outputs in forward "
             "order, then input gradients in backward order, naming the module whose backward made them, then "
             "weight gradients):", ""]
    for a, seed, c in found:
        note = ""
        if a.status == "diverged":
            note = f" — the arm diverged; to keep that module in float32: `{fix_line([c['module']])}`"
        elif c["loss_scale"] >= 2.0**15 and c["phase"] != "forward":
            note = " (the scaler's first calibration steps at its initial scale: expected)"
        lines.append(f"- **{a.arm}** seed {seed}: {c['message']} ({c['how']}){note}")
    return lines


def _activation_table(arms: list[ArmReport]) -> list[str]:
    """The modules whose outputs come closest to float16's limits, ranked by the fp32 arm, beside each 16-bit arm."""
    ref = next((a for a in arms if a.arm == BASELINE and a.numerics.get("activations")), None)
    if ref is None:
        return []
    others = [a for a in arms if a.arm != BASELINE and a.numerics.get("activations")
              and (a.status == "diverged" or (a.train.get("policy") or {}).get("autocast_dtype", "off") != "off")]
    tables = {a.arm: {r["module"]: r for r in a.numerics["activations"]} for a in others}
    head = " | ".join(f"{a.arm} max | {a.arm} → inf / → 0" for a in others)
    lines = ["", "Module outputs closest to float16's limits (largest |output| over the sampled steps; headroom "
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
