"""Reliability: interruption, concurrency and determinism, with real processes where it matters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ARM_RUNS, ROOT, clean_env, prepare_in_process, run_ok, stage_command, train_in_process

pytestmark = pytest.mark.slow


@pytest.fixture
def params(tiny_params, write_params):
    """Write the tiny params with these train changes (and no model logging); returns the file."""
    def write(**train) -> Path:
        tiny_params["train"].update(train)
        tiny_params["mlflow"]["log_model"] = False
        return write_params(tiny_params)

    return write


def _prepare(tmp: Path, params: Path) -> Path:
    data = tmp / "prepared"
    prepare_in_process(params, data)
    return data


def _train_cmd(params, data, out, resume, arm="fp32"):
    return stage_command("train", params, "--precision", arm, "--data", str(data), "--out", str(out),
                         "--resume-dir", str(resume))


# The train stage, sent SIGTERM by itself right after the MLflow metrics of epoch AFTER are logged, as a
# scheduler would send it: deterministic, unlike a signal timed with sleep().
_SIGTERM_AFTER_EPOCH = """
import os, runpy, signal, sys
sys.path[:0] = [{src!r}, {pipeline!r}]
from ampbench import tracking
real, seen = tracking.log_epoch, []
def log_epoch(row, steps=()):
    real(row, steps)
    seen.append(row["epoch"])
    if len(seen) == {after}:
        os.kill(os.getpid(), signal.SIGTERM)
tracking.log_epoch = log_epoch
sys.argv = [{train!r}, *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
"""


def _runs(uri: str, experiment: str = "ampbench-tests"):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=[experiment], output_format="list", filter_string=ARM_RUNS)


def test_four_concurrent_writers_lose_nothing(tmp_path, params):
    """Four training processes start together against one fresh SQLite store: four runs, every metric."""
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    params = params(epochs=3, seeds=[0])
    data = _prepare(tmp_path, params)
    procs = [subprocess.Popen(_train_cmd(params, data, tmp_path / f"m{i}", tmp_path / f"r{i}"),
                              env=clean_env(MLFLOW_TRACKING_URI=uri),
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


def test_sigterm_mid_training_then_resume(tmp_path, params):
    """SIGTERM during epoch 3: run KILLED, exit ≠ 0, no traceback, the checkpoint of epoch 2 kept; the rerun
    resumes there and ends bitwise equal to an uninterrupted run, in the same (now FINISHED) MLflow run."""
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    params = params(epochs=5, seeds=[0], precisions=["fp32"])
    data = _prepare(tmp_path, params)
    train_in_process(_train_cmd(params, data, tmp_path / "whole", tmp_path / "rw")[2:], env["MLFLOW_TRACKING_URI"])

    resume = tmp_path / "rc"
    driver = _SIGTERM_AFTER_EPOCH.format(src=str(ROOT / "src"), pipeline=str(ROOT / "pipeline"), after=3,
                                         train=str(ROOT / "pipeline" / "train.py"))
    cut = subprocess.run([sys.executable, "-c", driver, *_train_cmd(params, data, tmp_path / "cut", resume)[2:]],
                         env=env, capture_output=True, text=True, timeout=300)
    assert cut.returncode != 0 and "interrupted (SIGTERM)" in cut.stderr, cut.stderr[-2000:]
    assert "Traceback" not in cut.stderr
    left = torch.load(resume / "seed0.pt", weights_only=True)
    assert left["epoch"] == 2  # epoch 3's metrics were logged, its checkpoint not yet written
    run_id = left["meta"]["resume"]["run_id"]
    assert [r.info.status for r in _runs(env["MLFLOW_TRACKING_URI"]) if r.info.run_id == run_id] == ["KILLED"]

    again = run_ok(_train_cmd(params, data, tmp_path / "cut", resume), tmp_path, env)
    assert "resuming after epoch 2 of 5" in again
    a = torch.load(tmp_path / "whole" / "seed0.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "seed0.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r.info.status for r in _runs(env["MLFLOW_TRACKING_URI"]) if r.info.run_id == run_id] == ["FINISHED"]


def test_same_params_and_seed_give_bitwise_identical_weights(tmp_path, params, monkeypatch):
    """Run a in this process, run b in fresh processes: the same weights, bit for bit, and the same file bytes."""
    from click.testing import CliRunner

    from test_cli import _stage

    params = params(epochs=2, seeds=[0], precisions=["fp32", "bf16"])
    data = _prepare(tmp_path, params)
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    for arm in ("fp32", "bf16"):
        result = CliRunner().invoke(_stage("train"), _train_cmd(params, data, tmp_path / "a" / arm,
                                                                 tmp_path / "a" / f"r{arm}", arm)[2:])
        assert result.exit_code == 0, result.output
        run_ok(_train_cmd(params, data, tmp_path / "b" / arm, tmp_path / "b" / f"r{arm}", arm), tmp_path, env)
    for arm in ("fp32", "bf16"):
        a = torch.load(tmp_path / "a" / arm / "seed0.pt", weights_only=True)["model"]
        b = torch.load(tmp_path / "b" / arm / "seed0.pt", weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), arm
        # The same bytes too (DVC hashes the files): nothing in a checkpoint depends on when or where it was written.
        assert (tmp_path / "a" / arm / "seed0.pt").read_bytes() == (tmp_path / "b" / arm / "seed0.pt").read_bytes()
        ha = json.loads((tmp_path / "a" / arm / "history.json").read_text())["seeds"]["0"]
        hb = json.loads((tmp_path / "b" / arm / "history.json").read_text())["seeds"]["0"]
        assert [r["val_loss"] for r in ha] == [r["val_loss"] for r in hb]
