"""``ampbench fix ARM``: which modules to keep in float32 so that a degraded autocast arm is shown not worse than
fp32, from the sensitivity ranking to a verdict confirmed on fresh seeds (the search, and why it is built so:
``verdict/search.py``; the ranking: ``training/sensitivity.py``).

It reads what `dvc repro` left (params.yaml, data/prepared, models/, reports/comparison.json) and trains in
``.resume/fix/<arm>/``, which neither git nor DVC tracks: params.yaml and the pipeline's outputs stay as they were.
Its record goes to reports/fix/ (``fix_record.py``), which the evaluate stage reads into report.md.

- A trial is the arm with ``train.fp32_modules`` set to its modules, trained on the run's own seeds by the train
  stage's code (``train_arm``: the pipeline's loop or the framework's Trainer), and judged against the run's fp32
  models of those seeds as the evaluate stage judges (``evaluate.judge_arm``: the same margins, confidence and
  deciding metric), at each look of ``ampbench decide``'s design until one decides it.
- The confirmation trains the set the search ended with, and fp32, on as many seeds again that no trial used, with
  the same looks; its verdict is the one reported.
- In MLflow one run per search (role ``fix``, its answer in ``fix.*`` tags) holds each trial's execution run
  (``fix.modules``, ``fix.verdict``), which holds the trial's run per seed.
- In a git repository each trial is also a DVC experiment, with its params and verdict (``fix_exps.py``).
- A trial whose seeds all finished is not trained again, and one cut short resumes as the train stage does: a rerun
  after Ctrl-C goes on where it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ampbench import tracking
from ampbench.config import arms
from ampbench.config.arms import BASELINE, no_islands
from ampbench.config.layout import MODELS, PREPARED, REPORTS, RESUME, ArmFiles, ReportFiles
from ampbench.config.params import Params
from ampbench.config.validation import load_params, validate
from ampbench.errors import Interrupted, ParamsError
from ampbench.report.fix import against, answer_lines, cost_lines, interval_text
from ampbench.runtime import signals
from ampbench.runtime.files import dvc_md5, json_digest, read_json
from ampbench.runtime.provenance import run_tags
from ampbench.stages import fix_exps
from ampbench.stages.evaluate import judge_arm
from ampbench.stages.fix_record import identity, run_parts, write_record
from ampbench.stages.sensitivity import rank_in_project, ranking_lines
from ampbench.stages.train import train_arm
from ampbench.verdict.search import NOT_WORSE, Answer, Trial, default_budget, judged_in_looks, search, trial_design
from ampbench.verdict.sequential import Design, Look

EQUIVALENT = "equivalent"
GOALS = {"not_worse": NOT_WORSE, "equivalent": EQUIVALENT}  # --until: the verdict a trial must reach to pass


def fix_in_project(arm: str, root: Path, budget: int | None = None, say: Callable[[str], None] = print,
                   until: str = "not_worse") -> Answer | None:
    """Search for the modules to keep in float32 for ``arm`` in the project at ``root`` (see the module docstring),
    saying each trial and the answer; None, training nothing, when the arm already passes. ``budget``: the arm's
    trainings the search may spend, the confirmation's included (default ``default_budget``); ``until``: the verdict
    that passes, ``not_worse`` or ``equivalent`` (within the margin on both sides: a set that makes the arm better
    beyond it does not pass either)."""
    root = root.resolve()
    params = load_params(root / "params.yaml")
    tp = params.train
    _searchable(arm, params)
    goal = GOALS[until]
    now = _verdict(root, arm, until)
    if now == goal:
        say(f"{arm} is already {against(goal)} in this run: nothing to fix, nothing trained")
        return None
    ranked = rank_in_project(arm, root)  # a model or task of the user's imports from root from here on
    ranking = [m.module for m in ranked.modules]
    seeds = tuple(tp.seeds)
    fresh = tuple(range(max(seeds) + 1, max(seeds) + 1 + len(seeds)))
    budget = _budget(budget, len(ranking), len(seeds), len(fresh))
    trials = _Trials(arm, params, root, seeds, say, goal)
    opening = _opening(arm, now, len(ranking), seeds, fresh, budget, goal, trials.design)
    say(opening)
    trials.open_search(budget, ranking, fresh)
    signals.handle_signals_once()  # SIGTERM unwinds like Ctrl-C: the trial's seed run ends KILLED
    try:
        answer = search(ranking, trials, seeds, fresh, budget)
    except ValueError as exc:
        raise ParamsError(str(exc)) from None
    except KeyboardInterrupt as exc:
        raise Interrupted(exc.args[0] if exc.args else "SIGINT",
                          f"the trials done are kept in {trials.folder.relative_to(root)}/ (and the epochs of the one "
                          f"cut short); rerun `ampbench fix {arm}` with the same options to go on from them") from None
    cost = _cost(arm, params, root, trials, answer) if answer.confirmed else None
    said = answer_lines(arm, answer, budget) + (cost_lines(arm, cost) if cost else [])
    for line in said:
        say(line)
    path = write_record(ReportFiles(root / REPORTS).fix, arm if goal == NOT_WORSE else f"{arm}.{until}", {
        "arm": arm, "goal": goal, "identity": identity(trials.run), "opening": opening, "said": said,
        "ranking": ranking_lines(ranked, 10), "tried": trials.tried, **answer.fields()})
    trials.close_search(answer, cost, path)
    say(f"The search's record: {path.relative_to(root)} (and on its MLflow run); `dvc repro` puts it into "
        "reports/report.md")
    say(fix_exps.experiments_line(trials.saved, trials.exps))
    return answer


def _opening(arm: str, now: str, candidates: int, seeds: tuple[int, ...], fresh: tuple[int, ...], budget: int,
             goal: str, design: Design | None) -> str:
    """The search's first line: where the arm stands, the ranking, the seeds and looks, the budget."""
    looks = (f", each looked at after every seed from {design.min_seeds} on ({design.spending.replace('_', '–')} "
             "alpha spending: a clear case stops early)" if design else "")
    return (f"{arm}: {now} against fp32 in this run. {candidates} candidate modules ranked on the fp32 model "
            f"(`ampbench sensitivity {arm}`); trials on seeds {list(seeds)}, the confirmation on fresh seeds "
            f"{list(fresh)}{looks}; a budget of {budget} trainings of {arm}"
            + ("; a trial passes when equivalent (--until)" if goal == EQUIVALENT else ""))


def _budget(budget: int | None, candidates: int, seeds: int, fresh: int) -> int:
    """The search's budget in trainings: ``default_budget`` unless given; ParamsError when it pays for no trial and
    its confirmation."""
    budget = default_budget(candidates, seeds, fresh) if budget is None else budget
    if budget < seeds + fresh:
        raise ParamsError(f"--budget {budget}: a trial on the run's {seeds} seed(s) and its confirmation on {fresh} "
                          f"fresh one(s) need at least {seeds + fresh} trainings")
    return budget


def _searchable(arm: str, params: Params) -> None:
    """ParamsError for what the search does not take: an arm not in the run (or fp32), an arm that keeps no float32
    weights, params that already keep modules in float32."""
    tp = params.train
    if arm == BASELINE or arm not in tp.precisions:
        raise ParamsError(f"{arm!r}: not an arm of this run to fix against fp32 (train.precisions: {tp.precisions})")
    if no_islands(arms.get(arm)):
        raise ParamsError(f"{arm}: {no_islands(arms.get(arm))}: no module of it to keep in float32")
    if tp.fp32_modules:
        raise ParamsError(f"train.fp32_modules is {list(tp.fp32_modules)}: the search chooses it, starting from the "
                          "arm as it is; run it on params without it")


def _cost(arm: str, params: Params, root: Path, trials: _Trials, answer: Answer) -> dict:
    """What the fix costs: fp32, the arm as it was and with the fix timed together by the speed harness (speed.*
    sizes), and the share of the arm's matmul and convolution FLOPs that the kept modules take (the train stage's
    count of one step, before and with them)."""
    from ampbench.stages.speed import FIXED, measure_fix

    speed = measure_fix(params, arm, list(answer.modules), root / PREPARED)
    before = read_json(ArmFiles(root / MODELS / arm).summary, "").get("flops") or {}
    after = trials.summary(answer.confirmation).get("flops") or {}
    shares = before.get("low_precision_share"), after.get("low_precision_share")
    return {"speed": {"as it was": speed[arm], "with the fix": speed[FIXED.format(arm=arm)]},
            "kept_flops_share": shares[0] - shares[1] if None not in shares else None}


def _verdict(root: Path, arm: str, until: str) -> str:
    """The arm's not-worse (or equivalence) verdict in the run's reports/comparison.json (ParamsError when it has
    none)."""
    path = ReportFiles(root / "reports").comparison
    row = read_json(path, "run the pipeline first (dvc repro)").get(arm) or {}
    if row.get("verdict") == "skipped":
        raise ParamsError(f"{arm} was skipped in this run (reports/report.md says why): nothing trained to fix")
    if "not_worse" not in row:
        raise ParamsError(f"{path}: no verdict for {arm}; run the pipeline first (dvc repro)")
    return row["verdict" if until == "equivalent" else "not_worse"]


class _Trials:
    """The ``judge`` of a search: each trial trained in ``.resume/fix/<arm>/``, judged, said and logged."""

    def __init__(self, arm: str, params: Params, root: Path, seeds: tuple[int, ...], say: Callable[[str], None],
                 goal: str):
        self.arm, self.params, self.root, self.seeds, self.say, self.goal = arm, params, root, seeds, say, goal
        self.folder = root / RESUME / "fix" / arm
        self.data = root / PREPARED
        # what a trial's training depends on besides its set and seeds: a trial is reused only for the same run
        self.run = run_parts(root, dvc_md5(self.data), params.train)
        self.code = self.run["code"]
        self.tags = run_tags(root)
        sq = params.evaluate.sequential  # a trial looks as `ampbench decide` does (verdict/search.py)
        self.design = trial_design(len(seeds), sq.min_seeds, sq.spending, params.evaluate.confidence)
        self.count = 0
        self.trained: dict[Trial, Path] = {}  # each trial's folder
        self.tried: list[str] = []  # each trial's line, as said
        self.search_run: str | None = None
        self.exps = fix_exps.baseline(root)  # where the trials' DVC experiments go (their names: saved), or why not
        self.saved: list[str] = []

    def open_search(self, budget: int, ranking: list[str], fresh: tuple[int, ...]) -> None:
        """The search's MLflow run: found again by what the search is (a rerun of it goes on in it), else made."""
        experiment = tracking.setup(self.root, self.params.mlflow.experiment)
        what = {"arm": self.arm, "goal": self.goal, "seeds": list(self.seeds), "fresh": list(fresh), "budget": budget,
                "ranking": ranking, **self.run}
        self.search_run = tracking.search_parent(
            experiment, json_digest(what, 24), f"fix {self.arm}",
            {**self.tags, "fix.arm": self.arm, "fix.goal": self.goal},
            {"fix.budget": str(budget), "fix.seeds": json.dumps(list(self.seeds)), "fix.fresh": json.dumps(list(fresh)),
             "fix.candidates": str(len(ranking))})

    def close_search(self, answer: Answer, cost: dict | None, record: Path) -> None:
        """The answer (and what the fix costs) onto the search's run, its record as an artifact."""
        conf = answer.confirmation
        tags = {"fix.modules": json.dumps(list(answer.modules)) if answer.modules else "none",
                "fix.minimal": str(answer.minimal).lower(), "fix.stopped": answer.stopped,
                "fix.confirmation": conf.verdict if conf else "none"}
        metrics = {"fix.trainings": answer.spent, "fix.trials": len(answer.trials)}
        if cost:
            metrics.update({f"fix.speedup_vs_fp32.{key.replace(' ', '_')}": row["speedup_vs_fp32"]
                            for key, row in cost["speed"].items() if row.get("speedup_vs_fp32") is not None})
            if cost["kept_flops_share"] is not None:
                metrics["fix.kept_flops_share"] = cost["kept_flops_share"]
        tracking.log_to(self.search_run, metrics, tags, artifacts=[record])

    def summary(self, trial: Trial) -> dict:
        """The summary.json of ``trial``'s arm (trained in the folder of all its seeds, on those its looks used)."""
        return read_json(ArmFiles(self.trained[trial] / self.arm).summary, "")

    def _folder(self, modules: tuple[str, ...], seeds: tuple[int, ...]) -> Path:
        return self.folder / json_digest({**self.run, "modules": sorted(modules), "seeds": list(seeds)}, 12)

    def __call__(self, modules: tuple[str, ...], seeds: tuple[int, ...]) -> Trial:
        role = "search" if seeds == self.seeds else "confirmation"
        folder = self._folder(modules, seeds)
        last: dict = {}  # the deciding look's execution run and stats: judged_in_looks returns its Trial alone

        def judge_at(now: tuple[int, ...], look: Look | None) -> Trial:
            last["execution"] = self._train(self.arm, self._params(self.arm, modules, seeds), folder, modules, role,
                                            now)
            fp32 = self.root / MODELS / BASELINE if role == "search" else self._fresh_fp32(seeds, now)
            if not (folder / BASELINE).exists():
                (folder / BASELINE).symlink_to(fp32, target_is_directory=True)
            last["stats"] = judge_arm(self._params(self.arm, modules, now), self.data, folder, self.arm, look)
            return _trial(modules, now, last["stats"], self.goal)

        trial = judged_in_looks(seeds, self.design, judge_at)
        self.trained[trial] = folder
        self.count += 1
        execution, stats = last["execution"], last["stats"]
        exp = self._save(trial, stats, role, execution)
        if execution:  # a trial another search (the other --until) trained stays under that search's run
            tags = {"fix.verdict": trial.verdict, "fix.dvc_exp": exp} if self.goal == NOT_WORSE else \
                {"fix.equivalence": trial.verdict, "fix.dvc_exp.equivalence": exp}
            tags = {k: v for k, v in tags.items() if v}
            tracking.log_to(execution, {}, tags if tracking.parent_of(execution) else
                            {**tags, "mlflow.parentRunId": self.search_run})
        self.tried.append(f"{role if role == 'confirmation' else f'trial {self.count}'}: {json.dumps(list(modules))} "
                          f"kept in float32, seeds {list(trial.seeds)}: {trial.verdict} "
                          f"({stats if isinstance(stats, str) else interval_text(stats)})")
        self.say(self.tried[-1])
        return trial

    def _save(self, trial: Trial, stats, role: str, execution: str | None) -> str | None:
        """``trial`` as a DVC experiment: its name, or None (no git repository; saving failed: said once)."""
        try:
            if isinstance(self.exps, fix_exps.Baseline):
                self.saved.append(fix_exps.save_trial(self.exps, self.root, self.arm, role, self.count, trial, stats,
                                                      execution))
                return self.saved[-1]
        except fix_exps.NotSaved as exc:
            self.exps = str(exc)
            self.say(f"The trials are no longer saved as DVC experiments: {exc}")
        return None

    def _params(self, arm: str, modules: tuple[str, ...], seeds: tuple[int, ...]) -> Params:
        raw = self.params.to_dict()
        raw["train"].update({"precisions": [BASELINE, arm] if arm != BASELINE else [BASELINE],
                             "fp32_modules": list(modules), "seeds": list(seeds), "keep_finished": True})
        return validate(raw)

    def _train(self, arm: str, params: Params, folder: Path, modules: tuple[str, ...], role: str,
               now: tuple[int, ...]) -> str | None:
        """Train ``arm`` under ``params`` into ``folder``/<arm> on the seeds ``now`` (the first of train.seeds)
        unless they all finished there; the trial's execution run (None when nothing was ever logged)."""
        files = ArmFiles(folder / arm)
        if not _finished(files, list(now)):
            name = f"fix {self.arm}: {json.dumps(list(modules))}" if arm != BASELINE else f"fix {self.arm}: fp32"
            tags = {**self.tags, "ampbench.execution_name": name, "fix.role": role,
                    "fix.modules": json.dumps(list(modules))}
            train_arm(arm, params, self.data, folder / arm, self.root, tags, resume_dir=folder / ".resume" / arm,
                      code_version=self.code, now=list(now))
        summary = read_json(files.summary, "its training did not finish")
        run_ids = [s.get("run_id") for s in (summary.get("seeds") or {}).values() if s.get("run_id")]
        return tracking.parent_of(run_ids[0]) if run_ids else None

    def _fresh_fp32(self, seeds: tuple[int, ...], now: tuple[int, ...]) -> Path:
        """fp32 trained on the confirmation's seeds so far (each once)."""
        folder = self.folder / json_digest({**self.run, "fp32": list(seeds)}, 12)
        execution = self._train(BASELINE, self._params(BASELINE, (), seeds), folder, (), "confirmation", now)
        if execution and not tracking.parent_of(execution):
            tracking.log_to(execution, {}, {"mlflow.parentRunId": self.search_run})
        return folder / BASELINE


def _finished(files: ArmFiles, seeds: list[int]) -> bool:
    if not files.summary.exists():
        return False
    summary = read_json(files.summary, "")
    return summary.get("skipped") is not None or all(str(s) in (summary.get("seeds") or {}) for s in seeds)


def _trial(modules: tuple[str, ...], seeds: tuple[int, ...], stats, goal: str) -> Trial:
    """A judged trial; its interval oriented so that higher is better (a loss difference negated)."""
    if isinstance(stats, str):
        return Trial(modules, seeds, "diverged" if stats.startswith("diverged") else "skipped", goal=goal)
    v = stats.decided
    lo, hi = v.interval.ci_low, v.interval.ci_high
    if stats.deciding == "loss" and lo is not None:
        lo, hi = -hi, -lo
    return Trial(modules, seeds, v.verdict if goal == EQUIVALENT else v.not_worse, lo, hi, goal)
