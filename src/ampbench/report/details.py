"""The report's details, below its first screen: how the comparison was made, the full table, each verdict's
reason, the plans that would decide the undecided ones, throughput, and what ran per arm. Only rendering;
``markdown.py`` puts them together, ``numerics.py`` adds the numerics.
"""

from __future__ import annotations

from typing import Any, Callable

from ampbench.config.arms import BASELINE
from ampbench.config.records import ArmSummary
from ampbench.report.advice import input_bound
from ampbench.report.context import RunContext
from ampbench.report.plans import plan_lines
from ampbench.runtime import memory
from ampbench.speed.ratios import rounds_text
from ampbench.verdict.comparison import ArmReport
from ampbench.verdict.quality import text as quality_text


def fmt(x, spec: str, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def with_ci(c: dict[str, Any], key: str, spec: str) -> str:
    """``c[key]`` with its interval ``[key_ci_low, key_ci_high]`` when there is one."""
    ci = "" if c.get(f"{key}_ci_low") is None else f" [{c[f'{key}_ci_low']:{spec}}, {c[f'{key}_ci_high']:{spec}}]"
    return f"{fmt(c.get(key), spec)}{ci}"


def speed_cell(c: dict[str, Any]) -> str:
    """× fp32 with its interval over the speed stage's rounds (and *unstable* when wide)."""
    text = fmt(c.get("speedup_vs_fp32"), ".2f", "×")
    if c.get("speedup_vs_fp32_ci_low") is not None:
        text += f" [{c['speedup_vs_fp32_ci_low']:.2f}, {c['speedup_vs_fp32_ci_high']:.2f}]"
    return text + (" unstable" if c.get("speed_unstable") else "")


def method(context: RunContext) -> str:
    """The paragraph that says what was compared, how the intervals are made and what each verdict means."""
    seeds, conf = context.seeds, int(round(100 * context.confidence))
    margins, noise = context.margins, context.noise
    acc_margin = f"±{100 * margins.accuracy:.2f} pp" + (" (auto: fp32's seed sd)" if margins.accuracy_rule == "auto"
                                                         else "")
    loss_margin = f"±{margins.loss:.3f} nats" + (" (auto)" if margins.loss_rule == "auto" else "")
    floor = ("fp32's seed-to-seed variation: one seed only, unknown" if noise.accuracy_sd is None else
             f"fp32's own seed-to-seed variation: test accuracy sd {100 * noise.accuracy_sd:.2f} pp, test loss sd "
             f"{noise.loss_sd:.4f} nats; two fp32 seeds disagree on {100 * noise.disagreement:.2f}% of test "
             "predictions")
    run = (f"Data `{context.dataset}`, device `{context.device_name}`, {len(seeds)} seed(s) {seeds}, "
           f"{context.epochs} epoch(s). {''.join(n + ' ' for n in context.data_notes)}Test split. Δ = arm − fp32 of "
           "the same seed on the same test ")
    if context.by_loss:
        return (f"{run}sequences. The {conf}% intervals of Δloss (nats per token) and Δ next-token accuracy use every "
                "seed's per-sequence paired outcomes (sequences and seeds as clusters; docs/verdict.md). The verdict "
                f"is the loss's: *equivalent* when both one-sided {conf}% bounds lie within ±{margins.loss:.3f} nats "
                f"per token{' (auto)' if margins.loss_rule == 'auto' else ''} (two one-sided tests; next-token "
                f"accuracy: {acc_margin}; the ends included), *worse*/*better* when wholly outside, *invalid* when a "
                f"value is not finite, else *inconclusive*. {not_worse_sentence(conf)} "
                f"{floor.replace('predictions', 'next-token predictions')}.")
    return (f"{run}examples. The {conf}% intervals of Δaccuracy and Δloss use every seed's "
            "per-example paired outcomes (a score interval on the discordant pairs, widened when the same examples "
            "flip in every seed, joined with the Student-t interval over the per-seed differences; docs/verdict.md)."
            f" Verdict: *equivalent* when both one-sided {conf}% bounds lie within the margin (two one-sided tests; "
            f"accuracy {acc_margin}, loss {loss_margin}; the ends included), *worse*/*better* when wholly outside, "
            f"*invalid* when a value is not finite, else *inconclusive*. {not_worse_sentence(conf)} {floor}.")


def not_worse_sentence(conf: int) -> str:
    """What *not worse* means: the question the recommendation asks (non-inferiority)."""
    return (f"*Not worse* asks whether anything degraded, and decides the recommendation: the one-sided {conf}% "
            "bound on the bad side (accuracy's lower, loss's upper) is within the margin, so a better arm is not "
            "worse; *worse* when even the other bound is past it.")


def reasons(arms: list[ArmReport], context: RunContext) -> list[str]:
    """Each verdict's reason, the deciding metric first, under the task's names."""
    first, second = ("loss", "accuracy") if context.by_loss else ("accuracy", "loss")
    lines = ["", "Why each verdict:", ""]
    for a in arms:
        if a.ran and a.arm != BASELINE:
            said = [(context.labels[m].capitalize(), a.stats.of(m)) for m in (first, second)]
            lines.append(f"- **{a.arm}**: " + " ".join(
                f"{label}: not worse? **{v.not_worse}**: {v.not_worse_reason}; equivalent? {v.verdict}: "
                f"{v.verdict_reason}." for label, v in said))
    return lines


def plans(arms: list[ArmReport], comparison: dict[str, dict], context: RunContext) -> list[str]:
    """What would decide each undecided verdict: the sample-size plans (``plans.plan_lines``)."""
    planned = [(a.arm, comparison[a.arm]["plans"]) for a in arms
               if a.ran and a.arm != BASELINE and comparison[a.arm].get("plans")]
    if not planned:
        return []
    lines = ["", "What would decide the verdicts that did not (sample-size plans: the power of the verdicts' own "
             "procedure under the seed and example variation this run showed; docs/verdict.md):", ""]
    for arm, arm_plans in planned:
        lines += [f"- {line}" for line in plan_lines(arm, arm_plans, context)]
    return lines


def full_table(arms: list[ArmReport], comparison: dict[str, dict], context: RunContext) -> list[str]:
    """Every column of every arm: the task's columns, then speed, time to quality, memory and skipped steps."""
    conf = int(round(100 * context.confidence))
    if context.by_loss:
        def loss_row(a: ArmReport, c: dict[str, Any]) -> str:
            base = a.arm == BASELINE
            return (f"**{c['not_worse']}** | {c['verdict']} | {'—' if base else with_ci(c, 'delta_loss', '+.4f')} "
                    f"| {'—' if base else c['vs_seed_noise']} | {c['test_loss']:.4f} "
                    f"| {fmt(c.get('perplexity'), '.3f')} | {100 * c['test_accuracy']:.2f}% | {c['accuracy_verdict']} "
                    f"| {'—' if base else with_ci(c, 'delta_accuracy_pp', '+.2f')} "
                    f"| {100 * c['agreement_vs_fp32']:.2f}% | {c['kl_vs_fp32']:.2e}")

        labels = context.labels
        columns = (f"not worse? | equivalent? | Δloss, nats/token [{conf}% CI] | vs fp32 seed noise "
                   f"| {labels['loss']} | perplexity | {labels['accuracy']} | accuracy verdict "
                   "| Δaccuracy, pp [CI] | agreement | KL(fp32‖arm)")
        return _arm_table(arms, comparison, columns, loss_row)

    def row(a: ArmReport, c: dict[str, Any]) -> str:
        base = a.arm == BASELINE
        delta = "—" if base else with_ci(c, "delta_accuracy_pp", "+.2f")
        flips = "—" if base else f"{c['fp32_right_arm_wrong']} / {c['arm_right_fp32_wrong']} of {c['paired_examples']}"
        dloss = f"{c['delta_loss']:+.4f}" if base else with_ci(c, "delta_loss", "+.4f")
        return (f"**{c['not_worse']}** | {c['verdict']} | {delta} | {flips} | {'—' if base else c['vs_seed_noise']} "
                f"| {100 * c['test_accuracy']:.2f}% | {c['loss_verdict']} | {dloss} "
                f"| {100 * c['agreement_vs_fp32']:.2f}% | {c['kl_vs_fp32']:.2e} | {c['delta_ece']:+.4f}")

    columns = (f"not worse? | equivalent? | Δaccuracy, pp [{conf}% CI] | right only in fp32 / only in arm "
               "| vs fp32 seed noise | test accuracy | loss verdict | Δloss [CI] | agreement | KL(fp32‖arm) | ΔECE")
    return _arm_table(arms, comparison, columns, row)


def _arm_table(arms: list[ArmReport], comparison: dict[str, dict], columns: str,
               row: Callable[[ArmReport, dict[str, Any]], str]) -> list[str]:
    """A row per arm: ``row(arm, its comparison row)`` gives the task's columns, then speed, memory and skipped
    steps; a skipped or diverged arm says why."""
    header = (f"| arm | {columns} | speed × fp32 | time to fp32 quality × fp32 | speed × tf32 | memory × fp32 "
              "| skipped steps |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for a in arms:
        name = f"{a.arm} (ablation)" if a.ablation else a.arm
        if not a.ran:
            lines.append(f"| {name} | **{a.status}** | {a.skipped_reason} |" + " |" * (header.count(" | ") - 2))
            continue
        c = comparison[a.arm]
        lines.append(f"| {name} | {row(a, c)} | {speed_cell(c)} | {quality_text(a.quality)} "
                     f"| {fmt(c.get('speedup_vs_tf32'), '.2f', '×')} | {fmt(c.get('memory_vs_fp32'), '.2f', '×')} "
                     f"| {c['skipped_steps']} |")
    return lines


def what_ran(trained: ArmSummary, base_state: dict[str, Any] | None) -> list[str]:
    """The optimizer (class and how it writes low-precision weights), the counted bytes of weights, gradients and
    optimizer state, and float8's converted and left-out Linear layers, as phrases for an arm's "what ran" line."""
    parts = []
    opt, state, f8 = trained.optimizer, trained.state_bytes, trained.float8
    if opt:
        parts.append(f"optimizer {opt['optimizer_class']}, {opt['optimizer_rounding']}")
    if state and state.get("per_parameter"):
        vs = (f", {state['total'] / base_state['total']:.2f}× fp32's" if base_state and base_state.get("total")
              else "")
        parts.append(f"weights + gradients + optimizer state {state['per_parameter']:.1f} bytes per parameter "
                     f"({state['total'] / 2**20:,.2f} MiB{vs}; counted tensor by tensor)")
    fw = trained.framework
    if fw:
        seen = {k: ", ".join(fw[k]) for k in ("compute_dtypes", "autocast", "weight_dtypes", "grad_dtypes")}
        parts.append(f"{fw['name']} precision {fw['precision']}: matmuls and convolutions computed in "
                     f"{seen['compute_dtypes'] or 'none seen'} (autocast {seen['autocast']}), weights "
                     f"{seen['weight_dtypes']}, gradients {seen['grad_dtypes']} (read back as it trained)")
    if f8:
        rows = f8["modules"]
        left = [f"{r['module']} ({r['reason']})" for r in rows if not r["converted"]]
        parts.append(f"float8 {f8['recipe']}: {f8['converted']} of {f8['linear_layers']} Linear layers converted ("
                     + ", ".join(r["module"] for r in rows if r["converted"]) + ")"
                     + (f", left out: {', '.join(left[:6])}{' …' if len(left) > 6 else ''}" if left else ""))
    return parts


def ran_lines(arms: list[ArmReport]) -> list[str]:
    """What ran per arm, read back from torch: the policy, then ``what_ran``."""
    lines = ["", "What ran per arm (read back from torch):", ""]
    base_state = next((a.trained.state_bytes for a in arms if a.arm == BASELINE and a.ran), None)
    for a in arms:
        if a.ran:
            ran = ", ".join(f"{k}={v}" for k, v in a.trained.policy.items() if k != "precision")
            lines.append(f"- **{a.arm}**: {ran}" + "".join(f"; {part}" for part in what_ran(a.trained, base_state)))
    return lines


def throughput(arms: list[ArmReport], comparison: dict[str, dict]) -> list[str]:
    """Throughput (interleaved and training-time), peak memory and input wait per arm; a line for each unstable
    or input-bound arm."""
    interleaved = comparison.get(BASELINE, {}).get("speed_source") == "interleaved"
    lines = ["", ("Speed: every arm timed in one process by the speed stage, interleaved round by round (A B C, "
                  "C B A, …), so other load on the machine lands on every arm alike: the median over rounds of each "
                  "round's ratio to fp32, with a distribution-free interval over rounds. Training-time throughput "
                  "(each arm in its own process, at its own time) is the secondary figure." if interleaved else
                  "Speed from training time: each arm timed in its own process at its own time, so other load on the "
                  "machine can land on one arm and not another (no reports/interleaved.json: run the speed stage)."),
             "", "Time to fp32 quality: the optimizer steps until an arm's validation loss first reaches fp32's final "
             "validation loss of the same seed (within the loss margin), × its time per step above, as a ratio to "
             "fp32's own (< 1: sooner; the median over seeds, or how many seeds never got there; per seed in "
             "details.json, curves in figures/time_to_quality.png and `dvc plots show`).",
             "", "Throughput, peak memory, and the share of training time spent waiting for the next batch:", ""]
    for a in (a for a in arms if a.ran):
        c = comparison[a.arm]
        wait, path = c.get("input_wait_share"), a.trained.input_path
        during = (f" (during training {c['train_samples_per_s']:,.0f}, "
                  f"{fmt(c.get('train_speedup_vs_fp32'), '.2f', '×')} fp32)" if interleaved else "")
        lines.append(f"- **{a.arm}**: {fmt(c.get('samples_per_s'), ',.0f')} samples/s{during}, peak memory "
                     f"{fmt(c.get('peak_memory_mb'), ',.0f', ' MB')}" + (f", input {path}" if path else "")
                     + (f", waiting for batches {100 * wait:.1f}% of the time" if wait is not None else ""))
        if c.get("speed_unstable"):
            lines.append(f"- **{a.arm}'s speed is unstable**: its interval over rounds is wider than ±10% of its "
                         f"median; {rounds_text(a.speed.disagreeing_rounds, len(a.speed.ratios))} (timing noise "
                         "from other load, frequency scaling or a shared host): more speed.rounds, or a quieter "
                         "machine, narrow it")
    kinds = {a.trained.hardware.device_type for a in arms if a.ran}
    lines += [f"- Peak memory n/a: {memory.why_not(kind)}." for kind in sorted(kinds) if not memory.per_arm(kind)]
    for arm in input_bound(comparison):
        share = comparison[arm]["input_wait_share"]
        lines.append(f"- **{arm} is input-bound**: it waited for batches {100 * share:.0f}% of its training time, so "
                     "its speed shows the input pipeline, not its precision. More "
                     "train.loader_workers, train.data_on_device: true (if it fits) or a larger batch help.")
    return lines
