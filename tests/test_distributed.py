"""DDP through torchrun: 2 CPU processes with gloo match one process with the same global batch."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import ARM_RUNS, clean_env, prepare_in_process, run_ok, stage_command

pytestmark = pytest.mark.slow


def _train(tmp, params_file, name: str, env: dict) -> str:
    return run_ok(stage_command("train", params_file, "--precision", "fp32", "--data", str(tmp / "prepared"),
                                "--out", str(tmp / name / "fp32"), "--resume-dir", str(tmp / name / "resume")),
                  tmp, env)


def test_two_gloo_processes_match_one_process(tmp_path, tiny_params, write_params):
    tiny_params["train"].update({"precisions": ["fp32"], "model": "mlp", "width": 64, "epochs": 2, "batch_size": 32})
    tiny_params["mlflow"]["log_model"] = False
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    single_params = write_params(tiny_params, "single.yaml")
    prepare_in_process(single_params, tmp_path / "prepared")

    _train(tmp_path, single_params, "single", env)
    tiny_params["train"]["nproc_per_node"] = 2
    out = _train(tmp_path, write_params(tiny_params, "ddp.yaml"), "ddp", env)
    assert "launching 2 processes" in out and "2 ranks" in out

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
    runs = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list", filter_string=ARM_RUNS)
    ddp_runs = [r for r in runs if r.data.params.get("world_size") == "2"]
    assert len(runs) == 2 and len(ddp_runs) == 1  # only rank 0 talks to MLflow
    parents = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list",
                                 filter_string="tags.`ampbench.role` = 'execution'")
    assert len(parents) == 2  # one per execution (other params: nproc_per_node), none from rank 1
    assert ddp_runs[0].info.status == "FINISHED" and ddp_runs[0].data.tags["world_size"] == "2"
