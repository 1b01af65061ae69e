"""The project's MLflow store made ready: tracking URI set, experiment created once (under a lock), and runs that
dead processes left RUNNING closed as KILLED.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ampbench.errors import AmpbenchError, StoreError
from ampbench.runtime import processes
from ampbench.tracking import own_log
from ampbench.tracking.retry import init_lock, retry, store_message
from ampbench.tracking.uris import check_uri, redact, store_uris


def setup(project_root: Path, experiment: str) -> str:
    """Point MLflow at the project's store and make sure the experiment exists; returns its id. Runs that a dead
    process of this host left RUNNING (kill -9, power loss) are closed as KILLED on the way.

    Raises AmpbenchError (one line) for a malformed, unreachable or unwritable store — before training starts.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, artifact_location = store_uris(project_root)
    check_uri(uri)
    own_log.route(project_root, uri)  # MLflow's own records to logs/mlflow.log: a stage's error stays one line
    mlflow.set_tracking_uri(uri)
    _no_exit_hook()
    if not _released:
        _released.append(atexit.register(release))
    try:
        with init_lock(uri):
            exp = retry(mlflow.get_experiment_by_name)(experiment)
            if exp is None:
                check_artifact_location(uri, artifact_location)
                try:
                    exp_id = mlflow.create_experiment(experiment, artifact_location=artifact_location)
                except MlflowException:  # another process (without our lock: another store client) made it
                    exp_id = mlflow.get_experiment_by_name(experiment).experiment_id
            elif exp.lifecycle_stage == "deleted":
                raise AmpbenchError(f"MLflow experiment {experiment!r} is deleted in {redact(uri)}; restore it "
                                    "(mlflow experiments restore) or choose another mlflow.experiment")
            else:
                check_existing_location(experiment, exp.artifact_location)
                exp_id = exp.experiment_id
        mlflow.set_experiment(experiment_id=exp_id)
        close_dead_runs(exp_id)
    except AmpbenchError:
        raise
    except Exception as exc:  # MlflowException, SQLAlchemy and OS errors from a broken store
        raise StoreError(store_message(exc)) from None
    return exp_id


_released: list = []  # release() is registered once per process


def release() -> None:
    """Close the SQL store's pooled connections (an exit function of every process that set the store up). SQLite
    folds its write-ahead log into ``mlflow.db`` when its last connection closes, so the file alone then holds every
    run: a copy or backup without ``mlflow.db-wal`` misses nothing. Python's teardown would close them; the stage
    runner skips that teardown (docs/operations.md, how a stage ends), so the tracking code does it, the same way
    in a plain process and a preloaded one. Harmless when nothing is open, or for a server store."""
    for name in ("mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store"):
        store = getattr(sys.modules.get(name), "SqlAlchemyStore", None)
        for engine in list(getattr(store, "_engine_map", {}).values()):
            try:
                engine.dispose()
            except Exception:  # noqa: BLE001, S110  (a broken store at exit: its error was the stage's line)
                pass


def check_artifact_location(uri: str, location: str | None) -> None:
    scheme = urlsplit(uri).scheme.split("+")[0]
    if location is None and scheme in ("postgresql", "mysql", "mssql"):
        raise AmpbenchError(f"MLflow store {redact(uri)} is a database without an MLflow server: set "
                            "AMPBENCH_ARTIFACT_LOCATION to a folder or URI every run can reach (a shared path, "
                            "s3://…), or put an MLflow server in front (docs/operations.md, team mode); otherwise "
                            "artifacts would land in the folder this stage happens to run in")


def check_existing_location(experiment: str, location: str | None) -> None:
    if location and "/.dvc/tmp/" in location:
        raise AmpbenchError(f"MLflow experiment {experiment!r} keeps its artifacts in {location}, inside a DVC "
                            "temporary copy that is deleted after each queued run; choose another "
                            "mlflow.experiment (a new experiment gets a lasting location)")


def _no_exit_hook() -> None:
    """MLflow ends a still-active run as FINISHED when the interpreter exits: an interrupted run whose KILLED
    bookkeeping did not complete would be reported as a success. Every run here is closed explicitly."""
    import atexit

    from mlflow.tracking import fluent

    hook = getattr(fluent, "_safe_end_run", None)
    if hook is not None:
        atexit.unregister(hook)


def close_dead_runs(experiment_id: str) -> list[str]:
    """Close as KILLED the RUNNING runs of this experiment whose process (this host's, by pid and start time)
    has died; returns their ids. Runs of live processes, of other hosts or without our identity tags stay."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    closed = []
    running = retry(client.search_runs)([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                         max_results=1000)
    for r in running:
        owner = processes.Identity.from_tags(r.data.tags)
        if owner is None or not owner.dead():
            continue
        retry(client.set_tag)(r.info.run_id, "ampbench.ended_by",
                               f"process {owner.pid} on {owner.host} died without closing the run (found by a "
                               f"later run, pid {processes.Identity.current().pid})")
        retry(client.set_terminated)(r.info.run_id, status="KILLED")
        closed.append(r.info.run_id)
    return closed
