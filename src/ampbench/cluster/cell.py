"""One cell (an arm × seed) as a Ray task on a worker node: the project's files in a scratch folder of its own, the
prepared data pulled from the DVC remote, the train stage's command for that one seed, and the finished seed sent
back to the head.

Only the standard library is imported at module level and ``ray`` inside the task: the head registers this module
to be pickled by value, so a worker needs Python, Ray and the project's pinned requirements, not ampbench
installed — the training itself runs the library shipped with the project's files (``pipeline/_common.py`` puts
their ``src/`` first), the code the resume key hashes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

TAIL_LINES = 30  # of a failed cell's output, for the head's one-line error and the log


class CellFailed(Exception):
    """The train command of a cell ended with an error (not a lost node: Ray retries those by itself)."""


class StopFlag:
    """What the head sets to stop every cell of its run (``ray_backend.Running`` makes it a Ray actor that takes no
    CPU). The cells poll it and end themselves: their train command gets SIGTERM and ends its run KILLED, then the
    task returns. Never ``ray.cancel``: on a task that is completing at that moment it has crashed the driver (a
    failed check in Ray's task manager, "Tried to complete task that was not pending")."""

    def __init__(self):
        self.stopped = False

    def set(self) -> None:
        self.stopped = True

    def is_set(self) -> bool:
        return self.stopped


def _stop_requested(stop) -> bool:
    """Whether the head asked the cells to stop (False when it cannot be asked: the head is gone, and Ray ends its
    tasks with it)."""
    import ray

    try:
        return bool(ray.get(stop.is_set.remote(), timeout=10))
    except Exception:  # the actor (the head's) is gone or slow: nothing was asked
        return False


def run_cell(spec: dict) -> dict:
    """Train ``spec["arm"]`` seed ``spec["seed"]`` here; return where it ran and the finished seed's resume file.

    ``spec``: arm, seed, parent_run, tracking_uri, env (extra environment: the artifact location), python (the
    interpreter; default this worker's), stop (the head's ``StopFlag``). A stop reaches the train command as
    SIGTERM: it marks its MLflow run KILLED before this task ends (returning ``cancelled``).
    """
    import ray

    arm, seed = spec["arm"], spec["seed"]
    node = ray.get_runtime_context().get_node_id()
    name = f"[{arm} seed {seed}]"
    stop = spec.get("stop")
    if stop is not None and _stop_requested(stop):  # queued when the head stopped: nothing to do
        return {"arm": arm, "seed": seed, "node": node, "cancelled": True}
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"ampbench-cell-{arm}-seed{seed}-"))
    try:
        project = scratch / "project"
        # Ray unpacked the project's files once per node for every task; a cell writes, so it gets its own copy.
        shutil.copytree(Path.cwd(), project, symlinks=True)
        python = spec.get("python") or sys.executable
        print(f"{name} started on node {node[:12]} ({socket.gethostname()})", flush=True)
        _pull_data(python, project)
        setup = time.monotonic() - started
        resume = scratch / "resume"
        # Through the node's preload server (runtime/preload.py), as pipeline/python runs a stage: torch and MLflow
        # are imported once per node, not once per cell.
        cmd = [python, "src/ampbench/runtime/preload.py", "pipeline/train.py", "--precision", arm, "--seed", str(seed),
               "--parent-run", spec["parent_run"], "--node", node, "--resume-dir", str(resume)]
        env = {**os.environ, **spec.get("env", {}), "MLFLOW_TRACKING_URI": spec["tracking_uri"],
               "PYTHONUNBUFFERED": "1"}
        env.pop("DVC_ROOT", None)
        tail, stopped = _run(cmd, project, env, name, stop)
        found = resume / f"seed{seed}.pt"
        if stopped and not found.exists():  # its run ended KILLED; nothing finished to hand back
            return {"arm": arm, "seed": seed, "node": node, "cancelled": True}
        if not found.exists():
            raise CellFailed(f"{name} ended without its finished seed ({found.name}); last lines:\n{tail}")
        return {"arm": arm, "seed": seed, "node": node, "host": socket.gethostname(),
                "seconds": round(time.monotonic() - started, 1), "setup_seconds": round(setup, 1),
                "resume_file": found.read_bytes()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _pull_data(python: str, project: Path) -> None:
    """data/prepared as dvc.lock records it, from the DVC remote (Ray ships no .git: DVC runs without git)."""
    for args in (["config", "--local", "core.no_scm", "true"], ["pull", "prepare"]):
        proc = subprocess.run([python, "-m", "dvc", *args], cwd=project, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CellFailed(f"dvc {' '.join(args)} failed on {socket.gethostname()}: "
                             f"{(proc.stderr + proc.stdout).strip()[-2000:]}")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], name: str, stop=None) -> tuple[str, bool]:
    """Run the train command, its lines prefixed with the cell's name (Ray forwards them to the head); returns the
    last lines and whether the head stopped it. It gets SIGTERM when the head sets ``stop`` (polled twice a second),
    when this task is cancelled or when this worker dies, and never outlives it."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_term_with_parent)
    stopped = threading.Event()
    if stop is not None:
        threading.Thread(target=_stop_when_asked, args=(stop, proc, stopped), daemon=True).start()
    try:
        for line in proc.stdout:
            tail.append(line.rstrip())
            print(f"{name} {line.rstrip()}", flush=True)
        code = proc.wait()
    except BaseException:  # the task itself ended (its worker stopping): the run ends KILLED, then the task ends
        proc.send_signal(signal.SIGTERM)  # nothing when it has already exited
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode != 0:
            raise
        # The seed was done (its run FINISHED) before the cancel came: hand it back, the head lands it.
        return "\n".join(tail), stopped.is_set()
    if code != 0 and not stopped.is_set():
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        raise CellFailed(f"{name} train command exited {code}: {last}\n" + "\n".join(tail))
    return "\n".join(tail), stopped.is_set()


def _stop_when_asked(stop, proc: subprocess.Popen, stopped: threading.Event) -> None:
    """SIGTERM to the train command once the head sets ``stop``; returns when the command has ended."""
    while proc.poll() is None:
        if _stop_requested(stop):
            stopped.set()
            proc.send_signal(signal.SIGTERM)
            return
        time.sleep(0.5)


def _term_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent (the Ray worker) dies — a stopped node's cells end
    their runs themselves instead of training on as orphans (Linux; elsewhere the retry closes them)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


PROBE = ("import json, sys; sys.path[:0] = ['src']; import torch; "
         "from ampbench.precision.policy import resolve_device; from ampbench.runtime.hardware import fingerprint; "
         "print(json.dumps({'torch': torch.__version__, 'device': fingerprint(resolve_device(sys.argv[1]))"
         "['device_name']}))")


def probe_node(device: str, python: str | None = None) -> dict:
    """On one node, with the project's shipped library: its torch version and the name of the device a cell of
    ``train.device`` would train on (``runtime.hardware.fingerprint``'s ``device_name``)."""
    import json

    proc = subprocess.run([python or sys.executable, "-c", PROBE, device], cwd=Path.cwd(), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"torch": f"unusable ({last})", "device": "unknown", "host": socket.gethostname()}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "host": socket.gethostname()}
