"""Inputs and environments at their edges (the third reliability round): files others can read, tracking URIs,
params, settings that would silently change an arm, and user code that raises. Real processes where the
behaviour is a process's."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import ARM_RUNS, clean_env, stage_command


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}


def test_atomic_writes_honour_the_umask(tmp_path):
    from ampbench.runtime.files import atomic_write_json, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "shared.txt", "x")
        os.umask(0o077)
        atomic_write_json(tmp_path / "private.json", {"a": 1})
    finally:
        os.umask(old)
    assert _modes(tmp_path) == {"shared.txt": 0o644, "private.json": 0o600}


def test_outputs_and_mlflow_artifacts_are_readable_as_the_umask_allows(tmp_path, tiny_params, write_params,
                                                                      mlflow_store):
    """Prepared data, a model folder and the MLflow artifacts of the train stage, under umask 022: every file
    group- and world-readable, as a shared artifact folder or a DVC remote filled from it needs. (In this process:
    the umask is the process's, and the stages' writes are the same in a process of their own.)"""
    from conftest import prepare_in_process, train_in_process

    tiny_params["mlflow"]["log_model"] = True
    params = write_params(tiny_params)
    old = os.umask(0o022)
    try:
        prepare_in_process(params, tmp_path / "prepared")
        train_in_process(["--params", params, "--precision", "fp32", "--data", tmp_path / "prepared", "--out",
                          tmp_path / "models" / "fp32", "--resume-dir", tmp_path / ".resume"], mlflow_store)
    finally:
        os.umask(old)
    for folder in ("prepared", "models", "mlartifacts"):
        modes = _modes(tmp_path / folder)
        assert modes, folder
        unreadable = {name: oct(m) for name, m in modes.items() if m & 0o044 != 0o044}
        assert not unreadable, (folder, unreadable)


FRAGILE = '''
from torch import nn


class Fragile(nn.Module):
    """Trains a few steps, then raises: a bug in the user's own forward."""

    def __init__(self, shape, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], classes))
        self.calls = 0

    def forward(self, x):
        self.calls += self.training  # training-mode calls: the dry run also evaluates, in eval mode
        if self.calls > 4:
            raise ValueError("my layer saw a batch it cannot handle")
        return self.net(x)


def build(shape, classes):
    return Fragile(shape, classes)
'''


@pytest.mark.slow
def test_an_error_in_your_code_mid_training_is_one_line_naming_your_frame(tmp_path, tiny_params, write_params,
                                                                          monkeypatch):
    """It was a 46-line traceback; now the exception and the file:line in the user's module (a real train process),
    the run FAILED, and the whole traceback behind --debug (AMPBENCH_DEBUG=1 under dvc)."""
    import mlflow
    from click.testing import CliRunner
    from pipeline.train import main as train_stage

    from conftest import prepare_in_process, torch_flags_restored

    code = tmp_path / "mycode"
    code.mkdir()
    (code / "fragile.py").write_text(FRAGILE)
    tiny_params["train"].update(model="fragile:build", model_code=str(code / "fragile.py"), epochs=3)
    tiny_params["mlflow"]["log_model"] = False
    params = write_params(tiny_params)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.syspath_prepend(str(code))
    data = prepare_in_process(params, tmp_path / "prepared")
    args = ["--params", str(params), "--precision", "fp32", "--data", str(data), "--out", str(tmp_path / "models")]
    proc = subprocess.run(stage_command("train", params, *args[2:]), cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=clean_env(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(code)))
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(err) == 1 and "ValueError: my layer saw a batch it cannot handle" in err[0], proc.stderr[-2000:]
    assert f"raised in your code at {code / 'fragile.py'}:16 (forward)" in err[0]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list", filter_string=ARM_RUNS)
    assert runs and {r.info.status for r in runs} == {"FAILED"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with torch_flags_restored():  # --debug: the exception itself comes out, with its traceback
        result = CliRunner().invoke(train_stage, args, env={"AMPBENCH_DEBUG": "1"})
    assert isinstance(result.exception, ValueError) and "my layer saw a batch" in str(result.exception)


@pytest.mark.slow
def test_a_request_far_larger_than_the_default_says_its_plan_and_estimate(tmp_path, tiny_params, write_params):
    """200 seeds started 400 runs without a word about the size of what was asked. A request over 10× the default
    run's arms × seeds × epochs prints its plan first and its estimated time after the first epoch (here the stage
    is stopped during the second)."""
    import sys

    from conftest import ROOT, prepare_in_process
    from test_reliability import _SIGTERM_AFTER_EPOCH

    tiny_params["train"].update(precisions=["fp32"], seeds=list(range(100)), epochs=25)
    tiny_params["mlflow"]["log_model"] = False
    params = write_params(tiny_params)
    data = prepare_in_process(params, tmp_path / "prepared")
    driver = _SIGTERM_AFTER_EPOCH.format(src=str(ROOT / "src"), pipeline=str(ROOT / "pipeline"), after=2,
                                         train=str(ROOT / "pipeline" / "train.py"))
    proc = subprocess.run([sys.executable, "-c", driver, "--params", str(params), "--precision", "fp32", "--data",
                           str(data), "--out", str(tmp_path / "models")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env=clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert "interrupted (SIGTERM)" in proc.stderr, proc.stderr[-3000:]
    assert ("plan: 1 arm × 100 seeds × 25 epochs = 2,500 epochs of training, 16× the default run (4 arms × 5 seeds × "
            "8 epochs); the time it takes is estimated after the first epoch") in proc.stderr
    plan, epoch1, estimate = (proc.stderr.index(s) for s in ("plan:", "epoch 1/25", "estimate: this arm about"))
    assert plan < epoch1 < estimate and "2,500 epochs at" in proc.stderr
