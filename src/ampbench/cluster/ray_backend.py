"""The one module that imports Ray: connect to a running cluster (the project's files as its working directory),
list its live nodes, probe them, run cells as tasks with retries, and cancel what still runs.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Iterator

from ampbench.cluster import cell as cell_module
from ampbench.cluster.grid import Cell, ClusterError, Node, Placement

CONNECT_TIMEOUT_S = 5.0


def connect(address: str, project: Path) -> None:
    """Join the cluster at ``address`` (``host:port`` of its head) as a driver; Ray ships the project's files as
    they are now (what .gitignore leaves: code, params, dvc.lock, .dvc/config) to every node as the tasks' working
    directory. One line when Ray is missing or the address does not answer."""
    reachable(address)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read at import: each cell's lines as they come, not "[repeated 3x]"
    available()
    import ray

    ray.cloudpickle.register_pickle_by_value(cell_module)  # workers need not have ampbench installed
    # Ray's notes on what it leaves out of a working directory (.git, .venv): expected here, not for the user
    logging.getLogger("ray._private.runtime_env.working_dir").setLevel(logging.ERROR)
    try:
        ray.init(address=address, runtime_env={"working_dir": str(project), "excludes": [".resume"]},
                 logging_level=logging.WARNING, log_to_driver=True)
    except (ConnectionError, RuntimeError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {address}: {exc}") from None


def available() -> None:
    """One line when Ray is not installed here (checked before any work)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ClusterError("Ray is not installed in this environment: make install-cluster (requirements-ray.lock)")


def reachable(address: str) -> None:
    """A TCP connection to the head's port, with a short timeout (Ray's own would wait a minute)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"--address {address!r}: give the head's host:port (ray start --head prints it)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; start its head "
                           "there (ray start --head --port …) or give the right --address") from None


def nodes() -> list[Node]:
    """The cluster's live nodes."""
    import ray

    return [Node(n["NodeID"], n.get("NodeManagerHostname", "?"), dict(n["Resources"])) for n in ray.nodes()
            if n["Alive"]]


def probe(nodes: list[Node], device: str) -> dict[str, dict[str, str]]:
    """Each node's torch version and the device a cell would train on, from a task pinned to that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(cell_module.probe_node)
    refs = {n.node_id: task.options(num_cpus=0,
                                    scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, False))
            .remote(device) for n in nodes}
    return dict(zip(refs, ray.get(list(refs.values())), strict=True))


class Running:
    """The grid's cells as Ray tasks: submitted at once, as many running as the cluster's resources allow."""

    def __init__(self, cells: list[Cell], specs: list[dict[str, Any]], placement: Placement, retries: int):
        import ray

        task = ray.remote(cell_module.run_cell)
        options = {**placement.ray_options(), "max_retries": retries, "retry_exceptions": False}
        self.stop = ray.remote(num_cpus=0)(cell_module.StopFlag).remote()  # the cells poll it (``cancel``)
        self.cells = {task.options(**options, name=f"ampbench cell {c.name}").remote({**spec, "stop": self.stop}): c
                      for c, spec in zip(cells, specs, strict=True)}

    def results(self) -> Iterator[tuple[Cell, dict[str, Any] | None, str | None]]:
        """(cell, result, None) as each cell lands, or (cell, None, error line) for one that failed for good."""
        import ray

        pending = list(self.cells)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ref = ready[0]
            try:
                yield self.cells[ref], ray.get(ref), None
            except ray.exceptions.RayTaskError as exc:  # the cell's own error (CellFailed): its message
                yield self.cells[ref], None, str(exc.cause if exc.cause is not None else exc)
            except ray.exceptions.RayError as exc:  # lost past its retries: a worker or node died each time
                yield self.cells[ref], None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            self.cells.pop(ref)

    def cancel(self, wait_s: float = 120.0) -> list[tuple[Cell, dict[str, Any]]]:
        """Stop every cell still queued or running through the flag they poll (a running one's train command gets
        SIGTERM and ends its run KILLED; a queued one returns at its start); wait up to ``wait_s`` for them. Returns
        the cells that finished all the same (one whose seed was done before the stop reached it), to land with the
        others."""
        import ray

        ray.get(self.stop.set.remote())
        ray.wait(list(self.cells), num_returns=len(self.cells), timeout=wait_s)
        finished = []
        for ref, cell in self.cells.items():
            try:
                result = ray.get(ref, timeout=0)
            except ray.exceptions.RayError:  # failed, lost, or still stopping
                continue
            if not result.get("cancelled"):
                finished.append((cell, result))
        return finished


def disconnect() -> None:
    import ray

    ray.shutdown()
