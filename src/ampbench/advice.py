"""The policy behind the report's advice: when an arm may be recommended, what limits it, and the line that fixes
a diverged one. Only decisions here; ``report.py`` renders them.
"""

from __future__ import annotations

from typing import Any

from ampbench.arms import BASELINE, TF32_REFERENCE, adoption_code
from ampbench.arms import get as get_arm
from ampbench.comparison import ArmReport, decided_by_loss

HEALTHY_SKIP_SHARE = 0.02  # a scaler that skips more optimizer steps than this is fighting overflow, not settling
MIN_SPEEDUP = 1.05  # smaller throughput gains are within timing noise and are not called faster
INPUT_BOUND_SHARE = 0.2  # an arm that waits for batches this share of its training time is input-bound
NO_EFFECT_SHARE = 0.05  # an autocast arm with less of its matmul/conv/attention FLOPs in 16 bits did not use them


def _why_not(arm: str, c: dict[str, Any], task=None) -> str | None:
    """Why ``arm`` cannot be recommended (None: it can, speed aside): both verdicts must be equivalent, the
    deciding one first, under the task's names for them."""
    if c["status"] != "ok":
        return f"{arm}: {c['status']}"
    acc, loss = getattr(task, "accuracy_label", "accuracy"), getattr(task, "loss_label", "loss")
    checks = (((loss, "verdict"), (acc, "accuracy_verdict")) if decided_by_loss(task)
              else ((acc, "verdict"), (loss, "loss_verdict")))
    why = [f"{what} {c[key]}" for what, key in checks if c[key] != "equivalent"]
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
        why = _why_not(arm, c, context.get("task"))
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
        if decided_by_loss(context.get("task")):  # a language model
            what = (f"Loss per token and next-token accuracy are equivalent to fp32 (Δloss {c['delta_loss']:+.4f} "
                    f"[{c['delta_loss_ci_low']:+.4f}, {c['delta_loss_ci_high']:+.4f}] nats per token)")
        else:
            what = (f"Accuracy and loss are equivalent to fp32 (Δaccuracy {c['delta_accuracy_pp']:+.2f} pp "
                    f"[{c['delta_accuracy_pp_ci_low']:+.2f}, {c['delta_accuracy_pp_ci_high']:+.2f}])")
        line = (f"**Recommendation: switch to {best}.** {what}, the loss scaler stayed healthy, and it runs at "
                f"{c['speedup_vs_fp32']:.2f}× fp32's samples/s{vs_tf32}{memory}. In your own training step:{cpu}")
        return line, adoption_code(get_arm(best), "cuda" if context.get("device_type") != "cpu" else "cpu")
    inconclusive = any(c.get("verdict") == "inconclusive" or c.get("loss_verdict") == "inconclusive"
                       for c in candidates.values())
    more = (" More seeds narrow the intervals: `dvc exp run --temp -S 'train.seeds=[0,1,2,3,4]'`."
            if inconclusive else "")
    why = "; ".join(reasons) if reasons else "no mixed-precision arm was trained"
    return f"**Recommendation: stay on fp32.** No arm is both equivalent and faster ({why}).{more}{cpu}", ""


def fix_line(modules: list[str]) -> str:
    """The rerun that keeps ``modules`` in float32 (train.fp32_modules), as a user types it."""
    listed = ", ".join(f'"{m}"' for m in modules)  # quoted: YAML would read a Sequential's "2" as a number
    return f".venv/bin/dvc exp run --temp -S 'train.fp32_modules=[{listed}]'"


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
