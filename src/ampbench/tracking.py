"""The one module that talks to MLflow: store location, a parent run per pipeline execution, runs per arm and seed
nested under it, evaluation results, system metrics.

Default store: SQLite ``mlflow.db`` plus an ``mlartifacts/`` folder at the project root (absolute paths, so runs
from ``dvc repro``, ``dvc exp run`` and queued experiments in temporary copies all land in one store);
``MLFLOW_TRACKING_URI`` overrides. Metrics are sent in one batch per epoch, never per step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from ampbench import procs
from ampbench.errors import AmpbenchError, StoreError

DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"


def store_uris(project_root: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location for new experiments).

    Artifacts must outlive the folder a stage runs in (DVC's temporary copy of a queued experiment, a clone that
    is deleted later): ``AMPBENCH_ARTIFACT_LOCATION`` when set; else ``mlartifacts/`` beside a SQLite file (a
    relative ``sqlite:///name.db`` is taken relative to the project root, not to the temporary copy); None where
    the store decides itself (an MLflow server, a ``file:`` store). A database server URI without a server in
    front (``postgresql://…``) needs ``AMPBENCH_ARTIFACT_LOCATION``: ``setup`` says so.
    """
    root = Path(project_root).resolve()
    chosen = os.environ.get("AMPBENCH_ARTIFACT_LOCATION") or None
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not env_uri:
        return f"sqlite:///{root / DB_NAME}", chosen or (root / ARTIFACTS_DIR).as_uri()
    if env_uri.startswith("sqlite:///"):
        db = Path(_sqlite_path(env_uri))
        if not db.is_absolute():
            db = root / db
            env_uri = f"sqlite:///{db}" + (env_uri[env_uri.index("?"):] if "?" in env_uri else "")
        return env_uri, chosen or (db.parent / ARTIFACTS_DIR).as_uri()
    return env_uri, chosen


def redact(uri: str) -> str:
    """The URI without a password, safe to log as a tag."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def mask(text: str, uri: str | None = None) -> str:
    """``text`` (an error message, a log line) with the tracking URI's password replaced by ***."""
    uri = uri if uri is not None else os.environ.get("MLFLOW_TRACKING_URI", "")
    try:
        password = urlsplit(uri).password
    except ValueError:
        return text
    if not password:
        return text
    return text.replace(uri, redact(uri)).replace(password, "***")


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
            urllib.request.urlopen(_health_request(uri), timeout=5).close()
        except Exception as exc:  # URLError, timeout, HTTP errors: one message for all
            raise AmpbenchError(f"MLflow server {redact(uri)} is unreachable ({mask(str(exc), uri)}); start it "
                                "(see README, team mode) or unset MLFLOW_TRACKING_URI") from None
    if scheme == "sqlite":
        db = Path(_sqlite_path(uri))
        folder = db.parent if db.parent.exists() else next(p for p in db.parents if p.exists())
        if not os.access(folder, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise AmpbenchError(f"MLflow store {db} is not writable; fix the permissions or set MLFLOW_TRACKING_URI")


def _health_request(uri: str):
    """GET <server>/health, with ``user:password@`` moved from the host into a Basic auth header (urllib would
    otherwise look up "user:password@host" as the host name)."""
    import base64
    import urllib.request

    parts = urlsplit(uri)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    request = urllib.request.Request(urlunsplit(parts._replace(netloc=netloc)).rstrip("/") + "/health")
    if parts.username is not None:
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


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
        new = not db.exists() or db.stat().st_size == 0
        try:
            # WAL lets readers and one writer work at once and is stored in the file: set once, kept.
            with sqlite3.connect(db, timeout=60) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
            yield
        except BaseException:
            if new:  # half-created (disk full, signal): MLflow would fail on it forever ("table … already exists")
                for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                    path.unlink(missing_ok=True)
            raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# Transient conflicts of several experiments writing at once: SQLite's lock, and a row (e.g. a data set) that
# another writer inserted between MLflow's "does it exist?" and its insert — on retry MLflow finds it.
_TRANSIENT = ("locked", "duplicate key value", "UNIQUE constraint failed")


def _retry(fn):
    """Retry a store write that hit a transient conflict with a concurrent writer (``_TRANSIENT``); a store that
    fails for good raises StoreError (one line, password masked) instead of pages of driver traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in range(10):
            try:
                with _whole_transactions():
                    return fn(*args, **kwargs)
            except Exception as exc:
                if any(t in str(exc) for t in _TRANSIENT) and attempt < 9:
                    time.sleep(0.05 * 2**attempt)  # 0.05 s … 25 s in total
                    continue
                if _from_store(exc):
                    raise StoreError(_store_message(exc)) from None
                raise

    return wrapper


def _whole_transactions():
    """Signals wait until a write to a database store (SQLite, PostgreSQL…) is done: interrupted mid-transaction,
    its connection keeps the lock and the KILLED bookkeeping that follows waits on it. A server's HTTP calls stay
    interruptible (its transactions are the server's)."""
    import mlflow

    scheme = urlsplit(mlflow.get_tracking_uri()).scheme.split("+")[0]
    databases = ("sqlite", "postgresql", "mysql", "mssql")
    return procs.signals_deferred() if scheme in databases else contextlib.nullcontext()


_STORE_MODULES = ("mlflow", "sqlalchemy", "sqlite3", "requests", "urllib3", "psycopg2", "pymysql")


def _from_store(exc: BaseException) -> bool:
    """An error of the tracking store or the way to it (not of our code, not a disk error we report as such)."""
    return type(exc).__module__.split(".")[0] in _STORE_MODULES


def _store_message(exc: BaseException) -> str:
    import mlflow

    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    uri = mlflow.get_tracking_uri()
    return mask(f"MLflow store {redact(uri)}: {first[:300]}", uri)


def setup(project_root: Path, experiment: str) -> str:
    """Point MLflow at the project's store and make sure the experiment exists; returns its id. Runs that a dead
    process of this host left RUNNING (kill -9, power loss) are closed as KILLED on the way.

    Raises AmpbenchError (one line) for a malformed, unreachable or unwritable store — before training starts.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, artifact_location = store_uris(project_root)
    check_uri(uri)
    mlflow.set_tracking_uri(uri)
    _no_exit_hook()
    try:
        with _init_lock(uri):
            exp = _retry(mlflow.get_experiment_by_name)(experiment)
            if exp is None:
                _check_artifact_location(uri, artifact_location)
                try:
                    exp_id = mlflow.create_experiment(experiment, artifact_location=artifact_location)
                except MlflowException:  # another process (without our lock: another store client) made it
                    exp_id = mlflow.get_experiment_by_name(experiment).experiment_id
            elif exp.lifecycle_stage == "deleted":
                raise AmpbenchError(f"MLflow experiment {experiment!r} is deleted in {redact(uri)}; restore it "
                                    "(mlflow experiments restore) or choose another mlflow.experiment")
            else:
                _check_existing_location(experiment, exp.artifact_location)
                exp_id = exp.experiment_id
        mlflow.set_experiment(experiment_id=exp_id)
        close_dead_runs(exp_id)
    except AmpbenchError:
        raise
    except Exception as exc:  # MlflowException, SQLAlchemy and OS errors from a broken store
        raise StoreError(_store_message(exc)) from None
    return exp_id


def _check_artifact_location(uri: str, location: str | None) -> None:
    scheme = urlsplit(uri).scheme.split("+")[0]
    if location is None and scheme in ("postgresql", "mysql", "mssql"):
        raise AmpbenchError(f"MLflow store {redact(uri)} is a database without an MLflow server: set "
                            "AMPBENCH_ARTIFACT_LOCATION to a folder or URI every run can reach (a shared path, "
                            "s3://…), or put an MLflow server in front (see README, team mode); otherwise artifacts "
                            "would land in the folder this stage happens to run in")


def _check_existing_location(experiment: str, location: str | None) -> None:
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
    running = _retry(client.search_runs)([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                         max_results=1000)
    for r in running:
        owner = procs.Identity.from_tags(r.data.tags)
        if owner is None or not owner.dead():
            continue
        _retry(client.set_tag)(r.info.run_id, "ampbench.ended_by",
                               f"process {owner.pid} on {owner.host} died without closing the run (found by a "
                               f"later run, pid {procs.Identity.current().pid})")
        _retry(client.set_terminated)(r.info.run_id, status="KILLED")
        closed.append(r.info.run_id)
    return closed


def flatten(prefix: str, obj: Any) -> dict[str, str]:
    """Nested dicts → {"a.b": "value"} with string values, as MLflow params want them."""
    if isinstance(obj, dict):
        out: dict[str, str] = {}
        for key, value in obj.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return {prefix: str(obj)}


def execution_name(tags: dict[str, str]) -> str:
    """A parent run's name: the DVC experiment's, else ``repro@<commit>``."""
    commit = tags.get("git_commit", "")
    return tags.get("dvc.exp_name") or (f"repro@{commit[:7]}" if commit and commit != "unknown" else "repro")


def execution_parent(experiment_id: str, key: str, name: str, arm: str, tags: dict[str, str],
                     params: dict[str, str]) -> str:
    """The parent run that groups one pipeline execution's arm × seed runs (and, after evaluate, its comparison).

    The train stages of one execution run as separate processes; they share ``key`` (what they all train from:
    params other than the arm list, data, code, DVC experiment). Each takes the newest parent with that key that
    holds no FINISHED run of ``arm`` yet — a rerun of the same execution (``dvc exp run -f``) gets a new parent, an
    arm added later or a failed arm retried joins the old one — or creates it. A parent is a container, created
    FINISHED (nothing to leave RUNNING); ``params`` are logged once, at creation.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    with _init_lock(_uri()):  # SQLite: one find-or-create at a time across processes
        parents = _retry(client.search_runs)(
            [experiment_id], filter_string=f"tags.`ampbench.execution` = '{key}'",
            order_by=["attributes.start_time DESC"], max_results=50)
        for parent in parents:
            done = _retry(client.search_runs)(
                [experiment_id], max_results=1,
                filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.precision = '{arm}' "
                              "and attributes.status = 'FINISHED'")
            if not done:
                return parent.info.run_id
        return _new_parent(experiment_id, name, {**tags, "ampbench.execution": key}, params)


def evaluation_parent(experiment_id: str, run_ids: list[str], evaluate_key: str, name: str, tags: dict[str, str],
                      params: dict[str, str]) -> str:
    """The parent run to hold an evaluation of ``run_ids`` (the baseline's runs first): their parent, unless that
    one already holds an evaluation with other evaluate params (a DVC experiment that only changed those reuses
    the trained runs): then a new parent, tagged with where the runs are. Runs from before parents existed get
    a new parent too."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    parent_id = next((client.get_run(r).data.tags.get("mlflow.parentRunId") for r in run_ids if run_exists(r)), None)
    if parent_id is not None and run_exists(parent_id):
        evaluated = client.get_run(parent_id).data.tags.get("ampbench.evaluate_key")
        if evaluated in (None, evaluate_key):
            _retry(client.set_tag)(parent_id, "ampbench.evaluate_key", evaluate_key)
            return parent_id
        tags = {**tags, "ampbench.arm_runs_in": parent_id}
    return _new_parent(experiment_id, name, {**tags, "ampbench.evaluate_key": evaluate_key}, params)


def end_execution(run_id: str) -> None:
    """The parent run ends now: its Duration in the UI becomes the execution's, first stage to evaluation."""
    from mlflow.tracking import MlflowClient

    _retry(MlflowClient().set_terminated)(run_id, "FINISHED", end_time=int(time.time() * 1000))


def _new_parent(experiment_id: str, name: str, tags: dict[str, str], params: dict[str, str]) -> str:
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    tags = {**tags, "ampbench.role": "execution", "ampbench.tracking_uri": redact(_uri())}
    run = _retry(client.create_run)(experiment_id, run_name=name, tags=tags)
    items = [Param(k, v) for k, v in params.items()]
    for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        _retry(client.log_batch)(run.info.run_id, params=items[start:start + 100])
    _retry(client.set_terminated)(run.info.run_id, "FINISHED")
    return run.info.run_id


def _uri() -> str:
    import mlflow

    return mlflow.get_tracking_uri()


def log_to(run_id: str, metrics: dict[str, float], tags: dict[str, str], params: dict[str, str] | None = None,
           artifacts: list[Path] = (), artifact_dirs: dict[str, Path] | None = None) -> None:
    """Metrics, tags, params and files onto an existing (finished) run without reopening it."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client, now = MlflowClient(), int(time.time() * 1000)
    metric_items = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
    for start in range(0, len(metric_items), 1000):
        _retry(client.log_batch)(run_id, metrics=metric_items[start:start + 1000])
    _retry(client.log_batch)(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    param_items = [Param(k, v) for k, v in (params or {}).items()]
    for start in range(0, len(param_items), 100):
        _retry(client.log_batch)(run_id, params=param_items[start:start + 100])
    for path in artifacts:
        _retry(client.log_artifact)(run_id, str(path))
    for folder_name, folder in (artifact_dirs or {}).items():
        _retry(client.log_artifacts)(run_id, str(folder), artifact_path=folder_name)


@contextmanager
def run(name: str, tags: dict[str, str], params: dict[str, str], run_id: str | None = None,
        parent_id: str | None = None, system_metrics_every: float = 0) -> Iterator[str]:
    """Start a run (or reopen ``run_id`` when resuming) and yield its id; a new run nests under ``parent_id``.
    With ``system_metrics_every`` > 0, MLflow samples CPU, memory (and the GPU's utilisation and memory) every that
    many seconds into ``system/*`` metrics.

    It ends FINISHED, FAILED (error as a tag) or KILLED (SIGINT/SIGTERM, which raise KeyboardInterrupt here; later
    signals are held off until the KILLED status is written). If the store itself fails, the run is left for a
    later run's ``close_dead_runs`` and the store error (one line) is raised.
    """
    import mlflow

    tags = {**tags, "ampbench.tracking_uri": redact(mlflow.get_tracking_uri()),  # never with a password
            **procs.Identity.current().tags()}
    system = _system_metrics(system_metrics_every)
    if run_id is not None and run_exists(run_id):
        active = _retry(mlflow.start_run)(run_id=run_id, tags=tags, log_system_metrics=system)
    else:
        active = _retry(mlflow.start_run)(run_name=name, tags=tags, parent_run_id=parent_id,
                                          log_system_metrics=system)
    run_id = active.info.run_id
    with _signals_raise():
        try:
            _retry(mlflow.log_params)(params)
            yield run_id
        except KeyboardInterrupt as exc:
            _close("KILLED", {"ampbench.ended_by": str(exc) or "SIGINT"})
            raise
        except BaseException as exc:
            _close("FAILED", {"ampbench.error": mask(f"{type(exc).__name__}: {exc}")[:5000]})
            raise
        else:
            _close("FINISHED", {}, strict=True)


def _system_metrics(every: float) -> bool:
    """Configure MLflow's system metrics sampler (a thread in this process) for ``every`` seconds; False: off.
    Two samples are averaged per point: a run of a minute gets ≈ 30 points, one of a few seconds at least one
    (a run shorter than two samples gets none: the sampler drops an unfinished pair)."""
    if every <= 0:
        return False
    import logging

    from mlflow import system_metrics

    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no "Started monitoring…" per run

    system_metrics.set_system_metrics_sampling_interval(every)
    system_metrics.set_system_metrics_samples_before_logging(2)
    return True


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Within the block SIGINT/SIGTERM raise KeyboardInterrupt once and are ignored after (``procs.interrupt_once``).
    A stage installs that for its whole process; called as a library, it is installed here and then undone."""
    if signal.getsignal(signal.SIGTERM) is procs.interrupt_once:
        yield
        return
    previous = procs.handle_signals_once()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _close(status: str, tags: dict[str, str], strict: bool = False) -> None:
    """End the active run with ``status`` and ``tags``. On a failing store: raise when ``strict`` (a normal
    end), else leave the run to ``close_dead_runs`` and let the original error through (one line here)."""
    import mlflow
    from mlflow.tracking import MlflowClient, fluent

    run = mlflow.active_run()
    if run is None:
        return
    # Forget it in this process first (what mlflow.end_run does before writing): a retried write below must not
    # find the run gone, and nothing else in this process may end it with another status.
    fluent._active_run_stack.get().pop()
    client, run_id = MlflowClient(), run.info.run_id
    # The system metrics sampler stops by itself once it sees the run ended; on a normal end, flush it first.
    monitor = fluent.run_id_to_system_metrics_monitor.pop(run_id, None)
    try:
        if monitor is not None and strict:
            monitor.finish()
        for key, value in tags.items():
            _retry(client.set_tag)(run_id, key, value)
        _retry(client.set_terminated)(run_id, status)
    except Exception as exc:
        if strict:
            raise
        from ampbench.console import log

        log(f"could not mark the MLflow run {status} ({mask(str(exc))}); the next run of this stage will")


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


def log_dataset(name: str, digest: str, source_dir: Path) -> None:
    """Fill the runs table's Dataset column: name, digest (the prepared data's DVC hash) and where it is."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both readings are the local path
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(Path(source_dir).resolve()))
    dataset = MetaDataset(source=source, name=name, digest=digest[:36])  # MLflow stores at most 36 characters
    _retry(mlflow.log_input)(dataset, context="training")


def log_artifacts(paths: list[Path], artifact_path: str | None = None) -> None:
    import mlflow

    for p in paths:
        if Path(p).is_dir():
            _retry(mlflow.log_artifacts)(str(p), artifact_path=artifact_path)
        else:
            _retry(mlflow.log_artifact)(str(p), artifact_path=artifact_path)


def log_model(model, input_example, requirements: list[str]) -> str:
    """Log the model so ``mlflow.pytorch.load_model(uri)`` returns a working model; returns that URI.

    Explicit ``pip_requirements``: inferring them spawns a process and can fail offline. The input example has
    a batch of 2 so the exported graph keeps the batch dimension dynamic.
    """
    import mlflow.pytorch

    info = _retry(mlflow.pytorch.log_model)(model, name="model", input_example=input_example,
                                            pip_requirements=requirements)
    return info.model_uri


def run_exists(run_id: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient().get_run(run_id)
        return True
    except MlflowException:
        return False
