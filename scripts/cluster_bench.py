"""Wall time of a grid on a local Ray cluster (`ampbench cluster repro`) against the sequential `dvc repro` of the
same grid, alternated in one session, each in a fresh clone of the same commit (DVC's run cache is per clone, so
every cell trains in both). Prints a markdown table and the overhead per cell.

Run (after make install-cluster and make team-server):
    MLFLOW_TRACKING_URI=http://127.0.0.1:5001 .venv/bin/python scripts/cluster_bench.py --rounds 2

The cluster is a head and one worker node on this machine, each `ray start` with --node-cpus CPUs; a cell asks for
--cpus-per-cell CPUs (Ray gives it that many threads), the sequential run uses torch's default threads. On a
2-core machine two 1-CPU nodes can only use the same two cores the sequential run uses: the speed-up is bounded by
the cores, and what the table shows is the overhead of going through the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def sh(cmd: list[str], cwd: Path, env: dict, timeout: int = 3600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def project(at: Path, env: dict, arms: list[str], seeds: int, epochs: int) -> Path:
    """A clone of this repository's HEAD with the grid's params and a local-folder DVC remote, committed."""
    repo = at / "project"
    sh(["git", "clone", "-q", str(ROOT), str(repo)], at, env)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"].update(precisions=arms, seeds=list(range(seeds)), epochs=epochs, deterministic=True,
                           device="cpu")
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh([sys.executable, "-m", "dvc", "remote", "add", "-d", "shared", str(at / "remote")], repo, env)
    sh(["git", "commit", "-qam", "the benchmark's grid"], repo, env)
    return repo


def fresh(repo: Path, to: Path, env: dict) -> Path:
    sh(["git", "clone", "-q", str(repo), str(to)], repo.parent, env)
    (to / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    return to


def start_cluster(temp: Path, cpus: int, env: dict) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--num-cpus", str(cpus), "--disable-usage-stats"]
    sh([str(BIN / "ray"), "start", "--head", "--port", str(port), "--temp-dir", str(temp),
        "--include-dashboard=false", *common], temp, env)
    worker = subprocess.Popen([str(BIN / "ray"), "start", "--address", f"127.0.0.1:{port}", "--block", *common],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(8)  # the worker node registers
    return f"127.0.0.1:{port}", worker


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    started = time.monotonic()
    out = sh(cmd, cwd, env)
    return time.monotonic() - started, out


def cell_overheads(clone: Path, out: str, arms: list[str]) -> list[dict]:
    """Per cell: its wall time on the worker, the copy + pull within it, and its training time (summary.json)."""
    rows = []
    for m in re.finditer(r"\[(\w+) seed (\d+)\] finished on node \w+ \([^)]*\) in (\d+) s \((\d+) s of it", out):
        arm, seed, total, setup = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
        summary = json.loads((clone / "models" / arm / "summary.json").read_text())
        rows.append({"cell": f"{arm} seed {seed}", "total": total, "setup": setup,
                     "train": summary["seeds"][seed]["train_seconds"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default="fp32,tf32,fp16,bf16", help="Comma-separated train.precisions.")
    ap.add_argument("--seeds", type=int, default=2, help="Seeds per arm (cells = arms × seeds).")
    ap.add_argument("--epochs", type=int, default=8, help="train.epochs of the grid.")
    ap.add_argument("--node-cpus", type=int, default=1, help="CPUs each of the two Ray nodes declares.")
    ap.add_argument("--rounds", type=int, default=2, help="Alternations of sequential and cluster runs.")
    args = ap.parse_args()
    if not os.environ.get("MLFLOW_TRACKING_URI", "").startswith("http"):
        sys.exit("set MLFLOW_TRACKING_URI to the team server (make team-server): SQLite is refused on 2 nodes")
    arms = args.arms.split(",")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    work = Path(tempfile.mkdtemp(prefix="abbench", dir="/tmp"))
    address, worker = start_cluster(work, args.node_cpus, env)
    try:
        repo = project(work, env, arms, args.seeds, args.epochs)
        seq, clu, cells = [], [], []
        for r in range(args.rounds):
            for kind in (("sequential", "cluster") if r % 2 == 0 else ("cluster", "sequential")):
                clone = fresh(repo, work / f"{kind}{r}", env)
                if kind == "sequential":
                    seq.append(timed([sys.executable, "-m", "dvc", "repro"], clone, env)[0])
                else:
                    wall, out = timed([sys.executable, "-m", "ampbench.cli", "cluster", "repro", "--address",
                                       address, "--cpus", str(args.node_cpus)], clone, env)
                    clu.append(wall)
                    cells += cell_overheads(clone, out, arms)
                print(f"round {r + 1} {kind}: {(seq if kind == 'sequential' else clu)[-1]:.1f} s", flush=True)
        n = len(arms) * args.seeds
        print(f"\n| grid | sequential `dvc repro` | `ampbench cluster repro` (2 nodes × {args.node_cpus} CPU) | "
              "cluster / sequential |\n|---|---|---|---|")
        for s, c in zip(seq, clu, strict=True):
            print(f"| {len(arms)} arms × {args.seeds} seeds = {n} cells, {args.epochs} epochs | {s:.1f} s | "
                  f"{c:.1f} s | {c / s:.2f}× |")
        med = {k: statistics.median(c[k] for c in cells) for k in ("total", "setup", "train")}
        print(f"\nper cell (median of {len(cells)}): {med['total']:.1f} s on its node, of which "
              f"{med['setup']:.1f} s copying the project and pulling data/prepared, {med['train']:.2f} s training; "
              f"the rest ({med['total'] - med['setup'] - med['train']:.1f} s) is the train command's start-up "
              "(Python, torch, MLflow) and its MLflow writes")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
