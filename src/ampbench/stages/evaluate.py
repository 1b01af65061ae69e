"""Evaluate stage: every arm against the baseline arm of the same seed on the test split; verdicts; reports.

Loading and predicting happen here; the files are read through their schemas (``config/records.py``) into typed
objects that flow to the report. The per-example metrics are ``verdict/metrics.py``, the paired statistics
``verdict/comparison.py`` (with ``stats.py``), the tables ``verdict/tables.py``, the advice ``report/advice.py``,
the text ``report/markdown.py``, the figures ``report/figures.py``, what goes into MLflow ``runs.py`` (through
``tracking/``) and the file names ``config/layout.py``. Outputs: reports/comparison.json (DVC metrics: per arm the
verdict, test accuracy, Δ with CI), speed.json (speed and memory × fp32), report.md, details.json (every number,
every seed), curves.json and quality.json (DVC plots) and figures/*.png; test metrics and verdicts onto each arm ×
seed MLflow run, the comparison onto the execution's parent run. The store is opened before any report is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ampbench import tracking
from ampbench.config.arms import BASELINE
from ampbench.config.layout import INTERLEAVED, ArmFiles, ReportFiles
from ampbench.config.params import EvaluateParams, Params
from ampbench.config.records import ArmSummary, SpeedResult, check_history, check_speed, check_summary
from ampbench.config.validation import validate
from ampbench.data.prepare import cut_notes, load_prepared
from ampbench.data.splits import Split
from ampbench.errors import AmpbenchError, DataError, StoreError
from ampbench.precision.policy import resolve_device, resolve_policy
from ampbench.report.advice import Recommendation, recommendation
from ampbench.report.context import HeldOut, RunContext
from ampbench.runtime.console import log
from ampbench.runtime.files import (
    atomic_savefig,
    atomic_write_json,
    atomic_write_text,
    dvc_md5,
    published_together,
    read_json,
)
from ampbench.stages import fix_record, runs
from ampbench.tasks.contract import Task
from ampbench.tasks.probe import HeldToContract
from ampbench.tasks.resolve import resolve_task
from ampbench.training import checkpoint
from ampbench.verdict.comparison import ArmReport, Numerics, Outcomes, PairedStatistics, paired_statistics
from ampbench.verdict.decisions import one_sided_level
from ampbench.verdict.metrics import seed_noise, summarise_seeds
from ampbench.verdict.quality import arm_quality
from ampbench.verdict.sequential import Design, Look, Looks, outcome
from ampbench.verdict.stats import Margins, SeedNoise, resolve_margins
from ampbench.verdict.tables import shown, tables

# Fingerprint keys that must match across arms: results from different hardware or software are not compared.
FINGERPRINT_KEYS = ("device_name", "compute_capability", "cuda_version", "cudnn_version", "torch_version",
                    "cpu_model", "cpu_16bit_flags")
_RETRAIN = "rerun the train stage (dvc repro) to rewrite it"


def evaluate_arms(params: Params, data_dir: Path, models_dir: Path, reports_dir: Path, project_root: Path,
                  tags: dict[str, str], speed_path: Path | None = None) -> dict[str, Any]:
    """Evaluate every arm on the test split against the baseline of the same seed; write reports; log to MLflow.
    Speed from ``speed_path`` (reports/interleaved.json) when it exists. A failing store: StoreError, what is kept."""
    try:
        return _evaluate_arms(params, data_dir, models_dir, reports_dir, project_root, tags, speed_path)
    except StoreError as exc:
        raise StoreError(f"{exc} — no report was published (those in {reports_dir} are as they were) and the trained "
                         "models are kept: run the evaluate stage again once the store works") from None


def _evaluate_arms(params, data_dir, models_dir, reports_dir, project_root, tags, speed_path) -> dict[str, Any]:
    tp, ev = params.train, params.evaluate
    tracking.check_uri(tracking.store_uris(project_root)[0])
    experiment_id = tracking.setup(project_root, params.mlflow.experiment)  # a store that fails: no report yet
    device = resolve_device(tp.device)
    task = HeldToContract(resolve_task(tp.task, tp.block_size))  # outcomes checked and probed as evaluated
    data = task.view(load_prepared(data_dir))
    summaries = {arm: _read_summary(ArmFiles(models_dir / arm).summary, arm, tp.seeds) for arm in tp.precisions}
    base = summaries[BASELINE]
    if not base.ran:
        why = base.skipped or base.diverged
        raise AmpbenchError(f"the {BASELINE} baseline has no result to compare against: {why}")
    check_fingerprints(summaries)
    speed = _read_speed(speed_path or reports_dir / INTERLEAVED.name, tp.precisions, base.hardware.device_name)
    reports, outcomes, predictions = _predict_arms(params, task, summaries, data.test, models_dir, device)
    for r in reports:
        r.speed = speed.arm(r.arm) if speed and r.ran else None
    noise = seed_noise(reports[0].per_seed, predictions)  # reports[0]: the baseline
    margins = resolve_margins(ev.margin.accuracy_pp, ev.margin.loss, noise)
    attach_quality(reports, margins.loss)
    looks = _judge(reports, outcomes, task, margins, noise, ev)
    comparison, speed_rows, details = tables(reports, noise, margins, task.deciding, looks)
    data_md5 = dvc_md5(data_dir)
    context = _context(params, task, data.meta, base, device, margins, noise, looks,
                       fix_record.section(reports_dir, project_root, data_md5, tp))
    merged = {arm: {**row, **speed_rows.get(arm, {})} for arm, row in comparison.items()}
    rec = recommendation(merged, context)  # into the report, the log and the parent run
    seed_runs, parent = runs.evaluation_runs(params, tags, rec, reports, comparison, speed_rows, context, data_md5)
    with published_together(reports_dir) as staging:  # all reports replaced at once, or none
        _write_reports(reports, (comparison, speed_rows, details, merged), context, rec, ReportFiles(staging))
        # Logged from the staging folder, before publishing: a store that fails now leaves the old reports, not
        # new ones that look finished while MLflow holds nothing (the parent run is found by its key on a rerun).
        runs.log_evaluation(experiment_id, tags, seed_runs, parent, ReportFiles(staging))
    log(rec.plain)
    return comparison


def judge_arm(params: Params, data_dir: Path, models_dir: Path, arm: str,
              look: Look | None = None) -> PairedStatistics | str:
    """``arm``'s verdicts against fp32 over train.seeds as this stage judges them (the fixed design, or a sequential
    ``look``'s levels), from ``models_dir``/<arm> and /fp32; nothing written or logged: what ``ampbench fix`` judges
    each trial by. The reason instead when the arm has no result (diverged, skipped)."""
    tp, ev = params.train, params.evaluate
    device = resolve_device(tp.device)
    task = HeldToContract(resolve_task(tp.task, tp.block_size))
    data = task.view(load_prepared(data_dir))
    summaries = {a: _read_summary(ArmFiles(models_dir / a).summary, a, tp.seeds) for a in (BASELINE, arm)}
    if not summaries[arm].ran:
        return summaries[arm].skipped or f"diverged: {summaries[arm].diverged}"
    judged = params.to_dict()
    judged["train"]["precisions"] = [BASELINE, arm]
    reports, outcomes, predictions = _predict_arms(validate(judged), task, summaries, data.test, models_dir, device)
    noise = seed_noise(reports[0].per_seed, predictions)
    margins = resolve_margins(ev.margin.accuracy_pp, ev.margin.loss, noise)
    levels = look.levels() if look else (ev.confidence, one_sided_level(ev.confidence))
    return _paired(reports[1], outcomes, task, margins, noise, *levels)


def _read_summary(path: Path, arm: str, seeds: list[int]) -> ArmSummary:
    """models/<arm>/summary.json through its schema: one line naming the file and the field otherwise."""
    summary = check_summary(read_json(path, f"train the {arm} arm first (dvc repro)"), path, arm, _RETRAIN)
    if summary.ran:
        missing = [seed for seed in seeds if str(seed) not in summary.seeds]
        if missing:
            raise DataError(f"{path}: no result for seed(s) {missing} of train.seeds; {_RETRAIN}")
    return summary


def _read_speed(path: Path, arms: list[str], device_name: str) -> SpeedResult | None:
    """The speed stage's result through its schema, checked against what it compares: measured on the device the
    arms trained on, every arm timed or skipped. None when there is no file (a stage run by hand without the speed
    stage: evaluate then says its speed comes from training time)."""
    if not path.exists():
        return None
    rerun = "rerun the speed stage (dvc repro)"
    return check_speed(read_json(path, rerun), path, arms, device_name, rerun)


def check_fingerprints(summaries: dict[str, ArmSummary]) -> None:
    """Refuse to compare arms trained on different hardware or software (one clear message)."""
    ran = {arm: s.hardware for arm, s in summaries.items() if not s.skipped}
    base = ran[BASELINE]
    for arm, hw in ran.items():
        diff = [k for k in FINGERPRINT_KEYS if hw.get(k) != base.get(k)]
        if diff:
            shown_diff = ", ".join(f"{k}: {base.get(k)!r} vs {hw.get(k)!r}" for k in diff)
            raise AmpbenchError(f"refusing to compare {arm} with {BASELINE}: they ran on different hardware or "
                                f"software ({shown_diff}); retrain both on one machine (dvc repro --force)")
    # Each seed's own device: a cluster's cells may have run on other nodes than the one that collected them.
    kinds: dict[str, list[str]] = {}
    for arm, s in summaries.items():
        for seed, record in s.seeds.items() if not s.skipped else ():
            if record.device:
                kinds.setdefault(record.device, []).append(f"{arm} seed {seed}")
    if len(kinds) > 1:
        where = "; ".join(f"{', '.join(cells)} on {device!r}" for device, cells in kinds.items())
        raise AmpbenchError(f"refusing to compare cells trained on different device kinds ({where}); place every "
                            "cell on one kind (ampbench cluster repro --accelerator-type or --resource)")


def _predict_arms(params: Params, task: Task, summaries: dict[str, ArmSummary], test: Split, models_dir: Path,
                  device: torch.device) -> tuple[list[ArmReport], dict[str, Outcomes], dict[int, torch.Tensor]]:
    """Every arm's report (skipped and diverged ones with their reason), its per-example outcomes and the
    baseline's predictions per seed (for fp32's seed noise). The baseline first: its models, loaded once, are
    every other arm's references."""
    reports: list[ArmReport] = []
    predictions: dict[int, torch.Tensor] = {}
    refs: dict[int, torch.nn.Module] = {}
    outcomes: dict[str, Outcomes] = {}
    for arm in [BASELINE] + [a for a in params.train.precisions if a != BASELINE]:
        s = summaries[arm]
        if not s.ran:
            reports.append(ArmReport(s, numerics=Numerics.of(s)))
            continue
        report, outcomes[arm] = _evaluate_arm(s, params, task, test, models_dir / arm, device, refs, predictions)
        reports.append(report)
    return reports, outcomes, predictions


def _evaluate_arm(summary: ArmSummary, params: Params, task: Task, test: Split, folder: Path, device: torch.device,
                  refs: dict[int, torch.nn.Module], predictions: dict[int, torch.Tensor]) -> tuple[ArmReport, Outcomes]:
    """One trained arm, every seed: in its own precision and, its weights as they are, in strict fp32; against the
    baseline's model of the same seed (``task.evaluate``). The baseline fills ``refs`` and ``predictions``."""
    arm = summary.arm
    policy, strict = resolve_policy(arm, device, params.train.fp32_modules), resolve_policy(BASELINE, device)
    files = ArmFiles(folder)
    histories = check_history(read_json(files.history, _RETRAIN), files.history, arm, _RETRAIN)
    ev = params.evaluate
    per_seed, examples = {}, {}
    for seed in params.train.seeds:
        model = checkpoint.load_final_model(files.checkpoint(seed), arm, seed, device, _RETRAIN)
        if arm == BASELINE:
            refs[seed] = model  # fp32's evaluation leaves it as it was: strict float32, eval mode
        result = task.evaluate(model, refs[seed], policy, strict, test, ev.batch_size, ev.calibration_bins)
        if arm == BASELINE:
            predictions[seed] = result.predictions
        per_seed[seed], examples[seed] = result.metrics, result
    report = ArmReport(summary, metrics=summarise_seeds(per_seed), per_seed=per_seed, histories=histories,
                       numerics=Numerics.of(summary))
    return report, Outcomes.stack(examples)


def _judge(reports: list[ArmReport], outcomes: dict[str, Outcomes], task: Task, margins: Margins, noise: SeedNoise,
           ev: EvaluateParams) -> Looks | None:
    """Every evaluated arm's verdicts (``r.stats``). The fixed design: at the confidence, over every seed. A
    sequential one (``evaluate.sequential``): at each look, over the smallest seeds of that look, at the look's
    levels, keeping the verdicts of the first look that decides the arm; returns where the procedure stands."""
    sq = ev.sequential
    design = None if sq.max_seeds is None else Design(sq.min_seeds, sq.max_seeds, sq.spending, ev.confidence,
                                                      sq.until)
    decided_at: dict[str, int | None] = {}
    for r in (r for r in reports if r.ran):
        if design is None or r.arm == BASELINE:
            r.stats = _paired(r, outcomes, task, margins, noise, ev.confidence, one_sided_level(ev.confidence))
            continue
        decided_at[r.arm] = None
        for look in (lk for lk in design.looks() if lk.seeds <= len(r.per_seed)):
            r.stats = _paired(r, outcomes, task, margins, noise, *look.levels(), look.seeds)
            if design.decided(r.stats.decided.not_worse, r.stats.decided.verdict):
                decided_at[r.arm] = look.seeds
                break
    if design is None:
        return None
    return Looks(design, outcome(design, len(reports[0].per_seed), decided_at))


def _paired(r: ArmReport, outcomes: dict[str, Outcomes], task: Task, margins: Margins, noise: SeedNoise,
            confidence: float, one_sided: float, seeds: int | None = None) -> PairedStatistics:
    """``r``'s verdicts against the baseline: the task's paired intervals at ``confidence`` and at ``one_sided``
    (``comparison.paired_statistics``), over the ``seeds`` smallest seeds (None: all)."""
    arm, ref = outcomes[r.arm], outcomes[BASELINE]
    finite = arm.finite and ref.finite
    rows = {k: v[:seeds] for k, v in arm.arrays.items()}, {k: v[:seeds] for k, v in ref.arrays.items()}
    two = task.paired(*rows, confidence, finite)
    one = task.paired(*rows, one_sided, finite)
    per_seed = {s: r.per_seed[s] for s in sorted(r.per_seed)[:seeds]}
    return paired_statistics(per_seed, two, one, margins, noise, confidence, task.deciding)


def attach_quality(reports: list[ArmReport], margin: float) -> None:
    """Each evaluated arm's evaluation points and time to fp32's quality, from its summary.json and its speed ×
    fp32 (the speed stage's, else training time's)."""
    base = next(r for r in reports if r.arm == BASELINE)
    for r in sorted((r for r in reports if r.ran), key=lambda r: r.arm != BASELINE):  # the baseline's first
        r.evaluations = {seed: rec.evaluations for seed, rec in r.trained.seeds.items()}
        own, ref = r.trained.samples_per_s, base.trained.samples_per_s
        speedup = (1.0 if r.arm == BASELINE else r.speed.speedup_vs_fp32 if r.speed else
                   own / ref if own and ref else None)
        r.quality = arm_quality(r.evaluations, base.evaluations, margin, speedup)


def _context(params: Params, task: Task, meta: dict, base: ArmSummary, device: torch.device, margins: Margins,
             noise: SeedNoise, looks: Looks | None, searches: list[str]) -> RunContext:
    """What the report says about the run as a whole: data, model, seeds, device, margins, fp32's seed noise, the
    section on `ampbench fix`'s searches."""
    from ampbench.report.advice import cpu_note

    hw = base.hardware
    return RunContext(task=task, dataset=meta["dataset"], model=base.model, seeds=params.train.seeds,
                      epochs=base.epochs, device_name=hw.device_name, device_type=device.type, margins=margins,
                      noise=noise, confidence=params.evaluate.confidence, prepare=params.prepare.to_dict(),
                      batch_size=params.train.batch_size,
                      test=HeldOut(meta["sizes"]["test"], meta.get("test_from"), meta.get("test_available")),
                      data_notes=tuple(cut_notes(meta)),
                      note=cpu_note(hw.cpu_16bit_flags) if device.type == "cpu" else None, looks=looks,
                      searches=tuple(searches))


def _write_reports(reports: list[ArmReport], rows: tuple[dict, dict, dict, dict], context: RunContext,
                   rec: Recommendation, files: ReportFiles) -> None:
    """Every report into ``files`` (the staging folder); ``rows``: comparison, speed, details, and the first two
    merged per arm."""
    from ampbench.report.figures import accuracy_delta_figure, curves_figure, quality_figure, speed_memory_figure
    from ampbench.report.markdown import markdown_report
    from ampbench.report.plots import curve_rows, quality_rows

    comparison, speed, details, merged = rows
    slim, fast = shown(comparison, speed, context.task.deciding)
    atomic_write_json(files.comparison, slim)
    atomic_write_json(files.speed, fast)
    atomic_write_json(files.details, details)
    atomic_write_json(files.curves, curve_rows(reports))
    quality = quality_rows(reports, context.batch_size)
    atomic_write_json(files.quality, quality)
    atomic_write_text(files.report, markdown_report(reports, merged, context, rec))
    figures = files.figures
    atomic_savefig(curves_figure(reports), figures / "curves.png")
    atomic_savefig(accuracy_delta_figure(reports, context.margin_pp), figures / "accuracy_delta.png")
    atomic_savefig(speed_memory_figure(merged), figures / "speed_memory.png")
    atomic_savefig(quality_figure(quality, merged), figures / "time_to_quality.png")
