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
    with tracking.run("r", {}, {"a": "1"}) as run_id:
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
            with tracking.run(key, {}, {}) as run_id:
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
    from ampbench.tracking import _retry

    calls = []

    def log_input():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError('duplicate key value violates unique constraint "dataset_pk"')
        return "logged"

    assert _retry(log_input)() == "logged" and len(calls) == 2
