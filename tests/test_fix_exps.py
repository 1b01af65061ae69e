"""``ampbench fix``'s trials as DVC experiments (stages/fix_exps.py): `dvc exp show` lists them with the params they
trained under and what they measured, and the workspace stays as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ROOT, TINY, dvc_exps

DVC = [sys.executable, "-m", "dvc"]


def _project(repo: Path) -> Path:
    """A git + DVC repository with the pipeline's dvc.yaml, params.yaml and the run's comparison.json committed."""
    repo.mkdir()
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    (repo / "params.yaml").write_text("# the run's params\n" + yaml.safe_dump(TINY, sort_keys=False))
    (repo / "reports").mkdir()
    (repo / "reports" / "comparison.json").write_text(json.dumps({"bf16": {"not_worse": "worse"}}))
    for command in (["git", "init", "-q"], [*DVC, "init", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "the run"]):
        subprocess.run(command, cwd=repo, check=True, capture_output=True)
    return repo


def test_a_trial_is_listed_by_dvc_exp_show_and_the_workspace_is_untouched(tmp_path):
    from ampbench.stages import fix_exps

    repo = _project(tmp_path / "repo")
    before = {p: (repo / p).read_bytes() for p in ("params.yaml", "dvc.yaml", "reports/comparison.json")}
    base = fix_exps.baseline(repo)
    assert isinstance(base, fix_exps.Baseline), base
    assert "reports/comparison.json" in base.left_out and "reports/speed.json" in base.left_out, base.left_out
    measured = {"fix": {"arm": "bf16", "role": "search", "verdict": "not worse", "seeds": 3, "delta": 0.1}}
    fix_exps.save(base, repo, "fix-bf16-1", ['train.fp32_modules=["coords", "2"]', "train.seeds=[0,1,2]",
                                             "train.precisions=[fp32,bf16]"], measured)
    exps = dvc_exps(repo)
    assert list(exps) == ["fix-bf16-1"], exps
    train = exps["fix-bf16-1"]["params"]["train"]
    assert (train["fp32_modules"], train["seeds"], train["precisions"]) == (["coords", "2"], [0, 1, 2],
                                                                           ["fp32", "bf16"]), train
    assert train["epochs"] == TINY["train"]["epochs"]  # the rest as the run had it
    # the trial's own measurement, not the run's comparison.json, which the experiment leaves out
    assert exps["fix-bf16-1"]["metrics"] == {"reports/fix_trial.json": measured}, exps
    tree = subprocess.run(["git", "ls-tree", "-r", "--name-only", "refs/exps/" + "/".join(
        [base.commit[:2], base.commit[2:], "fix-bf16-1"])], cwd=repo, capture_output=True, text=True, check=True)
    assert "params.yaml" in tree.stdout.split() and "reports/comparison.json" not in tree.stdout.split()
    assert "# the run's params" in subprocess.run(["git", "show", "refs/exps/" + "/".join(
        [base.commit[:2], base.commit[2:], "fix-bf16-1"]) + ":params.yaml"], cwd=repo, capture_output=True,
        text=True, check=True).stdout  # DVC's own -S parser: the file's comments stay
    assert {p: (repo / p).read_bytes() for p in before} == before
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""
    # a rerun of the search saves it again under its name: one experiment, the later one
    fix_exps.save(base, repo, "fix-bf16-1", ["train.fp32_modules=[coords]"], {"fix": {"verdict": "worse"}})
    exps = dvc_exps(repo)
    assert list(exps) == ["fix-bf16-1"] and exps["fix-bf16-1"]["metrics"]["reports/fix_trial.json"] == {
        "fix": {"verdict": "worse"}}, exps


def test_without_git_or_dvc_there_is_no_baseline_and_a_repository_without_an_identity_still_gets_one(
        tmp_path, monkeypatch):
    from ampbench.stages import fix_exps

    (tmp_path / "plain").mkdir()
    assert "not in a git repository with a commit" in fix_exps.baseline(tmp_path / "plain")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "plain", check=True)
    (tmp_path / "plain" / "params.yaml").write_text("train: {}\n")
    subprocess.run(["git", "add", "-A"], cwd=tmp_path / "plain", check=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=tmp_path / "plain", check=True)
    assert "is not a DVC project" in fix_exps.baseline(tmp_path / "plain")
    repo = _project(tmp_path / "repo")
    base = fix_exps.baseline(repo)
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    # no user.email anywhere, and no guess from the host's name (which works on a host with a domain name)
    (tmp_path / "no-identity").write_text("[user]\n\tuseConfigOnly = true\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-identity"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    fix_exps.save(base, repo, "fix-bf16-2", ["train.fp32_modules=[fc1]"], {"fix": {"verdict": "not worse"}})
    author = subprocess.run(["git", "log", "-1", "--format=%an <%ae>", "refs/exps/" + "/".join(
        [base.commit[:2], base.commit[2:], "fix-bf16-2"])], cwd=repo, capture_output=True, text=True, check=True)
    assert author.stdout.strip() == "ampbench <ampbench@localhost>"
