"""MLflow runs: one parent per pipeline execution, a run per arm and seed nested under it (started, resumed and
ended FINISHED, FAILED or KILLED whatever happens), and the parent an evaluation goes to.
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ampbench.runtime import processes, signals
from ampbench.tracking.logs import log_batch
from ampbench.tracking.retry import current_uri, init_lock, retry
from ampbench.tracking.uris import mask, redact


def execution_name(tags: dict[str, str]) -> str:
    """A parent run's name: the one its tags give (``ampbench.execution_name``: a search's trial), the DVC
    experiment's, else ``repro@<commit>``."""
    commit = tags.get("git_commit", "")
    return (tags.get("ampbench.execution_name") or tags.get("dvc.exp_name")
            or (f"repro@{commit[:7]}" if commit and commit != "unknown" else "repro"))


def search_parent(experiment_id: str, key: str, name: str, tags: dict[str, str], params: dict[str, str]) -> str:
    """The run of one ``ampbench fix`` search, which its trials' execution runs nest under: the newest with ``key``
    (a rerun of the same search goes on in it), else a new one."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    with init_lock(current_uri()):
        found = retry(client.search_runs)([experiment_id], filter_string=f"tags.`ampbench.fix_search` = '{key}'",
                                          order_by=["attributes.start_time DESC"], max_results=1)
        if found:
            return found[0].info.run_id
        return _new_parent(experiment_id, name, {**tags, "ampbench.fix_search": key}, params, role="fix")


def parent_of(run_id: str) -> str | None:
    """The run ``run_id`` is nested under, if any."""
    from mlflow.tracking import MlflowClient

    return retry(MlflowClient().get_run)(run_id).data.tags.get("mlflow.parentRunId")


def execution_parent(experiment_id: str, key: str, name: str, arm: str, tags: dict[str, str],
                     params: dict[str, str], cells: list[tuple[str, int]] | None = None) -> str:
    """The parent run that groups one pipeline execution's arm × seed runs (and, after evaluate, its comparison).

    The train stages of one execution run as separate processes; they share ``key`` (what they all train from:
    params other than the arm list, data, code, DVC experiment). Each takes the newest parent with that key that
    holds no FINISHED run of ``arm`` yet — a rerun of the same execution (``dvc exp run -f``) gets a new parent, an
    arm added later or a failed arm retried joins the old one — or creates it. A cluster run asks for its ``cells``
    (arm, seed) instead: an interrupted one's rerun joins the parent that holds the cells done. A parent is a
    container, created FINISHED (nothing to leave RUNNING); ``params`` are logged once, at creation.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    with init_lock(current_uri()):  # SQLite: one find-or-create at a time across processes
        parents = retry(client.search_runs)(
            [experiment_id], filter_string=f"tags.`ampbench.execution` = '{key}'",
            order_by=["attributes.start_time DESC"], max_results=50)
        for parent in parents:
            done = [retry(client.search_runs)(
                [experiment_id], max_results=1,
                filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.precision = '{a}' "
                              + (f"and tags.seed = '{seed}' " if seed is not None else "")
                              + "and attributes.status = 'FINISHED'") for a, seed in cells or [(arm, None)]]
            if not any(done):
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
            retry(client.set_tag)(parent_id, "ampbench.evaluate_key", evaluate_key)
            return parent_id
        tags = {**tags, "ampbench.arm_runs_in": parent_id}
    return _new_parent(experiment_id, name, {**tags, "ampbench.evaluate_key": evaluate_key}, params)


def close_lost_attempts(parent_id: str, arm: str, seed: int, node: str) -> list[str]:
    """Before a cluster cell opens its run: runs of the same cell under ``parent_id`` still RUNNING are an earlier
    attempt's whose node was lost (the head runs one attempt of a cell at a time, and Ray starts a retry only after
    the attempt failed): they end KILLED, saying so. Returns their ids."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    experiment_id = retry(client.get_run)(parent_id).info.experiment_id
    lost = retry(client.search_runs)(
        [experiment_id], max_results=100,
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}' and tags.precision = '{arm}' "
                      f"and tags.seed = '{seed}' and attributes.status = 'RUNNING'")
    for run in lost:
        retry(client.set_tag)(run.info.run_id, "ampbench.ended_by",
                              f"its cluster node {run.data.tags.get('ray.node_id', '?')[:12]} was lost; the cell ran "
                              f"again on node {node[:12]}")
        retry(client.set_terminated)(run.info.run_id, "KILLED")
    return [r.info.run_id for r in lost]


def end_execution(run_id: str) -> None:
    """The parent run ends now: its Duration in the UI becomes the execution's, first stage to evaluation."""
    from mlflow.tracking import MlflowClient

    retry(MlflowClient().set_terminated)(run_id, "FINISHED", end_time=int(time.time() * 1000))


def _new_parent(experiment_id: str, name: str, tags: dict[str, str], params: dict[str, str],
                role: str = "execution") -> str:
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    tags = {**tags, "ampbench.role": role, "ampbench.tracking_uri": redact(current_uri())}
    run = retry(client.create_run)(experiment_id, run_name=name, tags=tags)
    log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
    retry(client.set_terminated)(run.info.run_id, "FINISHED")
    return run.info.run_id


@contextmanager
def open_run(name: str, tags: dict[str, str], params: dict[str, str], run_id: str | None = None,
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
            **processes.Identity.current().tags()}
    system = _system_metrics(system_metrics_every)
    if run_id is not None and run_exists(run_id):
        active = retry(mlflow.start_run)(run_id=run_id, tags=tags, log_system_metrics=system)
    else:
        active = retry(mlflow.start_run)(run_name=name, tags=tags, parent_run_id=parent_id,
                                          log_system_metrics=system)
    run_id = active.info.run_id
    with _signals_raise():
        try:
            with signals.interruptions_unwrapped():  # a signal's KeyboardInterrupt wrapped in another error: KILLED
                retry(mlflow.log_params)(params)
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
    """Within the block SIGINT/SIGTERM raise KeyboardInterrupt once and are ignored after
    (``signals.interrupt_once``). A stage installs that for its whole process; called as a library, it is
    installed here and then undone."""
    if signals.handling():
        yield
        return
    previous = signals.handle_signals_once()
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
            retry(client.set_tag)(run_id, key, value)
        retry(client.set_terminated)(run_id, status)
    except Exception as exc:
        if strict:
            raise
        from ampbench.runtime.console import log

        log(f"could not mark the MLflow run {status} ({mask(str(exc))}); the next run of this stage will")


@contextmanager
def scratch_run(folder: Path) -> Iterator[None]:
    """A throwaway SQLite store in ``folder`` with one open run, to time the real logging path (the bench).
    Raises ImportError when mlflow is not installed."""
    import mlflow

    from ampbench.tracking import own_log

    uri = f"sqlite:///{Path(folder).resolve() / 'bench.db'}"
    own_log.route(folder, uri)  # MLflow's "Creating initial tables…" and any trouble: its log in the folder
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("bench", artifact_location=(Path(folder).resolve() / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=exp):
        yield


def run_exists(run_id: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient().get_run(run_id)
        return True
    except MlflowException:
        return False
