"""Inputs and environments at their edges (the third reliability round): files others can read, tracking URIs,
params, settings that would silently change an arm, and user code that raises. Real processes where the
behaviour is a process's."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import clean_env, stage_command


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
