"""`ampbench decide` (issue 39): seeds until decided, one `dvc exp run` per look in a temporary git + DVC repo; the
report, details.json and MLflow say which look it is and why it stopped; a rerun trains nothing new."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import TINY, make_project_repo, none_left, run_ok

pytestmark = pytest.mark.slow

AMPBENCH = [sys.executable, "-m", "ampbench.cli"]


def _decide(repo: Path, env: dict, *args: str) -> str:
    return run_ok([*AMPBENCH, "decide", "--min-seeds", "2", "--max-seeds", "3", *args], repo, env)


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["train"]["precisions"] = ["fp32", "bf16"]
    # Margins no 16-bit arm of a tiny model misses: the first look decides, so the procedure stops before the max.
    params["evaluate"]["margin"] = {"accuracy_pp": 50.0, "loss": 5.0}
    repo, env = make_project_repo(tmp_path_factory.mktemp("decide") / "project", params)
    return repo, env, _decide(repo, env)


def _runs(repo: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=[TINY["mlflow"]["experiment"]], output_format="list")


def test_decide_stops_at_the_first_look_that_decides(decided):
    repo, env, out = decided
    assert "look 1 of 2: 2 seeds [0, 1]" in out and "look 2 of 2" not in out, out[-3000:]
    details = json.loads((repo / "reports" / "details.json").read_text())
    seq = details["sequential"]
    assert seq["stopped"] is True and seq["seeds"] == 2 and seq["look"] == 1 and seq["looks"] == 2
    assert seq["decided_at_seeds"] == {"bf16": 2}
    assert "every arm decided" in seq["reason"] and "1 seed before the maximum of 3" in seq["reason"]
    assert details["bf16"]["not_worse"] == "not worse" and details["bf16"]["seeds"] == 2
    # The look's stricter level is in the verdict's own words: one-sided bounds past the fixed design's 95%.
    reason = details["bf16"]["statistics"]["accuracy"]["not_worse_reason"]
    assert float(reason.split("one-sided ")[1].split("%")[0]) > 95, reason
    assert json.loads((repo / "reports" / "comparison.json").read_text())["bf16"]["decided_at_seeds"] == 2
    report = (repo / "reports" / "report.md").read_text()
    assert "**Seeds until decided** (stopped): look 1 of 2 (2 seeds)" in report
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["train"]["seeds"] == [0, 1] and params["evaluate"]["sequential"]["max_seeds"] == 3
    # The look is a DVC experiment, and MLflow's parent run of that look says which look and why it stopped.
    assert "Ran experiment(s)" in out
    (parent,) = [r for r in _runs(repo) if r.data.tags.get("ampbench.role") == "execution"]
    tags = parent.data.tags
    assert tags["sequential.look"] == "1 of 2" and tags["sequential.stopped"] == "true"
    assert tags["sequential.seeds"] == "2" and len(tags["sequential.group"]) == 16
    assert "every arm decided" in tags["sequential.reason"]


def test_rerunning_decide_trains_nothing_new(decided):
    repo, env, _ = decided
    before = len(_runs(repo))
    out = _decide(repo, env)
    assert "Running stage 'train@" not in out and "Running stage 'evaluate'" not in out, out[-3000:]
    assert "every arm decided" in out and len(_runs(repo)) == before


def test_decide_refuses_what_no_look_could_run(decided, tmp_path):
    repo, env, _ = decided
    proc = subprocess.run([*AMPBENCH, "decide", "--root", str(repo), "-S", "x=1", "--min-seeds", "4",
                           "--max-seeds", "3"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "--min-seeds" in proc.stderr and "more than --max-seeds 3" in proc.stderr
    params = repo / "params.yaml"
    committed = params.read_text()
    try:
        raw = yaml.safe_load(committed)
        raw["evaluate"]["margin"]["accuracy_pp"] = "auto"
        params.write_text(yaml.safe_dump(raw, sort_keys=False))
        proc = subprocess.run([*AMPBENCH, "decide", "--root", str(repo)], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
    finally:
        params.write_text(committed)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "evaluate.margin.accuracy_pp" in proc.stderr and "sequential" in proc.stderr


def test_a_look_trains_only_its_new_seed_and_the_last_look_stops(decided):
    """A margin no run can clear: look 1 (2 seeds) is undecided, look 2 trains seed 2 alone (seeds 0 and 1 are
    reused from .resume/, kept by train.keep_finished) and stops at the maximum with the undecided arm named."""
    repo, env, _ = decided
    out = _decide(repo, env, "-S", "evaluate.margin.accuracy_pp=0.01")
    assert "look 2 of 2: 3 seeds [0, 1, 2]" in out, out[-3000:]
    assert "seed 2 epoch 1/1" in out and "seed 0 epoch 1/1" not in out and "seed 1 epoch 1/1" not in out
    seq = json.loads((repo / "reports" / "details.json").read_text())["sequential"]
    assert seq["stopped"] is True and seq["seeds"] == 3 and seq["decided_at_seeds"] == {"bf16": None}
    assert seq["reason"] == "look 2 of 2 (3 seeds): the maximum of 3 seeds reached; undecided: bf16"
    assert "undecided" in (repo / "reports" / "report.md").read_text().split("| arm |")[0]


def test_an_added_key_holds_for_every_look(tmp_path):
    """`-S +key=value` for every look: DVC appends such a key and refuses it once it exists, and each look's
    settings stay in params.yaml, so a second look failed on it (found deciding a Lightning job with
    `-S +train.model_args.channels=4`). Every look gives it as `++key=value` (add or override)."""
    from ampbench.errors import ParamsError
    from ampbench.stages.decide import apply_settings, every_look

    assert every_look("+train.model_args.channels=4") == "++train.model_args.channels=4"
    assert [every_look(s) for s in ("++a=1", "a=1", "~a")] == ["++a=1", "a=1", "~a"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"train": {"model_args": {}}}))
    apply_settings(path, (every_look("+train.model_args.channels=4"),))  # the first look: the key is added
    with pytest.raises(ParamsError, match="An item is already at 'train.model_args.channels'"):
        apply_settings(path, ("+train.model_args.channels=4",))  # what the second look did
    apply_settings(path, (every_look("+train.model_args.channels=4"),))
    assert yaml.safe_load(path.read_text())["train"]["model_args"] == {"channels": 4}


@pytest.mark.parametrize("setting, said", [
    ("train.precisions=[fp32,bogus]", "train.precisions.1: Input should be 'fp32'"),
    ("train.epoch=2", "-S train.epoch=2: Could not override 'train.epoch' (no such key in params.yaml)"),
    ("+train.epoch=2", "train.epoch: unknown key (a typo?); did you mean train.epochs?"),
    ("train.epochs=[[", "-S train.epochs=[[: no viable alternative at input '[['")])
def test_a_bad_setting_is_refused_before_any_look_and_changes_nothing(decided, tmp_path, setting, said):
    """Checked as the check stage checks, after DVC's own parser applied it: exit 2 within seconds, one line naming
    the setting, params.yaml byte for byte as it was (the next decide starts from it, not from this one's)."""
    repo, env, _ = decided
    before = (repo / "params.yaml").read_bytes()
    started = time.monotonic()
    proc = subprocess.run([*AMPBENCH, "decide", "-S", setting], cwd=repo, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {said}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not proc.stdout and took < 30  # (a loaded CI machine: not a timing test)
    assert (repo / "params.yaml").read_bytes() == before


def test_a_signal_to_decide_stops_its_look_and_leaves_params_as_they_were(decided):
    """SIGTERM to `ampbench decide` while its look trains: the signal reaches the look's DVC and stage, nothing of
    the pipeline is left 5 s later, decide ends with one line and exit 130, and params.yaml is as before."""
    repo, env, _ = decided
    before = (repo / "params.yaml").read_bytes()
    log = repo.parent / "decide.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*AMPBENCH, "decide", "--min-seeds", "4", "--max-seeds", "5", "-S",
                                 "train.epochs=500"], cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while "epoch 1/500" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "epoch 1/500" in log.read_text(), log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    assert none_left(repo) == []
    text = log.read_text()
    assert text.rstrip().splitlines()[-1].startswith("interrupted (SIGTERM): look 1 was stopped"), text[-3000:]
    # The stage's own line came before: the signal reached it (with why, when its dvc watch saw dvc go first).
    assert "[train@fp32] interrupted (SIGTERM" in text.split("epoch 1/500")[1].split("interrupted (SIGTERM): look")[0]
    assert (repo / "params.yaml").read_bytes() == before
