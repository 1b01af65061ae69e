"""Reliability: interruption, concurrency and determinism, with real processes where it matters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import ROOT, TINY, make_project_repo, run_ok

pytestmark = pytest.mark.slow


def _env(store_uri: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    if store_uri:
        env["MLFLOW_TRACKING_URI"] = store_uri
    return env


def _params(tmp: Path, **train) -> Path:
    p = json.loads(json.dumps(TINY))
    p["train"].update(train)
    p["mlflow"]["log_model"] = False
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _prepare(tmp: Path, params: Path) -> Path:
    data = tmp / "prepared"
    subprocess.run([sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--params", str(params), "--out", str(data)],
                   check=True, capture_output=True, env=_env())
    return data


def _train_cmd(params, data, out, resume, arm="fp32"):
    return [sys.executable, str(ROOT / "pipeline" / "train.py"), "--precision", arm, "--params", str(params),
            "--data", str(data), "--out", str(out), "--resume-dir", str(resume)]


def _runs(uri: str, experiment: str = "ampbench-tests"):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=[experiment], output_format="list")


def test_four_concurrent_writers_lose_nothing(tmp_path):
    """Four training processes start together against one fresh SQLite store: four runs, every metric."""
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    params = _params(tmp_path, epochs=3, seeds=[0])
    data = _prepare(tmp_path, params)
    procs = [subprocess.Popen(_train_cmd(params, data, tmp_path / f"m{i}", tmp_path / f"r{i}"), env=_env(uri),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(o[1][-1500:] for o in outs)
    runs = _runs(uri)
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "val_loss")] == [1, 2, 3]
        assert "train_samples_per_s" in r.data.metrics


def test_sigterm_mid_training_then_resume(tmp_path):
    """SIGTERM mid-epoch: run KILLED, checkpoint loadable, exit ≠ 0; rerun resumes and matches an uninterrupted run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = _params(tmp_path, epochs=40, seeds=[0], precisions=["fp32"])
    data = _prepare(tmp_path, params)
    whole = subprocess.run(_train_cmd(params, data, tmp_path / "whole", tmp_path / "rw"), env=_env(uri),
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]

    resume = tmp_path / "rc"
    proc = subprocess.Popen(_train_cmd(params, data, tmp_path / "cut", resume), env=_env(uri),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = resume / "seed0.pt"
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert ckpt.exists(), "no checkpoint appeared"
    time.sleep(0.3)  # somewhere inside a later epoch
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err
    left = torch.load(ckpt, weights_only=True)
    assert 1 <= left["epoch"] < 40
    killed = [r for r in _runs(uri) if r.info.run_id == left["meta"]["run_id"]]
    assert killed and killed[0].info.status == "KILLED"

    again = subprocess.run(_train_cmd(params, data, tmp_path / "cut", resume), env=_env(uri),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming after epoch {left['epoch']}" in again.stderr
    a = torch.load(tmp_path / "whole" / "seed0.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "seed0.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    finished = [r for r in _runs(uri) if r.info.run_id == left["meta"]["run_id"]]
    assert finished[0].info.status == "FINISHED"


def test_same_params_and_seed_give_bitwise_identical_weights(tmp_path):
    params = _params(tmp_path, epochs=2, seeds=[0], precisions=["fp32", "bf16"])
    data = _prepare(tmp_path, params)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for run in ("a", "b"):
        for arm in ("fp32", "bf16"):
            subprocess.run(_train_cmd(params, data, tmp_path / run / arm, tmp_path / run / f"r{arm}", arm),
                           check=True, capture_output=True, env=_env(uri))
    for arm in ("fp32", "bf16"):
        a = torch.load(tmp_path / "a" / arm / "seed0.pt", weights_only=True)["model"]
        b = torch.load(tmp_path / "b" / arm / "seed0.pt", weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), arm
        ha = json.loads((tmp_path / "a" / arm / "history.json").read_text())["0"]
        hb = json.loads((tmp_path / "b" / arm / "history.json").read_text())["0"]
        assert [r["val_loss"] for r in ha] == [r["val_loss"] for r in hb]


def test_fresh_clone_reproduces_the_committed_metrics(tmp_path):
    """Commit a `dvc repro` (dvc.lock, reports/comparison.json); a fresh clone's `dvc repro` gives the same."""
    params = json.loads(json.dumps(TINY))
    params["train"].update({"precisions": ["fp32", "bf16"], "epochs": 2})
    params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(tmp_path / "origin", params)
    dvc = [sys.executable, "-m", "dvc"]
    run_ok([*dvc, "repro"], repo, env)
    run_ok(["git", "add", "-A"], repo, env)
    run_ok(["git", "commit", "-qm", "results"], repo, env)
    run_ok(["git", "clone", "-q", str(repo), str(tmp_path / "clone")], tmp_path, env)
    clone = tmp_path / "clone"
    run_ok([*dvc, "repro"], clone, env)
    committed = (repo / "reports" / "comparison.json").read_text()
    assert (clone / "reports" / "comparison.json").read_text() == committed
    lock = lambda root: {o["path"]: o["md5"] for o in yaml.safe_load((root / "dvc.lock").read_text())["stages"]["evaluate"]["outs"]}  # noqa: E731
    assert lock(clone)["reports/comparison.json"] == lock(repo)["reports/comparison.json"]
    assert "reports/comparison.json" not in run_ok(["git", "status", "--porcelain"], clone, env)
