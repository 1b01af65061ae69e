"""The grid as the cluster sees it: cells (an arm × seed), what one cell asks of a node (``Placement``), and the
checks made before any cell starts — each failing check one line that says what to do. Plain functions on facts
the head gathered (``ray_backend``, ``workspace``); nothing here talks to Ray, DVC or MLflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ampbench.errors import AmpbenchError


class ClusterError(AmpbenchError):
    """A cluster run cannot start or finish; the message is the one line to show."""


@dataclass(frozen=True)
class Cell:
    """One training run of the grid: an arm and a seed."""

    arm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm} seed {self.seed}"


@dataclass(frozen=True)
class Placement:
    """What one cell asks of a node: CPUs, GPUs, and optionally one accelerator type (Ray's ``accelerator_type``,
    e.g. ``H100``) or a custom resource every node of the wanted kind declares (``ray start --resources``)."""

    cpus: float = 1.0
    gpus: float = 0.0
    accelerator_type: str | None = None
    resource: str | None = None

    def ray_options(self) -> dict[str, Any]:
        """The task options that ask Ray for this placement."""
        options: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.accelerator_type:
            options["accelerator_type"] = self.accelerator_type
        if self.resource:
            options["resources"] = {self.resource: 0.001}  # a label: any amount of it marks the node's kind
        return options

    def fits(self, resources: dict[str, float]) -> bool:
        """Whether a node with these total ``resources`` (Ray's names) can ever run one cell."""
        return (resources.get("CPU", 0) >= self.cpus and resources.get("GPU", 0) >= self.gpus
                and (not self.accelerator_type or f"accelerator_type:{self.accelerator_type}" in resources)
                and (not self.resource or self.resource in resources))

    def describe(self) -> str:
        parts = [f"{self.cpus:g} CPU"] + ([f"{self.gpus:g} GPU"] if self.gpus else [])
        parts += [f"accelerator_type {self.accelerator_type}"] if self.accelerator_type else []
        parts += [f"resource {self.resource!r}"] if self.resource else []
        return ", ".join(parts)


@dataclass(frozen=True)
class Node:
    """A live node of the cluster, as the head sees it."""

    node_id: str
    host: str
    resources: dict[str, float]


def eligible(nodes: list[Node], placement: Placement, address: str) -> list[Node]:
    """The nodes that can run a cell; none is one line naming what each node offers."""
    fit = [n for n in nodes if placement.fits(n.resources)]
    if not fit:
        offered = "; ".join(f"{n.node_id[:12]} ({n.host}): {_offer(n.resources)}" for n in nodes) or "no live node"
        raise ClusterError(f"no node of the Ray cluster at {address} can run a cell ({placement.describe()}): "
                           f"{offered}")
    return fit


def _offer(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU") or k.startswith("accelerator_type:")
             or not (k.startswith("node:") or k in ("memory", "object_store_memory"))}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(shown.items())) or "nothing"


def check_store(uri: str, nodes: list[Node]) -> None:
    """A SQLite store is a file on this machine: refused once the cluster has nodes on more than it."""
    if uri.lower().startswith("sqlite:") and len(nodes) > 1:
        raise ClusterError(f"MLflow store {uri} is a SQLite file, which the cells of {len(nodes)} nodes cannot "
                           "share (no locking across machines, and other hosts do not see it): start the team "
                           "server (make team-server) and export the MLFLOW_TRACKING_URI it prints")


def pinned_torch(lock_text: str) -> str | None:
    """torch's version in requirements.lock (``torch==X``), without a local build tag; None when not pinned."""
    found = re.search(r"^torch==([^\s+;]+)", lock_text, flags=re.MULTILINE)
    return found.group(1) if found else None


def check_nodes(probes: dict[str, dict[str, str]], hosts: dict[str, str], pinned: str | None,
                head_device: str) -> None:
    """Every node that may run a cell has the project's pinned torch and the head's device kind (the head
    collects the cells and runs the speed and evaluate stages: one comparison, one device kind)."""
    wrong = {n: p["torch"] for n, p in probes.items() if pinned and p["torch"].split("+")[0] != pinned}
    if wrong:
        shown = "; ".join(f"{n[:12]} ({hosts[n]}): torch {v}" for n, v in wrong.items())
        raise ClusterError(f"worker nodes without the project's pinned torch {pinned}: {shown}; install "
                           "requirements.lock there (make install) and start Ray from that environment")
    other = {n: p["device"] for n, p in probes.items() if p["device"] != head_device}
    if other:
        shown = "; ".join(f"{n[:12]} ({hosts[n]}): {d!r}" for n, d in other.items())
        raise ClusterError(f"nodes of another device kind than this machine's {head_device!r}, which collects the "
                           f"cells and times the speed stage: {shown}; narrow the placement (--accelerator-type, "
                           "--resource) or run from a node of the cells' kind")


def progress_line(done: int, total: int, cell: Cell, result: dict[str, Any]) -> str:
    """The head's line when a cell lands."""
    return (f"[{cell.name}] finished on node {result['node'][:12]} ({result['host']}) in {result['seconds']:.0f} s "
            f"({result['setup_seconds']:.0f} s of it copying the project and pulling the data) — {done} of {total} "
            "cells")
