"""``ampbench cluster repro``: the pipeline of this workspace with every stale training cell (an arm × seed) run as
a task on a Ray cluster, as many at once as its nodes' resources allow; DVC stays the source of truth.

In order: the checks that need no training (Ray, the address, the MLflow store, nodes that fit a cell, their torch
and device kind, a DVC remote) — one line each, before any cell starts; ``dvc repro prepare`` and a push of the
prepared data; the cells of the train stages DVC would run (not up to date, not in its run cache) whose seed is not
already finished; one MLflow parent run for them, made here; the cells on the cluster, each landing in
``.resume/<arm>/`` as it finishes; then ``dvc repro`` here, whose train stages collect the landed seeds and train
nothing, and whose speed and evaluate stages run on this node.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ampbench import tracking
from ampbench.cluster import grid, ray_backend, workspace
from ampbench.cluster.grid import Cell, ClusterError, Placement
from ampbench.config.validation import load_params
from ampbench.errors import ArmUnavailable, Interrupted
from ampbench.precision.policy import resolve_device
from ampbench.runtime import signals
from ampbench.runtime.console import log
from ampbench.runtime.files import dvc_md5
from ampbench.runtime.hardware import fingerprint
from ampbench.runtime.provenance import run_tags
from ampbench.stages.outputs import execution_params
from ampbench.stages.train import execution_key, ready


@dataclass(frozen=True)
class Options:
    """How to reach the cluster and what a cell asks of a node."""

    address: str
    placement: Placement
    retries: int = 3  # times Ray runs a cell again after its worker or node was lost


def cluster_repro(root: Path, options: Options) -> None:
    """Run the pipeline of the workspace at ``root`` with its stale training cells on the cluster."""
    root = root.resolve()
    params = load_params(root / "params.yaml")
    uri, artifacts = tracking.store_uris(root)
    tracking.check_uri(uri)
    ray_backend.available()
    ray_backend.reachable(options.address)
    workspace.default_remote(root)
    workspace.prepare_inputs(root)  # before Ray ships the project's files: dvc.lock then names the prepared data
    ray_backend.connect(options.address, root)
    signals.handle_signals_once()  # SIGTERM unwinds like Ctrl-C: the cells are cancelled, landed ones kept
    try:
        _check_cluster(root, params, options, uri)
        cells = workspace.unfinished(root, params, _runnable(workspace.stale_arms(root, params.train.precisions),
                                                             params, root))
        if cells:
            parent = _parent(root, params, options, cells)
            specs = [_spec(c, parent, uri, artifacts, root) for c in cells]
            log(f"{len(cells)} cells to train on the cluster at {options.address} "
                f"({options.placement.describe()} each): {', '.join(c.name for c in cells)}")
            _train(root, cells, specs, options)
        else:
            log("every training cell is up to date, in DVC's run cache or finished: nothing to train on the cluster")
    finally:
        ray_backend.disconnect()
    workspace.record(root)


def _check_cluster(root: Path, params, options: Options, uri: str) -> None:
    """Before any cell: the store fits the cluster, some node fits a cell, and every such node has the pinned
    torch and this machine's device kind."""
    live = ray_backend.nodes()
    grid.check_store(uri, live)
    fit = grid.eligible(live, options.placement, options.address)
    head_device = fingerprint(resolve_device(params.train.device))["device_name"]
    lock = root / "requirements.lock"
    pinned = grid.pinned_torch(lock.read_text()) if lock.exists() else None
    grid.check_nodes(ray_backend.probe(fit, params.train.device), {n.node_id: n.host for n in fit}, pinned,
                     head_device)
    log(f"Ray cluster at {options.address}: {len(live)} live nodes, {len(fit)} can run a cell; {head_device}")


def _runnable(arms: list[str], params, root: Path) -> list[str]:
    """The arms this device kind can run (every cell's node has it), as the train stage finds them before it trains
    (``ready``: the device, train.framework, a framework job's one read-back step); the train stage here records
    the others as skipped, with the reason, as it does without a cluster. A model, params or data the train stage
    would refuse stops here, before any cell."""
    device = resolve_device(params.train.device)
    if str(root) not in sys.path:  # a model, data or task of the user's imports from the project, as in the stages
        sys.path.insert(0, str(root))
    runnable = []
    for arm in arms:
        try:
            ready(arm, params, root / "data" / "prepared", device)
            runnable.append(arm)
        except ArmUnavailable as exc:
            log(f"[{arm}] not sent to the cluster: {exc} (the train stage records it as skipped)")
    return runnable


def _parent(root: Path, params, options: Options, cells: list[Cell]) -> str:
    """The execution's parent run, made once, here, by the key the train stages use (so the stage that collects
    the cells and a later plain ``dvc repro`` find it too); the rerun of an interrupted run joins its parent."""
    experiment_id = tracking.setup(root, params.mlflow.experiment)  # the experiment is created here, once
    tags = run_tags(root)
    key = execution_key(params, dvc_md5(root / "data" / "prepared"), workspace.code(root, params), tags)
    parent = tracking.execution_parent(experiment_id, key, tracking.execution_name(tags), params.train.precisions[0],
                                       tags, execution_params(params), cells=[(c.arm, c.seed) for c in cells])
    tracking.log_to(parent, {}, {"ampbench.cluster": options.address,
                                 "ampbench.cluster_placement": options.placement.describe()})
    return parent


def _spec(cell: Cell, parent: str, uri: str, artifacts: str | None, root: Path) -> dict:
    env = {"AMPBENCH_GIT_COMMIT": run_tags(root)["git_commit"]}
    if artifacts:
        env["AMPBENCH_ARTIFACT_LOCATION"] = artifacts
    return {"arm": cell.arm, "seed": cell.seed, "parent_run": parent, "tracking_uri": uri, "env": env}


def _train(root: Path, cells: list[Cell], specs: list[dict], options: Options) -> None:
    """Every cell on the cluster; each lands as it finishes. A cell that failed for good is named at the end (the
    others still land); an interrupt cancels what runs and keeps what landed."""
    started = time.monotonic()
    running = ray_backend.Running(cells, specs, options.placement, options.retries)
    failed, done = [], 0
    try:
        for cell, result, error in running.results():
            if error is not None:
                failed.append(f"{cell.name}: {error.splitlines()[0]}")
                log(f"[{cell.name}] FAILED: {error}")
                continue
            workspace.land(root, cell, result.pop("resume_file"))
            done += 1
            log(grid.progress_line(done, len(cells), cell, result))
    except KeyboardInterrupt as exc:
        for cell, result in running.cancel():  # done before the cancel reached them: kept like the others
            workspace.land(root, cell, result.pop("resume_file"))
            done += 1
        raise Interrupted(str(exc) or "SIGINT", "the running and queued cells cancelled (their MLflow runs end "
                          f"KILLED); {done} finished cells are kept in .resume/ — run the same command again to "
                          "train only the rest") from None
    if failed:
        raise ClusterError(f"{len(failed)} of {len(cells)} cells failed ({'; '.join(failed)}); the {done} finished "
                           "are kept in .resume/ — fix the cause and run the same command again")
    log(f"all {len(cells)} cells finished in {time.monotonic() - started:.0f} s; recording them with dvc repro")
