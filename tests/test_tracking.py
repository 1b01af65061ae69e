"""The MLflow module: store location, safe URIs, run lifecycle."""

import pytest

from ampbench import tracking
from ampbench.errors import AmpbenchError


def test_default_store_is_absolute_at_the_project_root(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, artifacts = tracking.store_uris(tmp_path / "proj")
    assert uri == f"sqlite:///{tmp_path / 'proj' / 'mlflow.db'}"
    assert artifacts == (tmp_path / "proj" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.store_uris(tmp_path) == ("http://127.0.0.1:5000", None)


@pytest.mark.parametrize("uri, shown", [
    ("postgresql://mlflow:s3cret@db:5432/mlflow", "postgresql://mlflow:***@db:5432/mlflow"),
    ("https://user:pw@mlflow.example/", "https://user:***@mlflow.example/"),
    ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
])
def test_redact_hides_passwords(uri, shown):
    assert tracking.redact(uri) == shown


def test_runs_record_the_uri_without_secrets(tmp_path, monkeypatch):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking.setup(tmp_path, "t")
    with tracking.open_run("r", {}, {"a": "1"}) as run_id:
        pass
    run = mlflow.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ampbench.tracking_uri"] == uri


def test_crash_ends_run_failed_and_interrupt_killed(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    tracking.setup(tmp_path, "t")
    ids = {}
    for exc, key in ((ValueError("boom"), "crash"), (KeyboardInterrupt("SIGTERM"), "kill")):
        with pytest.raises(type(exc)):
            with tracking.open_run(key, {}, {}) as run_id:
                ids[key] = run_id
                raise exc
    crash, kill = mlflow.get_run(ids["crash"]), mlflow.get_run(ids["kill"])
    assert crash.info.status == "FAILED" and crash.data.tags["ampbench.error"] == "ValueError: boom"
    assert kill.info.status == "KILLED" and kill.data.tags["ampbench.ended_by"] == "SIGTERM"


def test_deleted_experiment_is_a_clear_error(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    exp_id = tracking.setup(tmp_path, "gone")
    mlflow.delete_experiment(exp_id)
    with pytest.raises(AmpbenchError, match="is deleted"):
        tracking.setup(tmp_path, "gone")


def test_a_row_inserted_by_a_concurrent_writer_is_retried_not_fatal():
    """Four experiments logging the same data set to PostgreSQL at once: one insert loses the race with
    "duplicate key value violates unique constraint"; the retry finds the row (seen in CI, 1 run of 3)."""
    from ampbench.tracking.retry import retry

    calls = []

    def log_input():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError('duplicate key value violates unique constraint "dataset_pk"')
        return "logged"

    assert retry(log_input)() == "logged" and len(calls) == 2


# --- issue 14: artifact locations, credentials, dead runs, broken stores ---------------------------------------

def test_user_stores_get_lasting_artifact_locations(tmp_path, monkeypatch):
    """Artifacts never land in the folder a stage happens to run in (DVC's temporary copy, a per-clone folder)."""
    project = tmp_path / "proj"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'shared' / 'team.db'}")
    assert tracking.store_uris(project)[1] == (tmp_path / "shared" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel/team.db")  # relative: to the project, not the cwd
    assert tracking.store_uris(project) == (f"sqlite:///{project / 'rel' / 'team.db'}",
                                            (project / "rel" / "mlartifacts").as_uri())
    monkeypatch.setenv("AMPBENCH_ARTIFACT_LOCATION", "s3://bucket/ampbench")  # the user's choice wins
    assert tracking.store_uris(project)[1] == "s3://bucket/ampbench"
    monkeypatch.delenv("AMPBENCH_ARTIFACT_LOCATION")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://u:pw@db/mlflow")
    uri, location = tracking.store_uris(project)
    with pytest.raises(AmpbenchError, match="set AMPBENCH_ARTIFACT_LOCATION") as err:
        tracking.store.check_artifact_location(uri, location)
    assert "pw" not in str(err.value)
    with pytest.raises(AmpbenchError, match="inside a DVC temporary copy"):
        tracking.store.check_existing_location("e", "file:///x/.dvc/tmp/exps/tmpab12/mlruns/1")


def test_a_new_experiment_in_a_new_user_store_keeps_artifacts_beside_it(tmp_path, monkeypatch):
    import mlflow

    (tmp_path / "copy").mkdir()
    monkeypatch.chdir(tmp_path / "copy")  # the stage runs in a temporary copy; MLflow's default is ./mlruns there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store' / 'new.db'}")
    exp_id = tracking.setup(tmp_path / "proj", "fresh")
    assert mlflow.get_experiment(exp_id).artifact_location == (tmp_path / "store" / "mlartifacts").as_uri()


def test_passwords_are_masked_everywhere():
    uri = "postgresql://mlflow:s3cret@db:5432/mlflow"
    text = f"could not connect to {uri}: password authentication failed (password s3cret)"
    assert "s3cret" not in tracking.mask(text, uri)
    assert tracking.mask("nothing to hide", "sqlite:////x.db") == "nothing to hide"


def test_credentials_in_a_server_uri_go_into_a_header_not_the_host_lookup(tmp_path):
    """http://user:password@host: the health check reaches the host and sends Basic auth (it used to look up
    "user:password@host" and call the server unreachable)."""
    import base64
    import http.server
    import threading

    seen = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracking.check_uri(f"http://alice:pa55word@127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert seen == [("/health", "Basic " + base64.b64encode(b"alice:pa55word").decode())]
    with pytest.raises(AmpbenchError, match="unreachable") as err:
        tracking.check_uri(f"http://alice:pa55word@127.0.0.1:{server.server_port}")  # now down
    assert "pa55word" not in str(err.value)


def test_runs_of_dead_processes_are_closed_and_live_ones_kept(tmp_path, monkeypatch):
    import subprocess

    import mlflow

    from ampbench.runtime import processes

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    exp = tracking.setup(tmp_path, "t")
    alive = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    ids = {}
    try:
        for name, pid in (("alive", alive.pid), ("dead", dead.pid), ("me", None)):
            host = processes.Identity.current().host
            who = (processes.Identity.current() if pid is None
                   else processes.Identity(host, pid, processes.start_time(pid) or "gone"))
            ids[name] = mlflow.MlflowClient().create_run(exp, tags=who.tags()).info.run_id
        foreign = mlflow.MlflowClient().create_run(exp, tags={**processes.Identity("elsewhere", dead.pid, "1").tags()})
        assert tracking.close_dead_runs(exp) == [ids["dead"]]
        assert mlflow.get_run(ids["dead"]).info.status == "KILLED"
        assert "died" in mlflow.get_run(ids["dead"]).data.tags["ampbench.ended_by"]
        assert {mlflow.get_run(i).info.status for i in (ids["alive"], ids["me"], foreign.info.run_id)} == {"RUNNING"}
    finally:
        alive.kill()
        alive.wait()
    assert tracking.close_dead_runs(exp) == [ids["alive"]]


def test_a_store_made_half_way_is_removed_not_left_broken(tmp_path, monkeypatch):
    """A failure while a new SQLite store is being created (disk full, a signal) removes the partial file: the next
    attempt creates it afresh instead of failing on "table … already exists"."""
    import mlflow

    db = tmp_path / "new.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    real = mlflow.get_experiment_by_name

    def full(name):
        real(name)  # MLflow has created (part of) its tables by now
        raise OSError(28, "database or disk is full")

    monkeypatch.setattr(mlflow, "get_experiment_by_name", full)
    with pytest.raises(AmpbenchError, match="disk is full"):
        tracking.setup(tmp_path, "t")
    assert not db.exists()
    monkeypatch.setattr(mlflow, "get_experiment_by_name", real)
    assert tracking.setup(tmp_path, "t")


def test_a_store_failing_while_closing_a_run_leaves_the_original_error(tmp_path, monkeypatch):
    """The KILLED/FAILED bookkeeping never replaces the error that caused it, and forgets the run in this process
    (nothing may end it FINISHED later)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    tracking.setup(tmp_path, "t")

    def dead_store(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("connection refused")

    with pytest.raises(ValueError, match="boom"):
        with tracking.open_run("r", {}, {}) as run_id:
            monkeypatch.setattr(MlflowClient, "set_terminated", dead_store)
            raise ValueError("boom")
    assert mlflow.active_run() is None
    assert mlflow.get_run(run_id).info.status == "RUNNING"  # for the next run's close_dead_runs


def _finished(arm, parent):
    with tracking.open_run(f"{arm}-seed0", {"precision": arm}, {}, parent_id=parent):
        pass


def test_one_parent_per_execution_rerun_gets_a_new_one_added_arm_joins(tmp_path, monkeypatch):
    """The train stages of one execution share its parent; a rerun of the same execution (every arm again) gets a
    new parent; an arm added later, or retried after failing, joins the newest parent that lacks it."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    exp = tracking.setup(tmp_path, "t")
    first = {arm: tracking.execution_parent(exp, "k1", "exp-a", arm, {"dvc.exp_name": "exp-a"}, {"train.lr": "0.1"})
             for arm in ("fp32", "fp16")}
    assert first["fp32"] == first["fp16"]
    parent = first["fp32"]
    for arm in ("fp32", "fp16"):
        _finished(arm, parent)
    run = mlflow.get_run(parent)
    assert run.info.run_name == "exp-a" and run.info.status == "FINISHED"  # a container: never left RUNNING
    assert run.data.tags["ampbench.role"] == "execution" and run.data.params == {"train.lr": "0.1"}

    assert tracking.execution_parent(exp, "k1", "exp-a", "bf16", {}, {}) == parent  # an arm added later
    rerun = tracking.execution_parent(exp, "k1", "exp-a", "fp32", {}, {})  # fp32 again: a new execution
    assert rerun != parent
    assert tracking.execution_parent(exp, "k2", "exp-b", "fp16", {}, {}) not in (parent, rerun)  # other inputs

    with pytest.raises(RuntimeError):  # a failed fp16 under the rerun's parent...
        with tracking.open_run("fp16-seed0", {"precision": "fp16"}, {}, parent_id=rerun):
            raise RuntimeError("boom")
    assert tracking.execution_parent(exp, "k1", "exp-a", "fp16", {}, {}) == rerun  # ...is retried under it
    children = mlflow.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", output_format="list")
    assert sorted(r.info.run_name for r in children) == ["fp16-seed0", "fp32-seed0"]


def test_an_evaluation_goes_to_the_runs_parent_unless_it_has_another_one(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    exp = tracking.setup(tmp_path, "t")
    parent = tracking.execution_parent(exp, "k", "exp-a", "fp32", {}, {})
    with tracking.open_run("fp32-seed0", {"precision": "fp32"}, {}, parent_id=parent) as child:
        pass
    assert tracking.evaluation_parent(exp, [child], "e1", "exp-a", {}, {"evaluate.confidence": "0.95"}) == parent
    assert tracking.evaluation_parent(exp, [child], "e1", "exp-a", {}, {}) == parent  # the same evaluation again
    other = tracking.evaluation_parent(exp, [child], "e2", "exp-b", {}, {"evaluate.confidence": "0.99"})
    assert other != parent  # other evaluate params: a parent of its own that says where the arm runs are
    run = mlflow.get_run(other)
    assert run.info.run_name == "exp-b" and run.data.tags["ampbench.arm_runs_in"] == parent
    assert run.data.params == {"evaluate.confidence": "0.99"}
    tracking.log_to(other, {"fp16.speedup_vs_fp32": 1.5}, {"verdict.fp16": "equivalent"}, {"evaluate.x": "1"})
    run = mlflow.get_run(other)
    assert run.data.metrics["fp16.speedup_vs_fp32"] == 1.5 and run.data.tags["verdict.fp16"] == "equivalent"


def test_system_metrics_are_sampled_into_the_run(tmp_path, monkeypatch):
    import time

    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    tracking.setup(tmp_path, "t")
    with tracking.open_run("r", {}, {}, system_metrics_every=0.1) as run_id:
        time.sleep(1.0)  # ≈ 10 samples: points sent while running
    metrics = mlflow.get_run(run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    with tracking.open_run("off", {}, {}, system_metrics_every=0) as run_id:
        time.sleep(0.3)
    assert not [k for k in mlflow.get_run(run_id).data.metrics if k.startswith("system/")]


def test_dvc_md5_is_the_hash_dvc_records(tmp_path):
    """fileio.dvc_md5 equals what `dvc add` writes for the same folder (nested files, binary content)."""
    import subprocess
    import sys

    import yaml

    from ampbench.runtime.files import dvc_md5

    folder = tmp_path / "repo" / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(bytes(range(256)) * 7)
    (folder / "sub" / "b.txt").write_text("line\r\nline\n")
    (folder / "Z.json").write_text("{}")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", "data"], cwd=repo, check=True)
    recorded = yaml.safe_load((repo / "data.dvc").read_text())["outs"][0]["md5"]
    assert dvc_md5(folder) == recorded


@pytest.fixture
def loggers_restored(monkeypatch):
    """``own_log.route`` rewires process-wide loggers: put them back afterwards."""
    import logging

    from ampbench.tracking import own_log

    names = ("mlflow", "sqlalchemy", "sqlalchemy.engine", "alembic", "huey", "mlflow.store.db.utils")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate, logging.getLogger(n).level)
             for n in names}
    monkeypatch.setattr(own_log, "_handler", None)
    yield
    for name, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate, logger.level = handlers, propagate, level


def test_mlflows_own_log_goes_to_a_file_and_only_a_warning_outside_the_store_gets_a_line(tmp_path, capsys,
                                                                                        loggers_restored):
    """Issue 53.3: MLflow's store layer logged ~45 lines of SQLAlchemy traceback on stderr before our one-line
    error. Its records (and SQLAlchemy's, alembic's) go to logs/mlflow.log, passwords masked; the terminal gets
    nothing for them (the store's failure reaches the stage as its one line, which names the file), and one line for
    the first warning from elsewhere in MLflow (it carries on after it, and nothing else would say it)."""
    import logging

    from ampbench.tracking import own_log

    uri = "postgresql://mlflow:s3cret@db:5432/mlflow"
    assert own_log.said() == ""
    path = own_log.route(tmp_path, uri)
    assert path == tmp_path / "logs" / "mlflow.log" and not path.exists()  # nothing logged, no file
    logging.getLogger("mlflow.store.db.utils").error("SQLAlchemy database error.\nTraceback (most recent call last)")
    logging.getLogger("sqlalchemy.pool.impl").warning(f"connection to {uri} invalidated")
    logging.getLogger("alembic.runtime.migration").info("Running upgrade")  # below WARNING: dropped
    assert capsys.readouterr().err == ""
    assert own_log.said() == f"; MLflow's own log of it: {path}"
    logging.getLogger("mlflow.system_metrics.system_metrics_monitor").warning("Failed to log system metrics: x\ny")
    logging.getLogger("mlflow.tracking.fluent").warning("a second warning")
    assert capsys.readouterr().err == f"MLflow warning: Failed to log system metrics: x (its log: {path})\n"
    text = path.read_text()
    for seen in ("ERROR mlflow.store.db.utils: SQLAlchemy database error.\nTraceback", "postgresql://mlflow:***@db",
                 "WARNING mlflow.system_metrics", "a second warning"):
        assert seen in text, text
    assert "s3cret" not in text and "Running upgrade" not in text


def test_a_log_file_that_cannot_be_written_drops_the_records_quietly(tmp_path, capsys, loggers_restored):
    import logging

    from ampbench.tracking import own_log

    (tmp_path / "logs").write_text("a file where the folder should be")
    own_log.route(tmp_path, "sqlite:///x.db")
    logging.getLogger("mlflow.store.db.utils").error("SQLAlchemy database error.")
    assert capsys.readouterr().err == ""  # not logging's "--- Logging error ---" page
    assert own_log.said().startswith("; MLflow's own log of it was dropped (")


def test_mlflow_pytorch_comes_without_its_lightning_part_and_its_callback_still_imports():
    """``tracking.logs.mlflow_pytorch`` (the train stage's log_model): mlflow.pytorch without pytorch_lightning (2 s
    at every import where Lightning is installed), the rest of the module as it is, and the checkpoint callback it
    exports importable on first use. A fresh process, so that nothing is imported yet."""
    import importlib.util
    import subprocess
    import sys

    from conftest import clean_env

    code = ("import sys\n"
            "from ampbench.tracking.logs import mlflow_pytorch\n"
            "m = mlflow_pytorch()\n"
            "print('pytorch_lightning' in sys.modules, callable(m.log_model), callable(m.load_model))\n"
            "try:\n"
            "    from mlflow.pytorch import MlflowModelCheckpointCallback\n"
            "    print(MlflowModelCheckpointCallback.__name__, 'pytorch_lightning' in sys.modules)\n"
            "except ImportError:\n"
            "    print('no Lightning')\n")
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "False True True"
    lightning = importlib.util.find_spec("pytorch_lightning") is not None
    assert done.stdout.splitlines()[1] == ("MlflowModelCheckpointCallback True" if lightning else "no Lightning")
