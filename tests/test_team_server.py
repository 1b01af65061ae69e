"""Team mode: the pipeline against an MLflow server backed by PostgreSQL with a served artifact store.

Needs a running server (`bash scripts/team_server.sh start`, as .ci/run does) named by AMPBENCH_TEAM_SERVER.
Skipped without one, unless AMPBENCH_REQUIRE_TEAM_SERVER=1 (CI), where a missing server is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT, TINY, make_project_repo, run_ok

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> str:
    url = os.environ.get("AMPBENCH_TEAM_SERVER")
    if not url:
        if os.environ.get("AMPBENCH_REQUIRE_TEAM_SERVER") == "1":
            pytest.fail("AMPBENCH_REQUIRE_TEAM_SERVER=1 but AMPBENCH_TEAM_SERVER is not set")
        pytest.skip("no team server (start one: bash scripts/team_server.sh start; export AMPBENCH_TEAM_SERVER=…)")
    return url


def _tiny(experiment: str, **train) -> dict:
    params = json.loads(json.dumps(TINY))
    params["train"].update({"precisions": ["fp32", "bf16"], **train})
    params["mlflow"]["experiment"] = experiment
    return params


def test_pipeline_against_the_server(server, tmp_path):
    from mlflow.tracking import MlflowClient

    import mlflow.pytorch

    experiment = f"team-{uuid.uuid4().hex[:8]}"
    repo, env = make_project_repo(tmp_path / "project", _tiny(experiment))
    env["MLFLOW_TRACKING_URI"] = server
    run_ok([sys.executable, "-m", "dvc", "repro"], repo, env)
    assert not (repo / "mlflow.db").exists()  # nothing went to a local store

    client = MlflowClient(server)
    exp = client.get_experiment_by_name(experiment)
    assert exp.artifact_location.startswith("mlflow-artifacts:")  # artifacts served by the server
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"fp32-seed0", "bf16-seed0", "comparison"}
    for name, run in runs.items():
        assert run.info.status == "FINISHED"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        if name == "comparison":
            assert "report.md" in artifacts and "figures" in artifacts
        else:
            assert {"seed0.pt", "history-seed0.json"} <= artifacts
            assert "test_accuracy" in run.data.metrics
            assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [1]
    local = client.download_artifacts(runs["comparison"].info.run_id, "report.md", str(tmp_path))
    assert "| bf16 |" in open(local).read()
    summary = json.loads((repo / "models" / "bf16" / "summary.json").read_text())
    mlflow.set_tracking_uri(server)
    model = mlflow.pytorch.load_model(summary["seeds"]["0"]["model_uri"])
    assert model is not None


def test_parallel_experiments_lose_nothing(server, tmp_path):
    """Four training processes log to the server at once: four runs, every epoch's metrics."""
    from mlflow.tracking import MlflowClient

    experiment = f"team-par-{uuid.uuid4().hex[:8]}"
    params = _tiny(experiment, precisions=["fp32"], epochs=3)
    params["mlflow"]["log_model"] = False
    import yaml

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    run_ok([sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--params", str(path), "--out",
            str(tmp_path / "prepared")], tmp_path, env)
    env["MLFLOW_TRACKING_URI"] = server
    procs = [subprocess.Popen([sys.executable, str(ROOT / "pipeline" / "train.py"), "--precision", "fp32", "--params",
                               str(path), "--data", str(tmp_path / "prepared"), "--out", str(tmp_path / f"m{i}"),
                               "--resume-dir", str(tmp_path / f"r{i}")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(o[1][-1500:] for o in outs)
    client = MlflowClient(server)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "val_loss")] == [1, 2, 3]
