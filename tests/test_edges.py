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
    from ampbench.fileio import atomic_write_json, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "shared.txt", "x")
        os.umask(0o077)
        atomic_write_json(tmp_path / "private.json", {"a": 1})
    finally:
        os.umask(old)
    assert _modes(tmp_path) == {"shared.txt": 0o644, "private.json": 0o600}


@pytest.mark.slow
def test_outputs_and_mlflow_artifacts_are_readable_as_the_umask_allows(tmp_path, tiny_params, write_params):
    """Prepared data, a model folder and the MLflow artifacts of a real train stage, under umask 022: every file
    group- and world-readable, as a shared artifact folder or a DVC remote filled from it needs."""
    tiny_params["mlflow"]["log_model"] = True
    params = write_params(tiny_params)
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")

    def run(*cmd):
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                              preexec_fn=lambda: os.umask(0o022))
        assert proc.returncode == 0, proc.stderr[-3000:]

    run(*stage_command("prepare", params, "--out", str(tmp_path / "prepared")))
    run(*stage_command("train", params, "--precision", "fp32", "--data", str(tmp_path / "prepared"),
                       "--out", str(tmp_path / "models" / "fp32")))
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
        self.calls += 1
        if self.calls > 4:
            raise ValueError("my layer saw a batch it cannot handle")
        return self.net(x)


def build(shape, classes):
    return Fragile(shape, classes)
'''


@pytest.mark.slow
def test_an_error_in_your_code_mid_training_is_one_line_naming_your_frame(tmp_path, tiny_params, write_params):
    """It was a 46-line traceback; now the exception and the file:line in the user's module, the run FAILED, and the
    whole traceback behind --debug (AMPBENCH_DEBUG=1 under dvc)."""
    import mlflow

    code = tmp_path / "mycode"
    code.mkdir()
    (code / "fragile.py").write_text(FRAGILE)
    tiny_params["train"].update(model="fragile:build", model_code=str(code / "fragile.py"), epochs=3)
    tiny_params["mlflow"]["log_model"] = False
    params = write_params(tiny_params)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = clean_env(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(code))

    def train(**extra):
        run = subprocess.run(stage_command("prepare", params, "--out", str(tmp_path / "prepared")), cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        return subprocess.run(stage_command("train", params, "--precision", "fp32", "--data",
                                            str(tmp_path / "prepared"), "--out", str(tmp_path / "models")),
                              cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=300)

    proc = train()
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(err) == 1 and "ValueError: my layer saw a batch it cannot handle" in err[0], proc.stderr[-2000:]
    assert f"raised in your code at {code / 'fragile.py'}:16 (forward)" in err[0]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string=ARM_RUNS)
    assert runs and {r.info.status for r in runs} == {"FAILED"}
    debug = train(AMPBENCH_DEBUG="1")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "fragile.py" in debug.stderr
