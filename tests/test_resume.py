"""Exact resume: an interrupted arm continues from its last epoch and ends bitwise equal to an uninterrupted one;
finished seeds are reused with all their outputs; other params, data or code start over."""

from __future__ import annotations

import json

import pytest
import torch

from ampbench.config.layout import ArmFiles
from ampbench.config.validation import validate
from ampbench.data.prepare import prepare, save_prepared
from ampbench.errors import ResumeRefused
from ampbench.stages.train import train_arm
from ampbench.training import checkpoint
from conftest import interrupted_at_epoch_log


@pytest.fixture
def setup(tmp_path, tiny_params, mlflow_store):
    tiny_params["train"].update({"epochs": 4, "seeds": [0, 1], "precisions": ["fp32", "fp16"]})
    tiny_params["mlflow"]["log_model"] = False
    params = validate(tiny_params)
    data_dir = tmp_path / "prepared"
    save_prepared(prepare(params.prepare, tmp_path / "raw"), data_dir)
    return params, data_dir, tmp_path


def _untimed(path):
    """The rows of a per-seed JSON file without wall-clock timings (which never repeat)."""
    return [{k: v for k, v in row.items() if k not in ("samples_per_s", "epoch_seconds", "input_wait_seconds")}
            for row in json.loads(path.read_text())]


def _arm(arm, params, data_dir, root, name):
    return train_arm(arm, params, data_dir, root / name / arm, root, {}, resume_dir=root / name / ".resume" / arm,
                     code_version="test")


def _interrupted(monkeypatch, n, *args):
    """Run _arm(*args) with the n-th epoch log raising KeyboardInterrupt (as our SIGTERM handler does)."""
    interrupted_at_epoch_log(monkeypatch, n, lambda: _arm(*args))


# bf16_sr: torchao's optimizer keeps its lr as a tensor and draws its rounding from the RNG, and must come back
# from a checkpoint exactly (bf16_kahan's compensation buffers are plain optimizer state, as fp32's moments are).
@pytest.mark.parametrize("arm", ["fp32", "fp16", "bf16_sr"])
def test_interrupted_then_resumed_equals_uninterrupted(setup, monkeypatch, arm):
    import mlflow

    params, data_dir, root = setup
    whole = _arm(arm, params, data_dir, root, "whole")

    # Seed 0 finishes (4 epochs), seed 1 is interrupted in its 3rd epoch: 4 + 3 = 7th epoch log.
    _interrupted(monkeypatch, 7, arm, params, data_dir, root, "cut")
    left = checkpoint.load(root / "cut" / ".resume" / arm / "seed1.pt")["meta"]["resume"]
    assert len(left["records"]) == 2 and left["done"] is None
    killed = mlflow.get_run(left["run_id"])
    assert killed.info.status == "KILLED"

    resumed = _arm(arm, params, data_dir, root, "cut")
    assert not (root / "cut" / ".resume" / arm).exists()  # cleaned up once the arm is complete
    whole_files, cut_files = ArmFiles(root / "whole" / arm), ArmFiles(root / "cut" / arm)
    for seed in (0, 1):
        a, b = checkpoint.load(whole_files.checkpoint(seed)), checkpoint.load(cut_files.checkpoint(seed))
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), f"seed {seed}: weights differ"
        assert a["meta"] == b["meta"] and "resume" not in b["meta"]  # what the model is, nothing resume-only
        assert resumed["seeds"][str(seed)]["final"]["val_loss"] == whole["seeds"][str(seed)]["final"]["val_loss"]
        # Seed 0 finished before the interruption and was reused: its files are all there, as if never cut.
        for which in ("seed_history", "grad_layers"):
            rows = [_untimed(getattr(files, which)(seed)) for files in (whole_files, cut_files)]
            assert rows[0] == rows[1], f"seed {seed}: {which} differs"
    # The resumed seed kept its MLflow run: one run, now FINISHED, with every epoch's metrics.
    run = mlflow.get_run(resumed["seeds"]["1"]["run_id"])
    assert run.info.run_id == left["run_id"] and run.info.status == "FINISHED"
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
    changed = validate({**tiny_params, "train": {**params.train.to_dict(), "lr": 0.001}})
    _arm("fp32", changed, data_dir, root, "y")
    _arm("fp32", changed, data_dir, root, "fresh")  # the same params, never interrupted
    started_over, fresh = (json.loads(ArmFiles(root / name / "fp32").seed_history(0).read_text())
                           for name in ("y", "fresh"))
    assert [row["epoch"] for row in started_over] == [1, 2, 3, 4]  # all four epochs retrained...
    assert [r["val_loss"] for r in started_over] == [r["val_loss"] for r in fresh]  # ...exactly as a fresh run
