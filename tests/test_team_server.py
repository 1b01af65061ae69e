"""Team mode: the pipeline against an MLflow server backed by PostgreSQL with a served artifact store.

Needs a running server (`bash scripts/team_server.sh start`, as .ci/run does) named by AMPBENCH_TEAM_SERVER.
Skipped without one, unless AMPBENCH_REQUIRE_TEAM_SERVER=1 (CI), where a missing server is a failure.
The script's own tests read that server's TEAM_DIR (default .team) and start a second server (root, as in CI).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

import pytest

from conftest import ARM_RUNS, ROOT, clean_env, make_project_repo, prepare_in_process, run_ok, stage_command

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


def _team_dir() -> Path:
    return ROOT / os.environ.get("TEAM_DIR", ".team")  # the script resolves a relative TEAM_DIR from the repo root


def _leaks(secret: str, team_dir: Path) -> list[str]:
    """Every process command line (any user can read them) and the server's log that hold ``secret``, as typed
    or percent-encoded as in the store URI."""
    forms = {secret.encode(), urllib.parse.quote(secret, safe="").encode()}
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ")
        except OSError:  # the process ended meanwhile
            continue
        if any(f in text for f in forms):
            found.append(f"{cmdline}: {text[:200]!r}")
    log = (team_dir / "mlflow.log").read_bytes()
    return found + ["mlflow.log" for f in forms if f in log]


def _password(team_dir: Path) -> str:
    path = team_dir / "db-password"
    assert path.is_file(), f"no {path}: the docs say the database password is kept there"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path.read_text()


def test_no_password_on_any_command_line_or_in_the_log(server):
    """The running server's password (generated, kept in TEAM_DIR/db-password) is in no process's arguments:
    not the MLflow server's (it used to pass --backend-store-uri postgresql://ampbench:ampbench@…), not its workers'."""
    team_dir = _team_dir()
    password = _password(team_dir)
    assert len(password) >= 16 and password != "ampbench"  # generated, not the old constant
    pid = (team_dir / "mlflow.pid").read_text().strip()
    assert b"server" in Path(f"/proc/{pid}/cmdline").read_bytes()  # that server is the one running
    assert _leaks(password, team_dir) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _psql(sql: str) -> str:
    return subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-qtAXc", sql], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_hostile_password_works_and_injects_nothing(server, tmp_path):
    """Quotes, a backslash, spaces, $ and URI delimiters in AMPBENCH_DB_PASSWORD: the role gets exactly that
    password (it used to be pasted into CREATE ROLE … PASSWORD '…'), no SQL in it runs, it is kept for the next
    start, and it is on no command line. A role and database of its own leave the CI server's alone."""
    if os.geteuid() != 0:
        pytest.skip("starting PostgreSQL roles needs root (as in CI)")
    import psycopg2
    from mlflow.tracking import MlflowClient

    name = f"ampbench_t{uuid.uuid4().hex[:8]}"
    password = f"a'b\"c\\d $HOME `id` %41@/:#?'; CREATE ROLE {name}_pwned; --"
    port = _free_port()
    team_dir = tmp_path / "team"
    env = clean_env(TEAM_DIR=str(team_dir), MLFLOW_PORT=str(port), AMPBENCH_DB_USER=name, AMPBENCH_DB_NAME=name,
                    MLFLOW_BIN=str(Path(sys.executable).parent / "mlflow"))
    script = ["bash", str(ROOT / "scripts" / "team_server.sh")]

    def start(**extra: str) -> None:
        env.pop("AMPBENCH_DB_PASSWORD", None)
        done = subprocess.run([*script, "start"], env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert password not in done.stdout + done.stderr
        MlflowClient(f"http://127.0.0.1:{port}").search_experiments()  # the server reaches its store

    try:
        start(AMPBENCH_DB_PASSWORD=password)
        psycopg2.connect(host="127.0.0.1", user=name, dbname=name, password=password).close()
        assert _psql(f"SELECT count(*) FROM pg_roles WHERE rolname = '{name}_pwned'") == "0"
        assert _password(team_dir) == password
        assert _leaks(password, team_dir) == []
        subprocess.run([*script, "stop"], env=env, check=True, capture_output=True, timeout=60)
        start()  # no override: the kept password, which the role still has
        assert _leaks(password, team_dir) == []
    finally:
        subprocess.run([*script, "stop"], env=env, capture_output=True, timeout=60)
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        _psql(f"DROP ROLE IF EXISTS {name}; DROP ROLE IF EXISTS {name}_pwned")
