"""`ampbench cluster repro` (issue 38) on a real Ray cluster on this machine: a head and a worker node, each started
by `ray start` with its own resources, the team MLflow server (PostgreSQL) and a local-folder DVC remote. A tiny grid
(2 arms × 2 seeds on CPU) runs its cells on both nodes and ends with `dvc status` clean, `dvc repro` running
nothing, and outputs and dvc.lock equal to a sequential `dvc repro` of the same commit; then the head interrupted
and a worker killed mid-cell: the grid still finishes, the lost attempts' runs KILLED, the outputs the same.

Needs Ray (make install-cluster) and AMPBENCH_TEAM_SERVER; `make test-cluster` runs it (CI: .ci/run), `make test` not.
Ray runs each cell with OMP_NUM_THREADS = its CPUs (1), so the sequential reference runs with one thread too:
deterministic CPU results depend on the thread count, not on where they ran.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import TINY, clean_env, link_venv, make_project_repo, run_ok

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BIN = Path(sys.executable).parent
AMPBENCH = [sys.executable, "-m", "ampbench.cli"]
DVC = [sys.executable, "-m", "dvc"]
# Keys that differ between any two runs (timings, memory, run ids, where): the rest of an output must be equal.
VOLATILE = {"samples_per_s", "train_samples_per_s", "peak_memory_mb", "peak_reserved_mb", "input_wait_share",
            "train_seconds", "seconds", "run_id", "input_wait_seconds", "epoch_seconds", "node", "host", "windows",
            "timing_windows", "compile_seconds_estimate", "model_uri"}


def _required(what: str, variable: str) -> None:
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what} is required here ({variable}=1)")
    pytest.skip(f"needs {what}", allow_module_level=True)


if importlib.util.find_spec("ray") is None:  # not imported here: 0.3 s of every collection of the suite
    _required("Ray (make install-cluster)", "AMPBENCH_REQUIRE_RAY")
TEAM = os.environ.get("AMPBENCH_TEAM_SERVER")
if not TEAM:
    _required("the team MLflow server (AMPBENCH_TEAM_SERVER)", "AMPBENCH_REQUIRE_TEAM_SERVER")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(address: str, env: dict) -> list[dict]:
    code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
            "print(json.dumps([{'id': n['NodeID'], 'head': 'node:__internal_head__' in n['Resources']} "
            "for n in ray.nodes() if n['Alive']]))" % address)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []


@pytest.fixture(scope="module")
def cluster():
    """Head (1 CPU) and worker (1 CPU, its `ray start --block` in a process group of its own, to be killed)."""
    temp = Path(tempfile.mkdtemp(prefix="abray", dir="/tmp"))  # Ray's socket paths must stay short
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # Node death noticed in seconds, not the default half minute: the fault test waits for it.
    env = clean_env(RAY_health_check_period_ms="1000", RAY_health_check_timeout_ms="1000",
                    RAY_health_check_failure_threshold="3", RAY_DEDUP_LOGS="0")
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    run_ok([str(BIN / "ray"), "start", "--head", "--port", str(port), "--temp-dir", str(temp),
            "--include-dashboard=false", *common], temp, env)
    log = open(temp / "worker.log", "w")
    worker = subprocess.Popen([str(BIN / "ray"), "start", "--address", address, "--block", *common], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(60):
            nodes = _nodes(address, env)
            if len(nodes) == 2 or worker.poll() is not None:  # joined, or `ray start` gave up (its log says why)
                break
            time.sleep(1)
        assert len(nodes) == 2, (temp / "worker.log").read_text()[-2000:]
        yield {"address": address, "env": env, "worker": worker,
               "worker_id": next(n["id"] for n in nodes if not n["head"]),
               "head_id": next(n["id"] for n in nodes if n["head"])}
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """One commit of a tiny grid, with a local-folder DVC remote; and its sequential `dvc repro` (one thread)."""
    root = tmp_path_factory.mktemp("cluster")
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["train"].update(precisions=["fp32", "bf16"], seeds=[0, 1], deterministic=True, epochs=40)
    params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(root / "project", params)
    run_ok([*DVC, "remote", "add", "-d", "shared", str(root / "remote")], repo, env)
    run_ok(["git", "commit", "-qam", "a DVC remote every node reaches"], repo, env)
    sequential = _clone(repo, root / "sequential", env)
    run_ok([*DVC, "repro"], sequential, {**env, "OMP_NUM_THREADS": "1"})
    return repo, root, env, sequential


def _clone(repo: Path, to: Path, env: dict) -> Path:
    run_ok(["git", "clone", "-q", str(repo), str(to)], repo.parent, env)
    link_venv(to, env)
    return to


def _without(obj, keys=VOLATILE):
    if isinstance(obj, dict):
        return {k: _without(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_without(v, keys) for v in obj]
    return obj


def _assert_same_outputs(ours: Path, sequential: Path) -> None:
    """Bitwise: every checkpoint and comparison.json. Else equal but for timings, memory, run ids and where."""
    files = sorted(p.relative_to(sequential) for p in (sequential / "models").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ours) for p in (ours / "models").rglob("*") if p.is_file())
    for rel in files + [Path("reports/comparison.json")]:
        a, b = (ours / rel).read_bytes(), (sequential / rel).read_bytes()
        if rel.suffix == ".pt" or rel.name == "comparison.json":
            assert a == b, f"{rel} differs from the sequential run's"
        else:
            assert _without(json.loads(a)) == _without(json.loads(b)), rel
    lock, seq_lock = (yaml.safe_load((d / "dvc.lock").read_text())["stages"] for d in (ours, sequential))
    assert lock.keys() == seq_lock.keys()
    def inputs(stage: dict) -> list:  # but the outputs of the stages that record timings (train, speed)
        return [d for d in stage["deps"] if not d["path"].startswith(("models", "reports/interleaved.json"))]

    for name, stage in lock.items():
        assert inputs(stage) == inputs(seq_lock[name]) and stage.get("params") == seq_lock[name].get("params"), name
        if name in ("check", "prepare"):
            assert stage["outs"] == seq_lock[name]["outs"], name


def _children(ours: Path) -> tuple[str, list]:
    """The MLflow parent of the cells (found from a seed's run) and its children."""
    import mlflow

    mlflow.set_tracking_uri(TEAM)
    run_id = json.loads((ours / "models" / "fp32" / "summary.json").read_text())["seeds"]["0"]["run_id"]
    parent = mlflow.get_run(run_id).data.tags["mlflow.parentRunId"]
    experiment = mlflow.get_run(parent).info.experiment_id
    children = mlflow.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
                                  output_format="list")
    return parent, children


def test_a_grid_runs_on_both_nodes_and_dvc_records_it(cluster, project):
    repo, root, env, sequential = project
    ours = _clone(repo, root / "grid", env)
    env = {**env, "MLFLOW_TRACKING_URI": TEAM}
    out = run_ok([*AMPBENCH, "cluster", "repro", "--address", cluster["address"]], ours, env)
    assert "4 cells to train on the cluster" in out and "4 of 4 cells" in out, out[-3000:]
    nodes = {json.loads((ours / "models" / arm / "summary.json").read_text())["seeds"][s]["node"]
             for arm in ("fp32", "bf16") for s in ("0", "1")}
    assert nodes == {cluster["head_id"], cluster["worker_id"]}  # cells ran on both nodes (their recorded ids)
    assert "Data and pipelines are up to date" in run_ok([*DVC, "status"], ours, env)
    assert "Running stage" not in run_ok([*DVC, "repro"], ours, env)
    _assert_same_outputs(ours, sequential)
    parent, children = _children(ours)
    assert sorted(r.info.status for r in children) == ["FINISHED"] * 4
    assert {r.data.tags["ray.node_id"] for r in children} == nodes
    assert all(r.data.tags["device"].startswith("CPU") and r.data.tags["ampbench.host"] for r in children)
    import mlflow

    tags = mlflow.get_run(parent).data.tags
    assert tags["ampbench.cluster"] == cluster["address"] and tags["ampbench.evaluated"] == "true"
    # Again: every cell is up to date, so nothing goes to the cluster.
    again = run_ok([*AMPBENCH, "cluster", "repro", "--address", cluster["address"]], ours, env)
    assert "nothing to train on the cluster" in again and "Running stage" not in again


def test_refusals_before_any_cell(cluster, project, tmp_path):
    repo, root, env, _ = project
    ours = _clone(repo, tmp_path / "refused", env)
    sqlite = subprocess.run([*AMPBENCH, "cluster", "repro", "--address", cluster["address"]], cwd=ours, env=env,
                            capture_output=True, text=True, timeout=600)
    assert sqlite.returncode == 2 and "is a SQLite file" in sqlite.stderr and "2 nodes" in sqlite.stderr
    no_ray_remote = _clone(repo, tmp_path / "no-remote", env)
    run_ok([*DVC, "remote", "default", "--project", "--unset"], no_ray_remote, env)
    none = subprocess.run([*AMPBENCH, "cluster", "repro", "--address", cluster["address"]], cwd=no_ray_remote,
                          env=env, capture_output=True, text=True, timeout=120)
    assert none.returncode == 2 and "no default DVC remote in .dvc/config" in none.stderr
    gone = subprocess.run([*AMPBENCH, "cluster", "repro", "--address", f"127.0.0.1:{_free_port()}"], cwd=ours,
                          env=env, capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "cannot reach the Ray cluster" in gone.stderr
    assert not (ours / ".resume").exists() and not (ours / "models").exists()


def test_an_interrupted_head_then_a_worker_lost_mid_cell(cluster, project):
    """SIGTERM to `ampbench cluster repro` once a cell landed: the other cells are cancelled (their runs end KILLED),
    the landed seeds stay in .resume/. The same command again trains only the rest, under the same parent — and
    its worker node is killed (raylet, workers and the cell's train command) once a cell there is training: Ray
    runs that cell again on the head node, the lost attempt's run ends KILLED, and the outputs are the sequential
    run's."""
    repo, root, env, sequential = project
    ours = _clone(repo, root / "faults", env)
    env = {**env, "MLFLOW_TRACKING_URI": TEAM}
    cmd = [*AMPBENCH, "cluster", "repro", "--address", cluster["address"]]
    out = _watch(cmd, ours, env, lambda line, proc: "1 of 4 cells" in line and proc.send_signal(signal.SIGTERM))
    assert out.returncode == 130, out.text[-3000:]
    assert "cells cancelled (their MLflow runs end KILLED)" in out.text and "same command again" in out.text
    landed = sorted((ours / ".resume").rglob("seed*.pt"))
    assert 1 <= len(landed) < 4 and not (ours / "models").exists(), landed
    parent, children = _children_of_cell(landed[0])
    assert "RUNNING" not in {r.info.status for r in children}

    on_worker, killed = set(), []

    def kill_the_worker(line: str, proc) -> None:
        if f"started on node {cluster['worker_id'][:12]}" in line:
            on_worker.add(line.split("]")[0].split("[")[-1])  # "fp32 seed 0"
        cell = next((c for c in on_worker if f"[{c}] [" in line and "epoch 1/" in line), None)
        if cell and not killed:
            killed.append(cell)
            os.killpg(cluster["worker"].pid, signal.SIGKILL)

    again = _watch(cmd, ours, env, kill_the_worker)
    assert again.returncode == 0, again.text[-4000:]
    assert f"{4 - len(landed)} cells to train" in again.text and killed, again.text[-4000:]
    assert f"[{killed[0]}] finished on node {cluster['head_id'][:12]}" in again.text, again.text[-4000:]
    assert "Data and pipelines are up to date" in run_ok([*DVC, "status"], ours, env)
    _assert_same_outputs(ours, sequential)
    same_parent, children = _children(ours)
    assert same_parent == parent  # one story in MLflow: the rerun joined the interrupted run's parent
    assert [r.info.status for r in children].count("FINISHED") == 4 and "RUNNING" not in {
        r.info.status for r in children}
    arm, _, seed = killed[0].split()
    lost = [r for r in children if r.data.tags["precision"] == arm and r.data.tags["seed"] == seed
            and r.data.tags["ray.node_id"] == cluster["worker_id"] and r.info.status == "KILLED"]
    assert len(lost) == 1, [(r.data.tags["ray.node_id"][:8], r.info.status) for r in children]
    # Closed by the retry (its node was lost) or, on this one machine, by any later run that saw its process gone.
    ended_by = lost[0].data.tags["ampbench.ended_by"]
    assert "was lost" in ended_by or "died without closing the run" in ended_by, ended_by


class _Watched:
    def __init__(self, returncode: int, text: str):
        self.returncode, self.text = returncode, text


def _watch(cmd: list[str], cwd: Path, env: dict, on_line) -> _Watched:
    """Run ``cmd``, calling ``on_line(line, process)`` on each line of its output as it comes."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        on_line(line, proc)
    return _Watched(proc.wait(timeout=900), "".join(lines))


def _children_of_cell(resume_file: Path) -> tuple[str, list]:
    """The parent and children of the run a landed resume file names (before any summary.json exists)."""
    import mlflow
    import torch

    meta = torch.load(resume_file, weights_only=False)["meta"]["resume"]
    mlflow.set_tracking_uri(TEAM)
    parent = mlflow.get_run(meta["run_id"]).data.tags["mlflow.parentRunId"]
    experiment = mlflow.get_run(parent).info.experiment_id
    return parent, mlflow.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
                                      output_format="list")
