"""Each trial of ``ampbench fix`` as a DVC experiment, so that ``dvc exp show`` lists it beside the run's own.

A trial trains its arm alone, on the seeds its looks used, outside the pipeline (``stages/fix.py``): as a
``dvc exp run`` it would retrain fp32 and rerun the speed and evaluate stages, whose params include
``train.fp32_modules``. So each trial is saved as ``dvc exp save`` saves work done outside a pipeline (DVCLive's way):
a commit on the workspace's HEAD under DVC's experiment ref (``refs/exps/…/<name>``) that holds

- the workspace's params.yaml with the trial's ``train.fp32_modules``, ``train.seeds`` and ``train.precisions`` (set
  by DVC's own ``-S`` parser): what the trial trained, and
- ``reports/fix_trial.json`` (a top-level metrics file of dvc.yaml): its verdict, interval and MLflow run,

and leaves out the pipeline's own metrics and plots files (reports/comparison.json, …): they are the run's, not the
trial's. dvc.lock is HEAD's: ``dvc exp apply NAME`` then ``dvc repro`` runs the whole pipeline with the trial's
params. Unlike ``dvc exp save`` it changes nothing in the workspace (params.yaml, git's index, dvc.lock) and does
not record the run's outputs as the trial's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampbench.config.arms import BASELINE
from ampbench.errors import ParamsError
from ampbench.report.advice import fp32_modules_setting
from ampbench.report.fix import deciding
from ampbench.verdict.search import NOT_WORSE, Trial

TRIAL_METRICS = "reports/fix_trial.json"  # declared under `metrics:` in dvc.yaml


class NotSaved(Exception):
    """Why a trial could not be saved as an experiment (git's or DVC's one line)."""


@dataclass(frozen=True)
class Baseline:
    """Where the trials' experiments go: the git repository holding the project, the project's folder in it, the
    commit they are made on (HEAD) and the pipeline's metrics and plots files they leave out."""

    git: Path
    prefix: str  # the project's folder relative to the repository's top, "" or ending in "/"
    commit: str
    left_out: tuple[str, ...]


def baseline(root: Path) -> Baseline | str:
    """The baseline for experiments of the project at ``root``, or why there is none (not a git repository with a
    commit, not a DVC project)."""
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        prefix = _git(root, "rev-parse", "--show-prefix")
        commit = _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    except (OSError, subprocess.CalledProcessError):
        return f"{root} is not in a git repository with a commit (git init, git commit)"
    try:
        from dvc.repo import Repo

        with Repo(str(root)) as repo:  # the files `dvc exp show` reads as metrics or plots are not cached
            left = {os.path.relpath(out.fs_path, top) for out in repo.index.outs if not out.use_cache}
    except Exception as exc:  # noqa: BLE001  (DVC's errors: not a DVC project, a dvc.yaml it cannot read)
        return f"{root} is not a DVC project DVC can read ({type(exc).__name__}: {str(exc).strip()[:200]})"
    return Baseline(Path(top), prefix, commit, tuple(sorted(left)))


def save_trial(base: Baseline, root: Path, arm: str, role: str, number: int, trial: Trial, stats,
               execution: str | None) -> str:
    """``trial`` (the ``number``-th of the search, or its confirmation: ``role``) saved as the experiment
    ``fix-<arm>[-equivalent]-<number>`` (or ``…-confirmation``): the modules, seeds and arms it trained, and its
    verdict, interval (``stats``, evaluate's) and MLflow run (``execution``). Its name; NotSaved when git fails."""
    name = f"fix-{arm}" + ("" if trial.goal == NOT_WORSE else "-equivalent") + \
        ("-confirmation" if role == "confirmation" else f"-{number}")
    settings = [fp32_modules_setting(list(trial.modules)), f"train.seeds=[{','.join(map(str, trial.seeds))}]",
                f"train.precisions=[{BASELINE},{arm}]"]
    measured = {"arm": arm, "role": role, "goal": trial.goal, "verdict": trial.verdict, "seeds": len(trial.seeds),
                **_measured(stats), "mlflow_run": execution}
    try:
        save(base, root, name, settings, {"fix": measured})
    except (OSError, subprocess.CalledProcessError, ParamsError) as exc:
        why = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()
        raise NotSaved(f"saving {name} failed: {why[-1] if why else type(exc).__name__}") from None
    return name


def experiments_line(saved: list[str], why: Baseline | str) -> str:
    """Where the search's trials are in DVC (``saved``: their names), or why they are not."""
    if not saved:
        return f"The trials are not saved as DVC experiments: {why or 'none was judged'}"
    return (f"`dvc exp show` lists the trials as DVC experiments ({', '.join(dict.fromkeys(saved))}): the params "
            f"each trained under and its verdict ({TRIAL_METRICS}); `dvc exp apply NAME` takes a trial's params")


def _measured(stats) -> dict:
    """A trial's deciding difference and one-sided bound as numbers, or why it has none (diverged, skipped)."""
    if isinstance(stats, str):
        return {"why": stats}
    unit, delta, bound = deciding(stats)
    return {"deciding": f"{stats.deciding} ({unit})", "delta": delta, "bound": bound}


def save(base: Baseline, root: Path, name: str, settings: list[str], metrics: dict[str, Any]) -> None:
    """Save one experiment ``name`` on ``base``: params.yaml with ``settings`` (``-S`` syntax) applied, ``metrics``
    as TRIAL_METRICS. A later one of the same name on the same commit replaces it, as ``dvc exp save --force``."""
    from dvc.repo.experiments.refs import ExpRefInfo

    from ampbench.stages.decide import apply_settings

    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.yaml"
        shutil.copyfile(root / "params.yaml", params)
        apply_settings(params, tuple(settings))
        trial = Path(tmp) / "trial.json"
        trial.write_text(json.dumps(metrics, indent=2) + "\n")
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index"), **_identity(base.git)}
        git = lambda *args: _git(base.git, *args, env=env)  # noqa: E731
        git("read-tree", base.commit)
        for path, file in ((base.prefix + "params.yaml", params), (base.prefix + TRIAL_METRICS, trial)):
            git("update-index", "--add", "--cacheinfo", f"100644,{git('hash-object', '-w', str(file))},{path}")
        if base.left_out:
            git("update-index", "--force-remove", "--", *base.left_out)
        tree = git("write-tree")
        commit = git("commit-tree", tree, "-p", base.commit, "-m", f"ampbench fix: {name}")
        git("update-ref", str(ExpRefInfo(base.commit, name)), commit)


def _identity(git: Path) -> dict[str, str]:
    """A committer for the experiment's commit when the repository names none (DVC's own commits need one too)."""
    try:
        _git(git, "var", "GIT_COMMITTER_IDENT")
        return {}
    except subprocess.CalledProcessError:
        return {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
                for what, value in (("NAME", "ampbench"), ("EMAIL", "ampbench@localhost"))}


def _git(where: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], cwd=where, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()
