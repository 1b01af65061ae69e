"""The report's numerics section: FLOPs by dtype and achieved FLOP/s per arm, the first non-finite module, and
the module outputs closest to float16's limits. Only rendering; ``markdown.py`` puts it in the report.
"""

from __future__ import annotations

import math
from typing import Any

from ampbench.config.arms import BASELINE
from ampbench.report.advice import bound_by, float32_fix, no_effect
from ampbench.verdict.comparison import ArmReport

ACTIVATION_ROWS = 8  # modules shown in the report's activation table


def _finite_or(x: float | None, spec: str, otherwise: str) -> str:
    """``x`` formatted, or ``otherwise`` where it is not finite (null in the JSON files)."""
    return otherwise if x is None or not math.isfinite(x) else f"{x:{spec}}"


def short_count(n: float) -> str:
    """1234567 → "1.23M"."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def numerics_lines(arms: list[ArmReport], comparison: dict[str, dict]) -> list[str]:
    """What ran in which dtype and how close to the hardware; the first non-finite module per arm and the fix;
    the modules whose outputs come closest to float16's limits."""
    lines = ["", "### Numerics", "", "Matmul, convolution and attention FLOPs of one training step (forward and "
             "backward) counted at the dispatcher, by the dtype they computed in; achieved FLOP/s = counted FLOPs "
             "per sample × samples/s (a share of the GPU's dense peak for that dtype where the GPU is known):", ""]
    lines += [line for a in arms if (line := _flop_line(a, comparison.get(a.arm, {})))]
    return lines + _nonfinite_lines(arms) + _activation_table(arms)


def _flop_line(a: ArmReport, c: dict[str, Any]) -> str | None:
    """One arm's FLOPs by dtype and achieved FLOP/s (None when nothing was counted)."""
    flops = a.numerics.flops
    if not flops or not flops["total"]:
        return None
    dtypes = ", ".join(f"{d} {100 * n / flops['total']:.0f}%" for d, n in
                       sorted(flops["by_dtype"].items(), key=lambda kv: -kv[1]))
    speed = ""
    if c.get("achieved_tflops") is not None:
        speed = f"; achieved {short_count(c['achieved_tflops'] * 1e12)} FLOP/s"
        if c.get("peak_share") is not None:
            speed += (f", {100 * c['peak_share']:.1f}% of this GPU's {flops['dominant_dtype']} peak "
                      f"({a.numerics.peak_tflops:g} TFLOP/s): {bound_by(c)}")
    flag = (" — **autocast had no effect**: its matmuls and convolutions ran in float32 (a model that casts "
            "its own inputs, or an op autocast does not cover)" if no_effect(flops, a.trained.policy) else "")
    bits = "16 or 8 bits" if any(d.startswith("float8") for d in flops["by_dtype"]) else "16 bits"
    return (f"- **{a.arm}**: {100 * flops['low_precision_share']:.0f}% of matmul/conv/attention FLOPs in "
            f"{bits} ({dtypes}; {short_count(flops['per_sample'])} FLOPs per training sample){speed}{flag}")


def _nonfinite_lines(arms: list[ArmReport]) -> list[str]:
    """The first non-finite module per arm and seed; for a diverged arm the rerun that keeps it in float32."""
    found = [(a, seed, c) for a in arms for seed, c in sorted(a.numerics.first_nonfinite.items())]
    if not found:
        return []
    lines = ["", "First non-finite module (hooks on the step that went bad, or a replay of it: outputs in forward "
             "order, then input gradients in backward order, naming the module whose backward made them, then "
             "weight gradients):", ""]
    for a, seed, c in found:
        note = ""
        fix = float32_fix(c, a.arm)
        if a.status == "diverged":
            note = f" — the arm diverged; to keep that module in float32: `{fix}`" if fix else " — the arm diverged"
        elif c["loss_scale"] >= 2.0**15 and c["phase"] not in ("forward", "loss"):
            note = " (the scaler's first calibration steps at its initial scale: expected)"
        lines.append(f"- **{a.arm}** seed {seed}: {c['message']} ({c['how']}){note}")
    return lines


def _activation_table(arms: list[ArmReport]) -> list[str]:
    """The modules whose outputs come closest to float16's limits, ranked by the fp32 arm, beside each 16-bit arm."""
    ref = next((a for a in arms if a.arm == BASELINE and a.numerics.activations), None)
    if ref is None:
        return []
    others = [a for a in arms if a.arm != BASELINE and a.numerics.activations
              and (a.status == "diverged" or a.trained.policy.get("autocast_dtype", "off") != "off")]
    tables = {a.arm: {r["module"]: r for r in a.numerics.activations} for a in others}
    head = " | ".join(f"{a.arm} max | {a.arm} → inf / → 0" for a in others)
    lines = ["", "Module outputs closest to float16's limits (largest |output| over the sampled steps; headroom "
             "= log₂(65504 / max), negative: float16 overflows; the shares of outputs float16 turns into inf "
             "and of non-zero outputs it flushes to 0), ranked by the fp32 arm:", "",
             f"| module | type | fp32 max | headroom | {head} |",
             "|---|---|---|---|" + "---|---|" * len(others)]  # max: the largest |output|
    for row in ref.numerics.activations[:ACTIVATION_ROWS]:
        cells = []
        for a in others:
            o = tables[a.arm].get(row["module"])
            shares = None if o is None else f"{100 * o['overflow_frac']:.2f}% / {100 * o['underflow_frac']:.2f}%"
            cells += ["—", "—"] if o is None else [_finite_or(o["max_abs"], ".3g", "inf/NaN"), shares]
        lines.append(f"| `{row['module']}` | {row['type']} | {_finite_or(row['max_abs'], '.3g', 'inf/NaN')} | "
                     f"{_finite_or(row['headroom_log2'], '+.1f', '−∞')} | " + " | ".join(cells) + " |")
    return lines
