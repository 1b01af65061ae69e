"""The policy behind the report's advice: when an arm may be recommended (``Recommendation``), what keeps each other
arm from it, what limits an arm on a GPU, and the line that fixes a diverged one. Only decisions here;
``markdown.py`` renders them, ``plans.py`` words the sample-size plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ampbench.config.arms import BASELINE, TF32_REFERENCE, adoption_code, no_islands
from ampbench.config.arms import get as get_arm
from ampbench.report.context import RunContext

HEALTHY_SKIP_SHARE = 0.02  # a scaler that skips more optimizer steps than this is fighting overflow, not settling
MIN_SPEEDUP = 1.05  # smaller throughput gains are within timing noise: the interval's low end must clear it
INPUT_BOUND_SHARE = 0.2  # an arm that waits for batches this share of its training time is input-bound
NO_EFFECT_SHARE = 0.05  # an autocast arm with less of its matmul/conv/attention FLOPs in 16 bits did not use them


def _why_not(c: dict[str, Any], context: RunContext) -> str | None:
    """Why an arm (``c``: its merged row) cannot be recommended (None: it can, speed aside): it must be *not worse*
    than fp32 on both metrics (the tutorial's "confirm nothing degraded"), the deciding one first, under the task's
    names for them."""
    if c["status"] != "ok":
        return c["status"]
    acc, loss = context.labels["accuracy"], context.labels["loss"]
    checks = (((loss, "not_worse"), (acc, "accuracy_not_worse")) if context.by_loss
              else ((acc, "not_worse"), (loss, "loss_not_worse")))
    why = [f"{what} {c.get(key, 'not judged')}" for what, key in checks if c.get(key) != "not worse"]
    steps, skipped = c.get("optimizer_steps") or 0, c.get("skipped_steps") or 0
    if skipped > HEALTHY_SKIP_SHARE * steps:
        why.append(f"its scaler skipped {skipped} of {steps} optimizer steps")
    return " and ".join(why) if why else None


def better_than_seed_noise(arm: str, c: dict[str, Any], by_loss: bool) -> str | None:
    """A warning when a 16-bit arm beats fp32 by more than fp32's own seed-to-seed variation: rounding alone
    rarely helps that much, so a difference that size is worth understanding before it is celebrated."""
    if c.get("status") != "ok" or c.get("vs_seed_noise") != "beyond":
        return None
    delta = c.get("delta_loss") if by_loss else c.get("delta_accuracy_pp")
    if delta is None or (delta >= 0 if by_loss else delta <= 0):
        return None
    shown = f"Δloss {delta:+.4f} nats" if by_loss else f"Δaccuracy {delta:+.2f} pp"
    return (f"{arm} is better than fp32 by more than fp32's own seed-to-seed variation ({shown}): worth "
            "understanding (an under-trained or differently regularised fp32 run, a data or evaluation difference) "
            "before it is counted as a gain")


def input_bound(merged: dict[str, dict]) -> list[str]:
    """The arms that waited for their next batch at least INPUT_BOUND_SHARE of their training time."""
    return [a for a, c in merged.items() if (c.get("input_wait_share") or 0) >= INPUT_BOUND_SHARE]


@dataclass(frozen=True)
class Recommendation:
    """The advice: the arm to switch to (None: stay on fp32), why each other arm is not it, the sentence that says
    what would decide, the notes (warnings, CPU, input-bound), and the code that adopts the arm."""

    best: str | None
    verdict: str  # the first sentence and what it rests on
    reasons: dict[str, str]  # arm → why it is not recommended
    more: str  # what would decide (stay only): the fastest undecided arm's first plan, or more seeds
    notes: str
    code: str

    @property
    def line(self) -> str:
        """The whole recommendation in one line (the stage's log, the MLflow parent's tag)."""
        if self.best:
            return f"{self.verdict}{self.notes}"
        why = "; ".join(f"{arm}: {why}" for arm, why in self.reasons.items()) or "no mixed-precision arm was trained"
        return f"{self.verdict} ({why}).{self.more}{self.notes}"

    @property
    def headline(self) -> str:
        """What the report's first screen says above its table, which has each arm's reason."""
        return f"{self.verdict}{'' if self.best else ' (each arm: the last column).'}{self.notes}"

    @property
    def plain(self) -> str:
        return self.line.replace("**", "")


def recommendation(merged: dict[str, dict], context: RunContext) -> Recommendation:
    """The fastest arm that is *not worse* than fp32 on accuracy and loss, whose scaler stayed healthy and which is
    measurably faster than fp32, with its speed and memory gain and the code that adopts it; or "stay on fp32" and
    why. A better arm can be recommended; one better by more than fp32's seed noise carries a warning.
    ``merged``: comparison and speed rows per arm."""
    candidates = {a: c for a, c in merged.items() if a != BASELINE and not c.get("ablation")}
    reasons, qualified = {}, []
    for arm, c in candidates.items():
        why = _why_not(c, context)
        if why or _speed_floor(c) < MIN_SPEEDUP:
            reasons[arm] = why or _too_slow(c)
        else:
            qualified.append(arm)
    notes = "".join(f" Note: {w}." for w in (better_than_seed_noise(a, c, context.by_loss)
                                             for a, c in candidates.items()) if w)
    if context.device_type == "cpu":
        notes += (" Measured on a CPU: mixed-precision speed on a GPU is a different story; rerun there before "
                  "deciding.")
    notes += "".join(f" {line}." for line in (rank_hint(a, c) for a, c in candidates.items()) if line)
    bound = input_bound(merged)
    if bound:
        notes += f" Input-bound ({', '.join(bound)}): the speed ratios show the input pipeline more than the precision."
    if qualified:
        # Faster to fp32's quality first (an arm that steps faster but needs more steps gains less), then speed.
        best = min(qualified, key=lambda a: (merged[a].get("time_to_fp32_quality_vs_fp32") or float("inf"),
                                             -(merged[a]["samples_per_s"] or 0)))
        others = {a: "also qualifies; slower to fp32's quality" for a in qualified if a != best}
        return Recommendation(best, _switch_text(best, merged[best], context), {**reasons, **others}, "", notes,
                              adoption_code(get_arm(best), "cuda" if context.device_type != "cpu" else "cpu",
                                            context.model.kind if context.model else None))
    return Recommendation(None, "**Recommendation: stay on fp32.** No arm is both not worse and faster", reasons,
                          _more(candidates, context), notes, "")


def _switch_text(best: str, c: dict[str, Any], context: RunContext) -> str:
    vs_tf32 = (f", {c['speedup_vs_tf32']:.2f}× tf32's" if c.get("speedup_vs_tf32") and best != TF32_REFERENCE
               else "")
    memory = f", {c['memory_vs_fp32']:.2f}× its peak memory" if c.get("memory_vs_fp32") else ""
    return (f"**Recommendation: switch to {best}.** {_not_worse_text(c, context.by_loss)}, the loss scaler stayed "
            f"healthy, and it runs at {_speed_text(c)} fp32's samples/s{vs_tf32}{memory}{_quality_text(c)}.")


def _more(candidates: dict[str, dict], context: RunContext) -> str:
    """What would decide, when nothing qualifies: the fastest undecided arm's first plan (the report lists every
    plan), or more seeds."""
    from ampbench.report.plans import more_seeds, plan_lines

    planned = [(a, c["plans"][0]) for a, c in sorted(candidates.items(), key=lambda ac: -(ac[1].get(
        "samples_per_s") or 0)) if c.get("plans")]
    if planned:
        return f" To decide: {plan_lines(planned[0][0], [planned[0][1]], context)[0]}."
    if any("inconclusive" in (c.get("not_worse"), c.get("loss_not_worse"), c.get("accuracy_not_worse"))
           for c in candidates.values()):
        seeds = ",".join(map(str, more_seeds(context.seeds)))
        return f" More seeds narrow the intervals: `dvc exp run --temp -S 'train.seeds=[{seeds}]'`."
    return ""


def what_would_decide(arm: str, c: dict[str, Any], rec: Recommendation, context: RunContext) -> str:
    """The first table's last cell: the recommended arm, or why an arm is not it and what would decide it."""
    from ampbench.report.plans import short_plan

    if arm == BASELINE:
        return "—"
    if arm == rec.best:
        return "recommended: the code below"
    looks = context.looks
    if looks and not looks.outcome.stopped and c.get("decided_at_seeds", 0) is None:  # a look of ampbench decide
        seeds = looks.outcome.look.seeds
        return (f"undecided at {seeds} seeds; the next look adds one ({seeds + 1} of at most "
                f"{looks.design.max_seeds}): `ampbench decide` goes on")
    if c.get("plans"):
        return f"undecided; {short_plan(c['plans'], context.by_loss)}"
    if arm in rec.reasons and not _why_not(c, context):  # decided, and held back by its speed alone
        bar = "its interval's low end " if c.get("speedup_vs_fp32_ci_low") is not None else ""
        return f"decided; its speed: a switch needs {bar}at {MIN_SPEEDUP:.2f}× fp32 or more"
    return rec.reasons.get(arm, "an ablation: not a candidate" if c.get("ablation") else "—")


def _quality_text(c: dict[str, Any]) -> str:
    """What the recommended arm's time to fp32's quality says, when it was measured."""
    ratio, reached = c.get("time_to_fp32_quality_vs_fp32"), c.get("seeds_reaching_fp32_quality")
    if ratio is not None:
        gain = "sooner" if ratio < 1 else "no sooner: it needs more steps than its speed makes up for"
        return f"; it reaches fp32's validation loss in {ratio:.2f}× fp32's time ({gain})"
    if reached is not None and reached < (c.get("seeds") or 0):
        return f"; but it reached fp32's validation loss in only {reached} of {c['seeds']} seeds"
    return ""


def _too_slow(c: dict[str, Any]) -> str:
    """Why a *not worse* arm is not recommended on speed; for one faster than fp32 but not clearly so, the bar it
    missed (1.05× [1.04, 1.06] would otherwise read as met)."""
    bar = "its interval's low end " if c.get("speedup_vs_fp32_ci_low") is not None else ""
    faster = (c.get("speedup_vs_fp32") or 0) >= 1
    return f"not worse, but {_speed_text(c)} fp32's samples/s" + (
        f" (a switch needs {bar}at {MIN_SPEEDUP:.2f}× or more)" if faster else "")


def _speed_floor(c: dict[str, Any]) -> float:
    """What the speed must clear: the low end of its interval over the speed stage's rounds, else the point."""
    low = c.get("speedup_vs_fp32_ci_low")
    return low if low is not None else (c.get("speedup_vs_fp32") or 0)


def _speed_text(c: dict[str, Any]) -> str:
    text = f"{c.get('speedup_vs_fp32') or 0:.2f}×"
    if c.get("speedup_vs_fp32_ci_low") is not None:
        text += f" [{c['speedup_vs_fp32_ci_low']:.2f}, {c['speedup_vs_fp32_ci_high']:.2f}]"
    return text


def _not_worse_text(c: dict[str, Any], by_loss: bool) -> str:
    """What the recommended arm's verdicts say: not worse, with the one-sided bound, and equivalent or not."""
    also = "; equivalent as well" if c.get("verdict") == "equivalent" else f"; equivalence: {c.get('verdict')}"
    if by_loss:  # a language model
        return (f"Loss per token and next-token accuracy are not worse than fp32 (Δloss {c['delta_loss']:+.4f} "
                f"nats per token, one-sided upper bound {c.get('delta_loss_bound', c['delta_loss_ci_high']):+.4f}"
                f"{also})")
    return (f"Accuracy and loss are not worse than fp32 (Δaccuracy {c['delta_accuracy_pp']:+.2f} pp, one-sided "
            f"lower bound {c.get('delta_accuracy_pp_bound', c['delta_accuracy_pp_ci_low']):+.2f} pp{also})")


def rank_hint(arm: str, c: dict[str, Any]) -> str | None:
    """For an arm shown *worse* than fp32 with every value finite (nothing overflowed for the report to name) that
    can keep modules in float32: the command that ranks which module to keep in float32, and the one that finds and
    confirms the set."""
    a = get_arm(arm)
    if c.get("status") != "ok" or "worse" not in (c.get("not_worse"), c.get("loss_not_worse"),
                                                  c.get("accuracy_not_worse")):
        return None
    if not a.low_precision or no_islands(a):
        return None
    return (f"{arm} is worse than fp32 with every value finite: `ampbench sensitivity {arm}` ranks the modules to "
            f"keep in float32 (docs/finding-the-layer.md), and `ampbench fix {arm}` finds the set that makes it not "
            "worse, confirmed on fresh seeds (docs/which-part-needs-float32.md)")


def fp32_modules_setting(modules: list[str]) -> str:
    """The ``-S`` setting that keeps ``modules`` in float32."""
    listed = ", ".join(f'"{m}"' for m in modules)  # quoted: YAML would read a Sequential's "2" as a number
    return f"train.fp32_modules=[{listed}]"


def fix_line(modules: list[str]) -> str:
    """The rerun that keeps ``modules`` in float32 (train.fp32_modules), as a user types it."""
    return f".venv/bin/dvc exp run --temp -S '{fp32_modules_setting(modules)}'"


def float32_fix(culprit: dict[str, Any], arm: str) -> str | None:
    """The rerun that keeps the first non-finite module in float32, where it can help: a module of the model (not
    the task's loss, not a replay that stayed finite) in an arm that computes in 16 or 8 bits. The fp32 and tf32
    arms already compute in float32 (train.fp32_modules changes nothing there), so they are never told to."""
    if not get_arm(arm).low_precision or culprit.get("phase") in ("loss", "none"):
        return None
    return fix_line([culprit["module"]])


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


def no_effect(flops: dict[str, Any] | None, policy: dict[str, Any]) -> bool:
    """An autocast arm (``policy``: what ran) whose counted step (``flops``) ran (almost) nothing in 16 bits:
    autocast had no effect."""
    return bool(flops and flops["total"] and policy.get("autocast_dtype", "off") != "off"
                and flops["low_precision_share"] < NO_EFFECT_SHARE)


def cpu_note(flags: str) -> str:
    """The report's note on a CPU run, from the 16-bit instructions this CPU reports (``runtime.hardware.cpu_info``'s
    comma-separated ``cpu_16bit_flags``, or "none"): what bf16 and fp16 autocast can use here."""
    have = set(flags.split(",")) - {"none"}
    bf16 = " and ".join(f.upper() for f in sorted({"avx512_bf16", "amx_bf16"} & have))
    fp16 = " and ".join(f.upper() for f in sorted({"avx512_fp16", "amx_fp16"} & have))
    bf16_text = (f"it has {bf16}, so bf16 autocast runs native kernels for matmuls and convolutions (other ops "
                 "still convert to and from fp32)" if bf16 else
                 "it lacks AVX512-BF16 and AMX-BF16, so bf16 autocast is emulated through fp32 and often slower "
                 "than fp32")
    fp16_text = (f"it has {fp16}, though PyTorch's CPU fp16 kernels are few, so fp16 autocast is often still "
                 "slower than fp32" if fp16 else
                 "it lacks AVX512-FP16 and AMX-FP16, so fp16 autocast is emulated and usually several times slower")
    return (f"CPU run. This CPU's 16-bit instructions: {flags}. bf16: {bf16_text}; fp16: {fp16_text}. "
            "Mixed-precision speed-ups are mainly a GPU tensor-core effect. Memory on CPU is the process's peak RSS "
            "(imports included). Speeds are reported as measured.")
