"""The policy behind the report's advice: when an arm may be recommended, what limits it, and the line that fixes
a diverged one. Only decisions here; ``report.py`` renders them.
"""

from __future__ import annotations

import math
from typing import Any

from ampbench.config.arms import BASELINE, TF32_REFERENCE, adoption_code
from ampbench.config.arms import get as get_arm
from ampbench.verdict.comparison import ArmReport, decided_by_loss

HEALTHY_SKIP_SHARE = 0.02  # a scaler that skips more optimizer steps than this is fighting overflow, not settling
MIN_SPEEDUP = 1.05  # smaller throughput gains are within timing noise: the interval's low end must clear it
INPUT_BOUND_SHARE = 0.2  # an arm that waits for batches this share of its training time is input-bound
NO_EFFECT_SHARE = 0.05  # an autocast arm with less of its matmul/conv/attention FLOPs in 16 bits did not use them


def _why_not(arm: str, c: dict[str, Any], task=None) -> str | None:
    """Why ``arm`` cannot be recommended (None: it can, speed aside): it must be *not worse* than fp32 on both
    metrics (the tutorial's "confirm nothing degraded"), the deciding one first, under the task's names for them."""
    if c["status"] != "ok":
        return f"{arm}: {c['status']}"
    acc, loss = getattr(task, "accuracy_label", "accuracy"), getattr(task, "loss_label", "loss")
    checks = (((loss, "not_worse"), (acc, "accuracy_not_worse")) if decided_by_loss(task)
              else ((acc, "not_worse"), (loss, "loss_not_worse")))
    why = [f"{what} {c.get(key, 'not judged')}" for what, key in checks if c.get(key) != "not worse"]
    steps, skipped = c.get("optimizer_steps") or 0, c.get("skipped_steps") or 0
    if skipped > HEALTHY_SKIP_SHARE * steps:
        why.append(f"its scaler skipped {skipped} of {steps} optimizer steps")
    return f"{arm}: {' and '.join(why)}" if why else None


def better_than_seed_noise(arm: str, c: dict[str, Any], task=None) -> str | None:
    """A warning when a 16-bit arm beats fp32 by more than fp32's own seed-to-seed variation: rounding alone
    rarely helps that much, so a difference that size is worth understanding before it is celebrated."""
    if c.get("status") != "ok" or c.get("vs_seed_noise") != "beyond":
        return None
    by_loss = decided_by_loss(task)
    delta = c.get("delta_loss") if by_loss else c.get("delta_accuracy_pp")
    if delta is None or (delta >= 0 if by_loss else delta <= 0):
        return None
    shown = f"Δloss {delta:+.4f} nats" if by_loss else f"Δaccuracy {delta:+.2f} pp"
    return (f"{arm} is better than fp32 by more than fp32's own seed-to-seed variation ({shown}): worth "
            "understanding (an under-trained or differently regularised fp32 run, a data or evaluation difference) "
            "before it is counted as a gain")


def more_seeds(seeds: list[int]) -> list[int]:
    """Twice as many seeds as ran (at least 3), keeping those that ran: the t quantile and the standard error of
    the per-seed mean both shrink."""
    out, k = list(seeds), 0
    while len(out) < max(2 * len(seeds), 3):
        if k not in out:
            out.append(k)
        k += 1
    return out


def seeds_line(count: int, ran: list[int]) -> str:
    """The rerun with ``count`` seeds, keeping those that ran."""
    seeds, k = list(ran), 0
    while len(seeds) < count:
        if k not in seeds:
            seeds.append(k)
        k += 1
    return f".venv/bin/dvc exp run --temp -S 'train.seeds=[{','.join(map(str, seeds))}]'"


def examples_setting(needed: int, now: int, context: dict[str, Any]) -> tuple[str | None, str]:
    """The ``-S`` settings that give ``needed`` test examples (sequences, for a language model) where the
    evaluation had ``now``: a lifted prepare.max_test or a larger prepare.test_fraction; (None, why) when the data
    set cannot give that many, or ("", "") when it is not known how its test split was made."""
    prep, test = context.get("prepare") or {}, context.get("test") or {}
    size, available, source = test.get("size"), test.get("available"), test.get("from")
    if not (size and available and source and now):
        return None, ""
    uncapped = now * available / size  # what the test split holds without prepare.max_test's cut
    if needed <= uncapped:
        return f"-S prepare.max_test={math.ceil(needed * size / now)}", ""
    if source == "publisher":
        return None, f"the data set's own test split has {int(uncapped):,}"
    fraction = math.ceil(100 * prep["test_fraction"] * needed / uncapped) / 100
    if fraction >= 1 - prep["val_fraction"]:
        return None, f"the whole data set holds about {round(uncapped / prep['test_fraction']):,}"
    if fraction >= 0.5:  # prepare.test_fraction's bound: at least half the data stays for training and validation
        return None, f"that is {fraction:.0%} of the data set, and prepare.test_fraction stays below 50%"
    if fraction + prep["val_fraction"] > 0.8:
        return None, f"{needed:,} would leave less than a fifth of the data set to train on"
    capped = prep.get("max_test") is not None and available > size
    return f"-S prepare.test_fraction={fraction:g}" + (" -S prepare.max_test=null" if capped else ""), ""


def plan_lines(arm: str, plans: list[dict[str, Any]], context: dict[str, Any]) -> list[str]:
    """One line per plan (``plan.py``): the test examples or seeds that give 80% power to decide, each with the
    rerun that runs it."""
    by_loss = decided_by_loss(context.get("task"))
    unit = "test sequences" if by_loss else "test examples"
    lines = []
    for p in plans:
        s, n = p["seeds_now"], p["examples_now"]
        delta = f"{p['delta']:+.4f} nats" if by_loss else f"{100 * p['delta']:+.2f} pp"
        at = f"if the true difference is the observed {delta}" if p["assumed"] == "observed" else \
            "if the arms did not differ at all"
        options = []
        if p["examples"] is None:
            options.append(f"no number of {unit} at these {s} seed{'s' * (s != 1)} ({p['why_not_examples']})")
        elif p["examples"] <= n:
            options.append(f"the {n:,} {unit} that ran should already give it (this result was the unlucky 1 in "
                           f"{1 / max(1 - p['power_now'], 1e-9):.0f})")
        else:
            setting, why = examples_setting(p["examples"], n, context)
            how = f": `.venv/bin/dvc exp run --temp {setting}`" if setting else (f", but {why}" if why else "")
            options.append(f"{p['examples']:,} {unit} at these {s} seed{'s' * (s != 1)}{how}")
        if p["seeds"] is None:
            options.append(f"no number of seeds ({p['why_not_seeds']})")
        else:
            options.append(f"{p['seeds']} seeds at these {n:,} {unit}: `{seeds_line(p['seeds'], context['seeds'])}`")
        caveat = "; planned from 1 seed, which cannot tell seed from example variation" if s == 1 else ""
        lines.append(f"{arm}, *{p['question']}* with 80% power {at} (power now {p['power_now']:.0%}): "
                     f"{'; or '.join(options)}{caveat}")
    return lines


def input_bound(merged: dict[str, dict]) -> list[str]:
    """The arms that waited for their next batch at least INPUT_BOUND_SHARE of their training time."""
    return [a for a, c in merged.items() if (c.get("input_wait_share") or 0) >= INPUT_BOUND_SHARE]


def recommendation(merged: dict[str, dict], context: dict[str, Any]) -> tuple[str, str]:
    """(one line, code): the fastest arm that is *not worse* than fp32 on accuracy and loss, whose scaler stayed
    healthy and which is measurably faster than fp32, with its speed and memory gain and the code that adopts it;
    or "stay on fp32" and why. A better arm can be recommended; one better by more than fp32's seed noise carries
    a warning. ``merged``: comparison and speed rows per arm."""
    task = context.get("task")
    candidates = {a: c for a, c in merged.items() if a != BASELINE and not c.get("ablation")}
    reasons, fit = [], []
    for arm, c in candidates.items():
        why = _why_not(arm, c, task)
        if why:
            reasons.append(why)
        elif _speed_floor(c) < MIN_SPEEDUP:
            reasons.append(_too_slow(arm, c))
        else:
            fit.append(arm)
    cpu = (" Measured on a CPU: mixed-precision speed on a GPU is a different story; rerun there before "
           "deciding." if context.get("device_type") == "cpu" else "")
    bound = input_bound(merged)
    if bound:
        cpu += (f" Input-bound ({', '.join(bound)}): the speed ratios show the input pipeline more than the "
                "precision.")
    warnings = "".join(f" Note: {w}." for w in (better_than_seed_noise(a, c, task) for a, c in candidates.items())
                       if w)
    if fit:
        # Faster to fp32's quality first (an arm that steps faster but needs more steps gains less), then speed.
        best = min(fit, key=lambda a: (merged[a].get("time_to_fp32_quality_vs_fp32") or float("inf"),
                                       -(merged[a]["samples_per_s"] or 0)))
        c = merged[best]
        vs_tf32 = (f", {c['speedup_vs_tf32']:.2f}× tf32's" if c.get("speedup_vs_tf32") and best != TF32_REFERENCE
                   else "")
        memory = f", {c['memory_vs_fp32']:.2f}× its peak memory" if c.get("memory_vs_fp32") else ""
        line = (f"**Recommendation: switch to {best}.** {_not_worse_text(c, task)}, the loss scaler stayed healthy, "
                f"and it runs at {_speed_text(c)} fp32's samples/s{vs_tf32}{memory}{_quality_text(c)}.{warnings} "
                f"In your own training step:{cpu}")
        return line, adoption_code(get_arm(best), "cuda" if context.get("device_type") != "cpu" else "cpu")
    inconclusive = any("inconclusive" in (c.get("not_worse"), c.get("loss_not_worse"), c.get("accuracy_not_worse"))
                       for c in candidates.values())
    seeds = more_seeds(context.get("seeds") or [0, 1, 2])
    more = (f" More seeds narrow the intervals: `dvc exp run --temp -S 'train.seeds=[{','.join(map(str, seeds))}]'`."
            if inconclusive else "")
    planned = [(a, c["plans"][0]) for a, c in sorted(candidates.items(), key=lambda ac: -(ac[1].get(
        "samples_per_s") or 0)) if c.get("plans")]
    if planned:  # the fastest undecided arm's first plan: what would decide it (the report lists every plan)
        more = f" To decide: {plan_lines(planned[0][0], [planned[0][1]], context)[0]}."
    why = "; ".join(reasons) if reasons else "no mixed-precision arm was trained"
    return (f"**Recommendation: stay on fp32.** No arm is both not worse and faster ({why}).{more}{warnings}{cpu}",
            "")


def _quality_text(c: dict[str, Any]) -> str:
    """What the recommended arm's time to fp32's quality says, when it was measured."""
    ratio, reached = c.get("time_to_fp32_quality_vs_fp32"), c.get("seeds_reaching_fp32_quality")
    if ratio is not None:
        gain = "sooner" if ratio < 1 else "no sooner: it needs more steps than its speed makes up for"
        return f"; it reaches fp32's validation loss in {ratio:.2f}× fp32's time ({gain})"
    if reached is not None and reached < (c.get("seeds") or 0):
        return f"; but it reached fp32's validation loss in only {reached} of {c['seeds']} seeds"
    return ""


def _too_slow(arm: str, c: dict[str, Any]) -> str:
    """Why a *not worse* arm is not recommended on speed; for one faster than fp32 but not clearly so, the bar it
    missed (1.05× [1.04, 1.06] would otherwise read as met)."""
    bar = "its interval's low end " if c.get("speedup_vs_fp32_ci_low") is not None else ""
    faster = (c.get("speedup_vs_fp32") or 0) >= 1
    return f"{arm}: not worse, but {_speed_text(c)} fp32's samples/s" + (
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


def _not_worse_text(c: dict[str, Any], task) -> str:
    """What the recommended arm's verdicts say: not worse, with the one-sided bound, and equivalent or not."""
    also = "; equivalent as well" if c.get("verdict") == "equivalent" else f"; equivalence: {c.get('verdict')}"
    if decided_by_loss(task):  # a language model
        return (f"Loss per token and next-token accuracy are not worse than fp32 (Δloss {c['delta_loss']:+.4f} "
                f"nats per token, one-sided upper bound {c.get('delta_loss_bound', c['delta_loss_ci_high']):+.4f}"
                f"{also})")
    return (f"Accuracy and loss are not worse than fp32 (Δaccuracy {c['delta_accuracy_pp']:+.2f} pp, one-sided "
            f"lower bound {c.get('delta_accuracy_pp_bound', c['delta_accuracy_pp_ci_low']):+.2f} pp{also})")


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


def cpu_note(flags: str) -> str:
    """The report's note on a CPU run, from the 16-bit instructions this CPU reports (``hardware.cpu_info``'s
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
