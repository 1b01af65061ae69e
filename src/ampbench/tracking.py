"""The one module that talks to MLflow: store location, runs per arm and seed, evaluation results, comparison run.

Default store: SQLite ``mlflow.db`` plus an ``mlartifacts/`` folder at the project root (absolute paths, so runs
from ``dvc repro``, ``dvc exp run`` and queued experiments in temporary copies all land in one store);
``MLFLOW_TRACKING_URI`` overrides. Metrics are sent in one batch per epoch, never per step.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from ampbench.errors import AmpbenchError

DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"


def store_uris(project_root: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location for new experiments). The artifact location is None for a user URI."""
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if env_uri:
        return env_uri, None
    root = Path(project_root).resolve()
    return f"sqlite:///{root / DB_NAME}", (root / ARTIFACTS_DIR).as_uri()


def redact(uri: str) -> str:
    """The URI without a password, safe to log as a tag."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


_KNOWN_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")


def check_uri(uri: str) -> None:
    """Fail fast, before any training, on a tracking URI that is malformed or unreachable."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme not in _KNOWN_SCHEMES:
        raise AmpbenchError(f"MLflow tracking URI {redact(uri)!r} is not one MLflow can use (expected "
                            "sqlite:///path, http(s)://host:port, postgresql://…); fix or unset MLFLOW_TRACKING_URI")
    if scheme in ("http", "https"):
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
        except Exception as exc:  # URLError, timeout, HTTP errors: one message for all
            raise AmpbenchError(f"MLflow server {redact(uri)} is unreachable ({exc}); start it (see README, "
                                "team mode) or unset MLFLOW_TRACKING_URI") from None
    if scheme == "sqlite":
        db = Path(_sqlite_path(uri))
        folder = db.parent if db.parent.exists() else next(p for p in db.parents if p.exists())
        if not os.access(folder, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise AmpbenchError(f"MLflow store {db} is not writable; fix the permissions or set MLFLOW_TRACKING_URI")


def _sqlite_path(uri: str) -> str:
    return uri.split("sqlite:///", 1)[1].split("?", 1)[0]


@contextmanager
def _init_lock(uri: str) -> Iterator[None]:
    """Serialise first use of a SQLite store across processes: schema creation and experiment creation race
    otherwise ("table already exists", "database is locked"). Other stores handle this themselves."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl
    import sqlite3

    db = Path(_sqlite_path(uri))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            # WAL lets readers and one writer work at once and is stored in the file: set once, kept.
            with sqlite3.connect(db, timeout=60) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# Transient conflicts of several experiments writing at once: SQLite's lock, and a row (e.g. a data set) that
# another writer inserted between MLflow's "does it exist?" and its insert — on retry MLflow finds it.
_TRANSIENT = ("locked", "duplicate key value", "UNIQUE constraint failed")


def _retry(fn):
    """Retry a store write that hit a transient conflict with a concurrent writer (``_TRANSIENT``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in range(10):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not any(t in str(exc) for t in _TRANSIENT) or attempt == 9:
                    raise
                time.sleep(0.05 * 2**attempt)  # 0.05 s … 25 s in total

    return wrapper


def setup(project_root: Path, experiment: str) -> str:
    """Point MLflow at the project's store and make sure the experiment exists; returns its id.

    Raises AmpbenchError (one line) for a malformed, unreachable or unwritable store — before training starts.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, artifact_location = store_uris(project_root)
    check_uri(uri)
    mlflow.set_tracking_uri(uri)
    try:
        with _init_lock(uri):
            exp = _retry(mlflow.get_experiment_by_name)(experiment)
            if exp is None:
                try:
                    exp_id = mlflow.create_experiment(experiment, artifact_location=artifact_location)
                except MlflowException:  # another process (without our lock: another store client) made it
                    exp_id = mlflow.get_experiment_by_name(experiment).experiment_id
            elif exp.lifecycle_stage == "deleted":
                raise AmpbenchError(f"MLflow experiment {experiment!r} is deleted in {redact(uri)}; restore it "
                                    "(mlflow experiments restore) or choose another mlflow.experiment")
            else:
                exp_id = exp.experiment_id
        mlflow.set_experiment(experiment_id=exp_id)
    except AmpbenchError:
        raise
    except Exception as exc:  # MlflowException, SQLAlchemy and OS errors from a broken store
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AmpbenchError(f"MLflow store {redact(uri)}: {first}") from None
    return exp_id


def flatten(prefix: str, obj: Any) -> dict[str, str]:
    """Nested dicts → {"a.b": "value"} with string values, as MLflow params want them."""
    if isinstance(obj, dict):
        out: dict[str, str] = {}
        for key, value in obj.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return {prefix: str(obj)}


@contextmanager
def run(name: str, tags: dict[str, str], params: dict[str, str], run_id: str | None = None) -> Iterator[str]:
    """Start a run (or reopen ``run_id`` when resuming) and yield its id.

    It ends FINISHED, FAILED (error as a tag) or KILLED (SIGINT/SIGTERM, which raise KeyboardInterrupt here).
    """
    import mlflow

    tags = {**tags, "ampbench.tracking_uri": redact(mlflow.get_tracking_uri())}  # never with a password
    if run_id is not None and run_exists(run_id):
        active = _retry(mlflow.start_run)(run_id=run_id, tags=tags)
    else:
        active = _retry(mlflow.start_run)(run_name=name, tags=tags)
    run_id = active.info.run_id
    previous = {}

    def _killed(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, _killed)
    try:
        _retry(mlflow.log_params)(params)
        yield run_id
    except KeyboardInterrupt as exc:
        _retry(mlflow.set_tag)("ampbench.ended_by", str(exc) or "SIGINT")
        _retry(mlflow.end_run)(status="KILLED")
        raise
    except BaseException as exc:
        _retry(mlflow.set_tag)("ampbench.error", f"{type(exc).__name__}: {exc}"[:5000])
        _retry(mlflow.end_run)(status="FAILED")
        raise
    else:
        _retry(mlflow.end_run)(status="FINISHED")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def scratch_run(folder: Path) -> Iterator[None]:
    """A throwaway SQLite store in ``folder`` with one open run, to time the real logging path (the bench).
    Raises ImportError when mlflow is not installed."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{Path(folder).resolve() / 'bench.db'}")
    exp = mlflow.create_experiment("bench", artifact_location=(Path(folder).resolve() / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=exp):
        yield


def log_epoch(row: dict[str, float], steps: list[dict[str, float]] = ()) -> None:
    """One epoch's metrics, stepped by epoch so the UI's charts line runs up, plus the rows sampled every
    ``telemetry_every`` steps (under ``step/``, stepped by global step): one batched call per epoch."""
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    epoch = int(row["epoch"])
    metrics = [Metric(k, float(v), now, epoch) for k, v in row.items() if k != "epoch"]
    for sample in steps:
        metrics += [Metric(f"step/{k}", float(v), now, int(sample["step"])) for k, v in sample.items() if k != "step"]
    client, run_id = MlflowClient(), mlflow.active_run().info.run_id
    for start in range(0, len(metrics), 1000):  # MLflow accepts at most 1000 metrics per batch
        _retry(client.log_batch)(run_id, metrics=metrics[start:start + 1000])


def log_metrics(metrics: dict[str, float]) -> None:
    import mlflow

    _retry(mlflow.log_metrics)({k: float(v) for k, v in metrics.items()})


def log_dataset(meta: dict[str, Any], source_dir: Path) -> None:
    """Fill the runs table's Dataset column: name, content checksum and where the prepared files are."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both readings are the local path
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(Path(source_dir).resolve()))
    dataset = MetaDataset(source=source, name=meta["dataset"], digest=meta["checksum"][:16])
    _retry(mlflow.log_input)(dataset, context="training")


def log_artifacts(paths: list[Path], artifact_path: str | None = None) -> None:
    import mlflow

    for p in paths:
        if Path(p).is_dir():
            mlflow.log_artifacts(str(p), artifact_path=artifact_path)
        else:
            mlflow.log_artifact(str(p), artifact_path=artifact_path)


def log_model(model, input_example, requirements: list[str]) -> str:
    """Log the model so ``mlflow.pytorch.load_model(uri)`` returns a working model; returns that URI.

    Explicit ``pip_requirements``: inferring them spawns a process and can fail offline. The input example has
    a batch of 2 so the exported graph keeps the batch dimension dynamic.
    """
    import mlflow.pytorch

    info = mlflow.pytorch.log_model(model, name="model", input_example=input_example, pip_requirements=requirements)
    return info.model_uri


def update_run(run_id: str, metrics: dict[str, float], tags: dict[str, str]) -> None:
    """Add metrics and tags to an existing (finished) run without reopening it."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    _retry(MlflowClient().log_batch)(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
        tags=[RunTag(k, str(v)) for k, v in tags.items()],
    )


def run_exists(run_id: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient().get_run(run_id)
        return True
    except MlflowException:
        return False
