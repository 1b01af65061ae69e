"""Exact resume: an interrupted arm continues from its last epoch and ends bitwise equal to an uninterrupted one."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ampbench import checkpoint, tracking
from ampbench.data import prepare, save_prepared
from ampbench.errors import ResumeRefused
from ampbench.params import validate
from ampbench.runner import train_arm


@pytest.fixture
def setup(tmp_path, tiny_params, mlflow_store):
    tiny_params["train"].update({"epochs": 4, "seeds": [0, 1], "precisions": ["fp32", "fp16"]})
    tiny_params["mlflow"]["log_model"] = False
    params = validate(tiny_params)
    data_dir = tmp_path / "prepared"
    save_prepared(prepare(params.prepare, tmp_path / "raw"), data_dir)
    return params, data_dir, tmp_path


def _arm(arm, params, data_dir, root, name):
    return train_arm(arm, params, data_dir, root / name / arm, root, {}, resume_dir=root / name / ".resume" / arm,
                     code_version="test")


def _interrupted(monkeypatch, n, *args):
    """Run _arm(*args) with the n-th epoch log raising KeyboardInterrupt (as our SIGTERM handler does)."""
    real, calls = tracking.log_epoch, {"n": 0}

    def flaky(row):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt("SIGTERM")
        real(row)

    with monkeypatch.context() as m:  # undoes only this patch, not the fixture's MLFLOW_TRACKING_URI
        m.setattr(tracking, "log_epoch", flaky)
        with pytest.raises(KeyboardInterrupt):
            _arm(*args)


@pytest.mark.parametrize("arm", ["fp32", "fp16"])
def test_interrupted_then_resumed_equals_uninterrupted(setup, monkeypatch, arm):
    import mlflow

    params, data_dir, root = setup
    whole = _arm(arm, params, data_dir, root, "whole")

    # Seed 0 finishes (4 epochs), seed 1 is interrupted in its 3rd epoch: 4 + 3 = 7th epoch log.
    _interrupted(monkeypatch, 7, arm, params, data_dir, root, "cut")
    left = checkpoint.load(root / "cut" / ".resume" / arm / "seed1.pt")
    assert left["epoch"] == 2 and left["meta"]["done"] is False
    killed = mlflow.get_run(left["meta"]["run_id"])
    assert killed.info.status == "KILLED"

    resumed = _arm(arm, params, data_dir, root, "cut")
    assert not (root / "cut" / ".resume" / arm).exists()  # cleaned up once the arm is complete
    for seed in ("0", "1"):
        a = checkpoint.load(root / "whole" / arm / f"seed{seed}.pt")["model"]
        b = checkpoint.load(root / "cut" / arm / f"seed{seed}.pt")["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), f"seed {seed}: weights differ after resume"
        assert resumed["seeds"][seed]["final"]["val_loss"] == whole["seeds"][seed]["final"]["val_loss"]
    # The resumed seed kept its MLflow run: one run, now FINISHED, with every epoch's metrics.
    run = mlflow.get_run(resumed["seeds"]["1"]["run_id"])
    assert run.info.run_id == left["meta"]["run_id"] and run.info.status == "FINISHED"
    epochs = [m.step for m in mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "val_loss")]
    assert sorted(set(epochs)) == [1, 2, 3, 4]


def test_resuming_across_precisions_is_refused(setup, monkeypatch):
    params, data_dir, root = setup
    _interrupted(monkeypatch, 2, "fp16", params, data_dir, root, "x")
    target = root / "x" / ".resume" / "fp32"
    target.mkdir(parents=True)
    (root / "x" / ".resume" / "fp16" / "seed0.pt").rename(target / "seed0.pt")
    with pytest.raises(ResumeRefused, match="trained as 'fp16'; refusing to resume it as 'fp32'"):
        _arm("fp32", params, data_dir, root, "x")


def test_changed_params_start_over(setup, monkeypatch, tiny_params):
    params, data_dir, root = setup
    _interrupted(monkeypatch, 2, "fp32", params, data_dir, root, "y")
    changed = validate({**tiny_params, "train": {**params.train.model_dump(), "lr": 0.001}})
    _arm("fp32", changed, data_dir, root, "y")
    history = json.loads((root / "y" / "fp32" / "history-seed0.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2, 3, 4]  # all four epochs retrained...
    assert history[0]["lr"] == pytest.approx(0.001 * (1 + math.cos(math.pi / 4)) / 2)  # ...with the new lr
