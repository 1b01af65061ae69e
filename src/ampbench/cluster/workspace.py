"""The head's side of a cluster run in the user's workspace, all through DVC: the inputs prepared and pushed to the
DVC remote the cells pull from, which train stages DVC would really run (neither up to date nor in its run cache),
which of their seeds are already finished, a landed cell put where the train stage resumes from, and the final
``dvc repro`` that records every output (and ``dvc push`` that shares them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ampbench.cluster.grid import Cell, ClusterError
from ampbench.config.layout import RESUME
from ampbench.config.params import Params
from ampbench.data.prepare import load_prepared
from ampbench.runtime.files import atomic_write_bytes
from ampbench.runtime.provenance import code_version
from ampbench.stages import resume
from ampbench.tasks.resolve import resolve_task


def dvc(root: Path, *args: str, quiet: bool = False) -> str:
    """Run ``dvc ARGS`` in the workspace (this environment's DVC); its output reaches the user unless ``quiet``.
    A failure is one line naming the command."""
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, text=True,
                          capture_output=quiet)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout or "").strip().splitlines() if quiet else []
        raise ClusterError(f"dvc {' '.join(args)} failed" + (f": {said[-1]}" if said else " (its output is above)"))
    return proc.stdout or "" if quiet else ""


def default_remote(root: Path) -> str:
    """The DVC remote the cells pull data/prepared from: the project's default, in .dvc/config (the copy Ray
    ships has no .dvc/config.local); one line when the project has none."""
    try:
        name = dvc(root, "remote", "default", "--project", quiet=True).strip()
    except ClusterError:  # "No default remote set" exits 1
        name = ""
    if not name:
        raise ClusterError("this project has no default DVC remote in .dvc/config: the cells pull data/prepared "
                           "from one that every node can reach (a shared folder or an object store): "
                           "dvc remote add -d shared <url> (not --local) (docs/cluster.md)")
    return name


def prepare_inputs(root: Path) -> None:
    """The stages before training (check, prepare) run here, and their outputs go to the remote for the cells."""
    dvc(root, "repro", "prepare")
    dvc(root, "push", "--quiet", "prepare")


def stale_arms(root: Path, arms: list[str]) -> list[str]:
    """The arms whose train stage ``dvc repro`` would run: changed since dvc.lock and not in DVC's run cache (a
    stage DVC can restore is never trained again). Uses DVC's own stage objects, as ``dvc repro`` does."""
    from dvc.repo import Repo

    stale = []
    with Repo(str(root)) as repo, repo.lock:
        for arm in arms:
            stage = repo.stage.collect(f"train@{arm}")[0]
            if not stage.changed():
                continue
            # What dvc repro's run-cache restore does before it runs a stage: hash the deps as they are now, look
            # the stage up by them, and use it only if every output is in the cache.
            stage.save_deps()
            cached = repo.stage_cache._load(stage)
            if not (cached and repo.stage_cache._create_stage(cached, wdir=stage.wdir).outs_cached()):
                stale.append(arm)
    return stale


def data_checksum(root: Path, params: Params) -> str:
    """The prepared data's checksum as the train stage keys its resume checkpoints by."""
    task = resolve_task(params.train.task, params.train.block_size)
    return task.view(load_prepared(root / "data" / "prepared")).meta["checksum"]


def code(root: Path, params: Params) -> str:
    return code_version(root, params.train.model_code, params.train.task_code)


def unfinished(root: Path, params: Params, arms: list[str]) -> list[Cell]:
    """The cells of ``arms`` without a finished seed in .resume/<arm>/ that the train stage would reuse."""
    checksum, version = data_checksum(root, params), code(root, params)
    cells = []
    for arm in arms:
        for seed in params.train.seeds:
            key = resume.resume_key(params.train, checksum, arm, seed, version)
            found = resume.load(root / RESUME / arm / f"seed{seed}.pt", arm, key)
            if found is None or found[1].done is None:
                cells.append(Cell(arm, seed))
    return cells


def land(root: Path, cell: Cell, resume_file: bytes) -> Path:
    """A finished cell's resume file where the train stage looks for finished seeds (written whole or not at
    all: an interrupted head leaves no half-written file)."""
    path = root / RESUME / cell.arm / f"seed{cell.seed}.pt"
    atomic_write_bytes(path, resume_file)
    return path


def record(root: Path) -> None:
    """``dvc repro``: the train stages collect the landed seeds (training nothing), then speed and evaluate run
    here; dvc.lock and the run cache record every output. Then ``dvc push --run-cache`` shares them."""
    dvc(root, "repro")
    dvc(root, "push", "--quiet", "--run-cache")
