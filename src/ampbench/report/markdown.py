"""reports/report.md. Its first screen answers the question — may I switch? — with the recommendation, then one
table (arm, not worse?, Δ of the deciding metric [CI], speed × fp32 [CI], time to fp32's quality, memory × fp32,
what would decide) and the code that adopts a recommended arm; everything else is said once, below the Details
heading (``details.py``, ``numerics.py``).

Only rendering: the numbers come from ``verdict/`` (one ``ArmReport`` per arm, the merged comparison and speed rows),
the recommendation and each arm's reason from ``advice.py``; the evaluate stage writes the file.
"""

from __future__ import annotations

from typing import Any

from ampbench.config.arms import BASELINE
from ampbench.config.records import ModelRecord
from ampbench.report import details
from ampbench.report.advice import Recommendation, what_would_decide
from ampbench.report.context import RunContext
from ampbench.report.numerics import numerics_lines, short_count
from ampbench.verdict.comparison import ArmReport
from ampbench.verdict.quality import text as quality_text


def model_line(model: ModelRecord) -> str:
    """The model's identity in words: name, arguments, parameters, FLOPs per sample."""
    args = ", ".join(f"{k}={v}" for k, v in model.args.items())
    width = f", width {model.width}" if model.width is not None else ""
    return (f"`{model.name}`{f' ({args})' if args else ''}{width}: {short_count(model.parameters)} parameters, "
            f"{short_count(model.flops_per_sample)} FLOPs per sample (forward)")


def markdown_report(arms: list[ArmReport], comparison: dict[str, dict], context: RunContext,
                    rec: Recommendation) -> str:
    """The report: the recommendation's headline and the first table (``first_table``), the code that adopts a
    recommended arm, the ``ampbench fix`` searches of this run, then the details: model and method, the full table,
    the reasons, the plans, throughput, what ran, the numerics. ``comparison``: the merged comparison and speed rows
    per arm."""
    lines = ["# ampbench: mixed precision vs strict fp32", "", rec.headline, "",
             *sequential_lines(context), *first_table(arms, comparison, context, rec)]
    if rec.code:
        framework = context.model is not None and context.model.kind in ("lightning", "hf_trainer")
        lines += ["", "In your Trainer:" if framework else "In your own training step:", "", "```python", rec.code,
                  "```"]
    lines += list(context.searches)
    lines += ["", "## Details", "", f"Model {model_line(context.model)}.", "", details.method(context), ""]
    lines += details.full_table(arms, comparison, context)
    lines += details.reasons(arms, context)
    lines += details.plans(arms, comparison, context)
    lines += details.throughput(arms, comparison)
    lines += details.ran_lines(arms)
    lines += numerics_lines(arms, comparison)
    if context.note:
        lines += ["", context.note]
    return "\n".join(lines) + "\n"


def sequential_lines(context: RunContext) -> list[str]:
    """A sequential comparison's look, why it stopped or goes on, where each arm decided, and what its levels mean
    (nothing for the fixed design)."""
    if context.looks is None:
        return []
    o, d = context.looks.outcome, context.looks.design
    where = "; ".join(f"{arm} {'at ' + str(at) + ' seeds' if at else 'undecided'}" for arm, at in o.decided_at.items())
    alpha = 100 * (1 - d.confidence)
    examples, seeds = (100 * (1 - c) / 2 for c in (o.look.decide_confidence, o.look.seed_decide_confidence))
    return [f"**Seeds until decided** ({'stopped' if o.stopped else 'going on'}): {o.reason}. Decided: {where}. "
            f"Looks from {d.min_seeds} to {d.max_seeds} seeds, {d.spending.replace('_', '–')} alpha spending: each "
            f"look's one-sided bounds leave less than a single look's {alpha:g}% on each side, here {examples:.2f}% "
            f"for the examples' interval and {seeds:.2f}% for the seeds' t interval (each exact for its own "
            f"statistic), so that over every look false *not worse* and *equivalent* verdicts stay at {alpha:g}% "
            f"and the intervals cover at {100 * d.confidence:g}%; an arm's verdicts are those of the look that "
            "decided it (docs/verdict.md#seeds-until-decided).", ""]


FIRST_TABLE_COLUMNS = ("arm", "not worse?", "Δ [CI]", "speed × fp32 [CI]", "time to fp32's quality × fp32",
                       "memory × fp32", "what would decide")


def first_table(arms: list[ArmReport], comparison: dict[str, dict], context: RunContext,
                rec: Recommendation) -> list[str]:
    """One row per arm, the columns of ``FIRST_TABLE_COLUMNS`` (Δ: of the deciding metric, with its two-sided
    interval); a skipped or diverged arm says why in the last column."""
    conf = int(round(100 * context.confidence))
    delta = f"Δloss, nats/token [{conf}% CI]" if context.by_loss else f"Δaccuracy, pp [{conf}% CI]"
    head = [delta if c == "Δ [CI]" else c for c in FIRST_TABLE_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in arms:
        name = f"{a.arm} (ablation)" if a.ablation else a.arm
        if not a.ran:
            lines.append(f"| {name} | **{a.status}** | — | — | — | — | {a.skipped_reason} |")
            continue
        c: dict[str, Any] = comparison[a.arm]
        d = ("—" if a.arm == BASELINE else details.with_ci(c, "delta_loss", "+.4f") if context.by_loss
             else details.with_ci(c, "delta_accuracy_pp", "+.2f"))
        lines.append(f"| {name} | **{c['not_worse']}** | {d} | {details.speed_cell(c)} | {quality_text(a.quality)} "
                     f"| {details.fmt(c.get('memory_vs_fp32'), '.2f', '×')} "
                     f"| {what_would_decide(a.arm, c, rec, context)} |")
    return lines
