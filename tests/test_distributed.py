"""DDP through torchrun: 2 CPU processes with gloo match one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import ROOT, TINY

pytestmark = pytest.mark.slow


def _train(tmp, params: dict, name: str, env: dict) -> subprocess.CompletedProcess:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(params))
    return subprocess.run([sys.executable, str(ROOT / "pipeline" / "train.py"), "--precision", "fp32", "--params",
                           str(path), "--data", str(tmp / "prepared"), "--out", str(tmp / name / "fp32"),
                           "--resume-dir", str(tmp / name / "resume")], env=env, capture_output=True, text=True,
                          timeout=600)


def test_two_gloo_processes_match_one_process(tmp_path):
    params = json.loads(json.dumps(TINY))
    params["train"].update({"precisions": ["fp32"], "model": "mlp", "epochs": 2, "batch_size": 32})
    params["mlflow"]["log_model"] = False
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_", "RANK", "LOCAL_RANK",
                                                                     "WORLD_SIZE"))}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    subprocess.run([sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--params", str(tmp_path / "p.yaml"),
                    "--out", str(tmp_path / "prepared")], env=env, check=True, capture_output=True)

    single = _train(tmp_path, params, "single", env)
    assert single.returncode == 0, single.stderr[-2000:]
    params["train"]["nproc_per_node"] = 2
    ddp = _train(tmp_path, params, "ddp", env)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "launching 2 processes" in ddp.stderr and "2 ranks" in ddp.stderr

    a = torch.load(tmp_path / "single" / "fp32" / "seed0.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "ddp" / "fp32" / "seed0.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()  # plain keys: no "module." prefix from DDP
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-4, rtol=1e-4), k
    sa = json.loads((tmp_path / "single" / "fp32" / "summary.json").read_text())
    sb = json.loads((tmp_path / "ddp" / "fp32" / "summary.json").read_text())
    assert sb["world_size"] == 2 and sa["world_size"] == 1
    fa, fb = sa["seeds"]["0"]["final"], sb["seeds"]["0"]["final"]
    assert fb["train_loss"] == pytest.approx(fa["train_loss"], abs=1e-4)  # all-reduced over both ranks
    assert fb["val_loss"] == pytest.approx(fa["val_loss"], abs=1e-4)

    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")
    ddp_runs = [r for r in runs if r.data.params.get("world_size") == "2"]
    assert len(runs) == 2 and len(ddp_runs) == 1  # only rank 0 talks to MLflow
    assert ddp_runs[0].info.status == "FINISHED" and ddp_runs[0].data.tags["world_size"] == "2"
