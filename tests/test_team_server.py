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

from conftest import ARM_RUNS, clean_env, make_project_repo, prepare_in_process, run_ok, stage_command

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> str:
    url = os.environ.get("AMPBENCH_TEAM_SERVER")
    if not url:
        if os.environ.get("AMPBENCH_REQUIRE_TEAM_SERVER") == "1":
            pytest.fail("AMPBENCH_REQUIRE_TEAM_SERVER=1 but AMPBENCH_TEAM_SERVER is not set")
        pytest.skip("no team server (start one: bash scripts/team_server.sh start; export AMPBENCH_TEAM_SERVER=…)")
    return url


@pytest.fixture
def team_params(tiny_params):
    """The tiny params in a fresh experiment of the server, with fp32 and bf16 (and these train changes)."""
    def make(prefix: str, **train) -> dict:
        tiny_params["train"].update({"precisions": ["fp32", "bf16"], **train})
        tiny_params["mlflow"]["experiment"] = f"{prefix}-{uuid.uuid4().hex[:8]}"
        return tiny_params

    return make


def test_pipeline_against_the_server(server, tmp_path, team_params):
    import mlflow.pytorch
    from mlflow.tracking import MlflowClient

    params = team_params("team")
    experiment = params["mlflow"]["experiment"]
    repo, env = make_project_repo(tmp_path / "project", params)
    env["MLFLOW_TRACKING_URI"] = server
    run_ok([sys.executable, "-m", "dvc", "repro"], repo, env)
    assert not (repo / "mlflow.db").exists()  # nothing went to a local store

    client = MlflowClient(server)
    exp = client.get_experiment_by_name(experiment)
    assert exp.artifact_location.startswith("mlflow-artifacts:")  # artifacts served by the server
    all_runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in all_runs if r.data.tags["ampbench.role"] == "execution"]
    runs = {r.info.run_name: r for r in all_runs if r is not parent}
    assert set(runs) == {"fp32-seed0", "bf16-seed0"}
    assert {"report.md", "figures"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    for run in (parent, *runs.values()):
        assert run.info.status == "FINISHED"
    for run in runs.values():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"seed0.pt", "history-seed0.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
        assert "test_acc" in run.data.metrics
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [1]
    local = client.download_artifacts(parent.info.run_id, "report.md", str(tmp_path))
    assert "| bf16 |" in open(local).read()
    summary = json.loads((repo / "models" / "bf16" / "summary.json").read_text())
    mlflow.set_tracking_uri(server)
    model = mlflow.pytorch.load_model(summary["seeds"]["0"]["model_uri"])
    assert model is not None


def test_parallel_experiments_lose_nothing(server, tmp_path, team_params, write_params):
    """Four training processes log to the server at once: four runs, every epoch's metrics."""
    from mlflow.tracking import MlflowClient

    params = team_params("team-par", precisions=["fp32"], epochs=3)
    params["mlflow"]["log_model"] = False
    experiment = params["mlflow"]["experiment"]
    path = write_params(params)
    prepare_in_process(path, tmp_path / "prepared")
    env = clean_env(MLFLOW_TRACKING_URI=server)
    procs = [subprocess.Popen(stage_command("train", path, "--precision", "fp32", "--data", str(tmp_path / "prepared"),
                                            "--out", str(tmp_path / f"m{i}"), "--resume-dir", str(tmp_path / f"r{i}")),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(o[1][-1500:] for o in outs)
    client = MlflowClient(server)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=ARM_RUNS)  # not their parent runs
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "val_loss")] == [1, 2, 3]
