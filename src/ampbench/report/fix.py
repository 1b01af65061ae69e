"""What ``ampbench fix`` says: the answer and its ``-S`` line, what the fix costs, and the search's record
(reports/fix/<arm>.md and the search's MLflow run): what was ranked, what was tried, why it stopped; and report.md's
section on the searches (``report_section``)."""

from __future__ import annotations

import json

from ampbench.report.advice import fix_line
from ampbench.verdict.search import NOT_WORSE, Answer


def cost_lines(arm: str, cost: dict) -> list[str]:
    """The fix's cost in words."""
    def x(row: dict) -> str:
        if row.get("speedup_vs_fp32") is None:
            return "n/a"
        low, high = row["speedup_vs_fp32_ci"]
        return f"{row['speedup_vs_fp32']:.2f}× [{low:.2f}, {high:.2f}]" + (" unstable" if row["unstable"] else "")
    speed = cost["speed"]
    lines = [f"Speed × fp32, timed together (speed.* sizes): {arm} as it was {x(speed['as it was'])}, with the fix "
             f"{x(speed['with the fix'])}."]
    if cost["kept_flops_share"] is not None:
        lines.append(f"The modules kept in float32 take {100 * cost['kept_flops_share']:.1f}% of {arm}'s matmul and "
                     "convolution FLOPs (one training step counted by dtype).")
    return lines


def against(goal: str) -> str:
    """The verdict asked for, against fp32, in words."""
    return "not worse than fp32" if goal == NOT_WORSE else "equivalent to fp32"


def answer_lines(arm: str, answer: Answer, budget: int) -> list[str]:
    """What the search found, in words, with the -S line to adopt when the confirmation passes."""
    fp32 = len(answer.confirmation.seeds) if answer.confirmation else 0
    spent = f"{answer.spent} of {budget} trainings of {arm} spent" + (f" (and {fp32} of fp32 on the fresh seeds)"
                                                                      if fp32 else "")
    if answer.modules is None:
        best = answer.best
        closest = (f"; the closest: {json.dumps(list(best.modules))} kept in float32 ({best.verdict})"
                   if best is not None else "")
        return [f"No set of modules found: {answer.stopped}{closest}. {spent}.",
                f"Stay on fp32 for what {arm} would train, or try another arm."]
    lines = [f"The search ended with {json.dumps(list(answer.modules))}, {answer.stopped}. {spent}."]
    conf = answer.confirmation
    if answer.confirmed:
        lines += [f"Confirmed on fresh seeds {list(conf.seeds)}: {arm} with them in float32 is {against(conf.goal)}. "
                  "Adopt it:", f"  {fix_line(list(answer.modules))}"]
    else:
        lines += [f"Not confirmed: on fresh seeds {list(conf.seeds)} it is {conf.verdict}, so no fix is reported (the "
                  "search's pass may have been luck among its trials); more seeds (train.seeds) give both more power"]
    return lines


def deciding(stats) -> tuple[str, float, float | None]:
    """The deciding difference's unit, value and one-sided bound: pp of accuracy, or nats of loss per token."""
    v, scale = stats.decided, 100 if stats.deciding == "accuracy" else 1
    return ("pp" if scale == 100 else "nats"), v.interval.mean * scale, None if v.bound is None else v.bound * scale


def interval_text(stats) -> str:
    """The deciding difference and its one-sided bound, as the report prints them."""
    unit, mean, bound = deciding(stats)
    digits = 2 if unit == "pp" else 4
    shown = f"Δ{stats.deciding} {mean:+.{digits}f} {unit}"
    return shown + (f", one-sided bound {bound:+.{digits}f} {unit}" if bound is not None else "")


def record(arm: str, opening: str, ranking: list[str], tried: list[str], said: list[str]) -> str:
    """The search's record in Markdown: ``opening`` (the run, the seeds, the budget), the ranking's table, each
    trial's line as it was said, and the answer's lines (``said``: answer and cost)."""
    return "\n".join([f"# Which part of {arm} needs float32", "", *_body(opening, ranking, tried, said, "##")])


def _body(opening: str, ranking: list[str], tried: list[str], said: list[str], level: str) -> list[str]:
    return [opening, "", f"{level} Ranked", "", *ranking, "", f"{level} Tried", "", *[f"- {line}" for line in tried],
            "", f"{level} Why it stopped, and the answer", "", *said, ""]


def report_section(records: list[dict], identity: str, fp32_modules: list[str]) -> list[str]:
    """report.md's "Which part needs float32": each ``ampbench fix`` record (reports/fix/*.json) of this run in
    full; one line for a record of this run's search whose set the run now keeps (``fp32_modules``), and for one of
    another run (``identity``: ``stages/fix_record.identity``). Nothing without records."""
    if not records:
        return []
    lines = ["", "## Which part needs float32", ""]
    for r in sorted(records, key=lambda r: (r["arm"], r["goal"] != NOT_WORSE)):
        command = f"`ampbench fix {r['arm']}{'' if r['goal'] == NOT_WORSE else ' --until equivalent'}`"
        where = f"[fix/{r['record']}](fix/{r['record']})"
        if r["identity"] != identity:
            lines += [f"{command} ({where}) searched another run: its data, code or train params differ from this "
                      "run's. Run it again on this one.", ""]
        elif fp32_modules:
            kept = json.dumps(list(fp32_modules))
            same = sorted(r["modules"] or []) == sorted(fp32_modules)
            found = (("the set it found and confirmed " + against(r["goal"]) if r["confirmed"] else
                      "the set it ended with, not confirmed on fresh seeds") if same else "not the set it ended with")
            lines += [f"This run keeps {kept} in float32: {found} on this run without train.fp32_modules "
                      f"({command}, {where}). The verdicts above are this run's own.", ""]
        else:
            lines += [f"### {command}", "", *_body(r["opening"], r["ranking"], r["tried"], r["said"], "####"),
                      f"The search's record: {where}.", ""]
    return lines[:-1]
