"""What the evaluate stage puts into MLflow, built apart from the logging: onto each arm × seed run its test
metrics, the short sortable columns (``test_acc``, ``d_acc_pp``, ``speed_x``) and the arm's verdicts and, when
undecided, its sample-size plan as tags; onto the execution's parent run every arm's numbers as
``<arm>.<metric>``, the baseline's noise and margins once, the verdicts, plans (``plan.<arm>``) and the
recommendation as tags, the evaluate params, the report and figures. ``log_evaluation`` logs them (``tracking``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ampbench import tracking
from ampbench.config.arms import BASELINE
from ampbench.config.layout import ReportFiles
from ampbench.config.params import Params
from ampbench.report.advice import Recommendation
from ampbench.report.context import RunContext
from ampbench.report.plans import plan_lines
from ampbench.runtime.console import log
from ampbench.runtime.files import json_digest
from ampbench.verdict.comparison import ArmReport
from ampbench.verdict.quality import quality_metrics

TAG_CHARS = 5000  # MLflow keeps tag values up to 8,000 characters; a plan or a reason is cut well before


@dataclass(frozen=True)
class SeedRun:
    """One arm × seed run's additions: its id (from summary.json), metrics and tags."""

    arm: str
    seed: int
    run_id: str
    metrics: dict[str, float]
    tags: dict[str, str]


@dataclass(frozen=True)
class ParentRun:
    """The execution's parent run: every arm's numbers, the verdicts and the recommendation, the evaluate params
    (and the digest of them that identifies one evaluation)."""

    metrics: dict[str, float]
    tags: dict[str, str]
    params: dict[str, str]
    key: str


def evaluation_runs(params: Params, tags: dict[str, str], rec: Recommendation, reports: list[ArmReport],
                    comparison: dict[str, dict], speed: dict[str, dict], context: RunContext,
                    data_md5: str) -> tuple[list[SeedRun], ParentRun]:
    """The seed runs (the baseline's first) and the parent run of one evaluation."""
    plans = {arm: " | ".join(plan_lines(arm, row["plans"], context)).replace("`", "")[:TAG_CHARS]
             for arm, row in comparison.items() if row.get("plans")}
    seeds = [run for r in sorted((r for r in reports if r.ran), key=lambda r: r.arm != BASELINE)
             for run in _seed_runs(r, {**comparison[r.arm], **speed[r.arm]}, plans.get(r.arm))]
    flat = {f"{arm}.{k}": v for table in (comparison, speed) for arm, row in table.items() for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    base = next(r for r in reports if r.arm == BASELINE)
    ptags = {**tags, "dvc.data_md5": data_md5, "ampbench.evaluated": "true", "recommendation": rec.plain[:TAG_CHARS],
             "arms": ",".join(params.train.precisions), "model": base.trained.model.name,
             "seeds": ",".join(map(str, params.train.seeds)),
             **{f"verdict.{arm}": row["verdict"] for arm, row in comparison.items()},
             **{f"not_worse.{arm}": row["not_worse"] for arm, row in comparison.items() if "not_worse" in row},
             **{f"plan.{arm}": text for arm, text in plans.items()},
             **{f"{r.status}.{r.arm}": r.skipped_reason[:TAG_CHARS] for r in reports if not r.ran}}
    if context.looks:  # every look of one sequential design shares a group: the params without the seeds
        shared = {**params.to_dict(), "train": {k: v for k, v in params.train.to_dict().items() if k != "seeds"}}
        ptags.update({**context.looks.tags(), "sequential.group": json_digest(shared, 16)})
    evaluate_params = tracking.flatten("evaluate", params.evaluate.to_dict())
    return seeds, ParentRun(flat, ptags, evaluate_params, json_digest(evaluate_params, 24))


def _seed_runs(r: ArmReport, row: dict[str, Any], plan: str | None) -> list[SeedRun]:
    """The runs of one evaluated arm: each seed's test metrics and the arm's verdict tags."""
    tags = {"evaluated": "true", "verdict": row["verdict"], "loss_verdict": row["loss_verdict"],
            "not_worse": row["not_worse"], "loss_not_worse": row["loss_not_worse"]}
    if r.arm != BASELINE:
        decided = r.stats.decided
        tags.update({"verdict_reason": decided.verdict_reason, "vs_seed_noise": decided.vs_seed_noise,
                     "not_worse_reason": decided.not_worse_reason})
        if plan:
            tags["plan"] = plan
    out = []
    for seed, m in r.per_seed.items():
        metrics = {k: v for k, v in m.items() if k not in ("test_accuracy", "delta_accuracy_vs_fp32")}
        metrics.update({"test_acc": round(m["test_accuracy"], 6),
                        "d_acc_pp": round(100 * m["delta_accuracy_vs_fp32"], 4)})
        if row.get("speedup_vs_fp32") is not None:
            metrics["speed_x"] = row["speedup_vs_fp32"]
        metrics.update(quality_metrics(r.quality, seed))
        out.append(SeedRun(r.arm, seed, r.trained.seeds[str(seed)].run_id, metrics, tags))
    return out


def log_evaluation(experiment_id: str, tags: dict[str, str], seed_runs: list[SeedRun], parent: ParentRun,
                   files: ReportFiles) -> None:
    """The rows onto their runs (a seed run missing from this store is said so and left out), then the parent
    run, created or found by the evaluation's key, with the reports and figures as artifacts."""
    run_ids = []
    for run in seed_runs:
        if not tracking.run_exists(run.run_id):
            log(f"[{run.arm}] seed {run.seed}: run {run.run_id} is not in this MLflow store; test metrics not "
                "attached")
            continue
        run_ids.append(run.run_id)
        tracking.log_to(run.run_id, run.metrics, run.tags)
    parent_id = tracking.evaluation_parent(experiment_id, run_ids, parent.key, tracking.execution_name(tags),
                                           parent.tags, parent.params)
    tracking.log_to(parent_id, parent.metrics, parent.tags, parent.params, artifacts=files.tracked,
                    artifact_dirs={"figures": files.figures})
    tracking.end_execution(parent_id)
