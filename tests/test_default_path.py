"""The default path gives a plain process's outcome (issue 49): every arm the registry offers that runs on a CPU and
every kind of task, through a real `dvc repro` / `dvc exp run` with the preload server (the default) and without
(`AMPBENCH_PRELOAD=0`): the same exit statuses, the same `comparison.json`, every checkpoint bit for bit, and an
MLflow store that is complete in `mlflow.db` alone (copied without its write-ahead log), every run FINISHED with
its artifacts.

Two runs per mode keep it within the suite's time (one epoch, one seed, tiny models, the speed stage at its
smallest; a plain process pays ~5 s of imports per stage):
- every arm, on digits, the built-in mlp (Linear layers float8 can take) trained by the example Task
  (examples/my_task.py);
- fp32 and bf16 on a language model from a model factory of the user's, by `dvc exp run -S`: the Hugging Face one
  (examples/hf_gpt2.py) where transformers is installed (CI installs it), else examples/my_lm.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from ampbench.config.arms import NAMES
from conftest import TINY, make_project_repo
from test_language_model import write_text_folder

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="the preload server: Linux")]

# Whether it is installed, without importing it (0.4 s of every worker's collection)
HUGGING_FACE = (importlib.util.find_spec("transformers") is not None
                or bool(os.environ.get("AMPBENCH_REQUIRE_TRANSFORMERS")))  # then its run fails, naming the import

CPU_ARMS = [arm for arm in NAMES if arm != "tf32"]  # TF32 exists on CUDA only (the train stage records it skipped)
LM = ["-S", "train.task=language_model", "-S", "prepare.dataset=text", "-S", "prepare.raw_dir=data/raw/text",
      "-S", "prepare.max_train=null", "-S", "train.block_size=16", "-S", "train.precisions=[fp32,bf16]",
      "-S", "train.lr=0.003"]
RUNS = {
    "every arm": ["dvc", "repro"],
    "language model": ["dvc", "exp", "run", *LM, "-S", "train.model=examples.my_lm:build", "-S",
                       "train.model_code=examples/my_lm.py", "-S", "++train.model_args={width: 16}"],
    "hugging face": ["dvc", "exp", "run", *LM, "-S", "train.model=examples.hf_gpt2:build", "-S",
                     "train.model_code=examples/hf_gpt2.py", "-S", "++train.model_args={n_embd: 16, n_layer: 1}"],
}
del RUNS["language model" if HUGGING_FACE else "hugging face"]


def _params() -> dict:
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["prepare"]["max_train"] = 128
    params["train"].update({"precisions": CPU_ARMS, "seeds": [0], "task": "examples.my_task:task",
                            "task_code": "examples/my_task.py", "model": "mlp"})
    params["speed"].update({"rounds": 1, "steps": 2, "window": 1, "warmup_steps": 0, "seconds_per_arm": 2})
    params["mlflow"]["log_model"] = False
    return params


def _outcome(repo: Path, status: int) -> dict:
    """What must not depend on the mode: the exit status, comparison.json, every checkpoint's bytes, the runs."""
    checkpoints = {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
                   for p in sorted((repo / "models").rglob("*.pt"))}
    comparison = repo / "reports" / "comparison.json"
    return {"status": status, "comparison": comparison.read_text() if comparison.exists() else None,
            "checkpoints": checkpoints, "runs": _runs_without_the_wal(repo)}


def _runs_without_the_wal(repo: Path) -> list[tuple[str, str, int]]:
    """The runs as a copy of mlflow.db alone shows them (name, status, files under its artifact folder): what a
    backup or another machine sees once the stages are done."""
    if not (repo / "mlflow.db").exists():
        return []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "mlflow.db"
        shutil.copyfile(repo / "mlflow.db", copy)
        with sqlite3.connect(copy) as db:
            rows = db.execute("SELECT name, status, artifact_uri FROM runs ORDER BY name, start_time").fetchall()
    return sorted((name if "-seed" in name else "(an execution's parent run)", status,  # named after a commit
                   sum(1 for p in Path(uri.removeprefix("file://")).rglob("*") if p.is_file()))
                  for name, status, uri in rows)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """{mode: {run: outcome}}, each mode in a project of its own with a preload server of its own."""
    found: dict[str, dict[str, dict]] = {}
    for mode in ("1", "0"):
        repo, env = make_project_repo(tmp_path_factory.mktemp(f"preload{mode}") / "project", _params())
        write_text_folder(repo / "data" / "raw" / "text")
        run = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))  # a socket's path must be short
        env = {**env, "AMPBENCH_PRELOAD": mode, "XDG_RUNTIME_DIR": str(run), "AMPBENCH_PRELOAD_IDLE": "30"}
        found[mode] = {}
        try:
            for name, cmd in RUNS.items():  # each from the committed params (an experiment leaves its own)
                subprocess.run(["git", "checkout", "-q", "--", "params.yaml"], cwd=repo, env=env, check=True)
                done = subprocess.run([sys.executable, "-m", *cmd], cwd=repo, env=env, capture_output=True,
                                      text=True, timeout=900)
                found[mode][name] = {**_outcome(repo, done.returncode), "output": done.stdout + done.stderr}
        finally:
            shutil.rmtree(run, ignore_errors=True)
    return found


@pytest.mark.parametrize("run", list(RUNS))
def test_the_default_path_ends_as_plain_processes(outcomes, run):
    served, plain = outcomes["1"][run], outcomes["0"][run]
    assert served["status"] == plain["status"] == 0, (served["output"][-3000:], plain["output"][-3000:])
    assert served["comparison"] == plain["comparison"] is not None
    assert served["checkpoints"] == plain["checkpoints"] and served["checkpoints"]
    assert served["runs"] == plain["runs"]
    # Nothing but what a plain process prints: no line from the server's machinery under any stage.
    assert "preload_child" not in served["output"] and "Warning" not in served["output"], served["output"][-3000:]


@pytest.mark.parametrize("mode", ["1", "0"], ids=["preloaded", "plain"])
def test_every_run_is_finished_with_its_artifacts_in_the_database_file_alone(outcomes, mode):
    last = outcomes[mode][list(RUNS)[-1]]
    arm_runs = [r for r in last["runs"] if "-seed" in r[0]]
    diverged = {f"{arm}-seed0" for arm in ("fp16_pure",)}  # no scaler: its run ends FAILED with the reason
    assert {status for name, status, _ in last["runs"] if name not in diverged} == {"FINISHED"}, last["runs"]
    assert all(files > 0 for _, _, files in arm_runs), arm_runs
    assert {name.split("-seed")[0] for name, _, _ in arm_runs} == set(CPU_ARMS)
    every_arm = outcomes[mode]["every arm"]
    assert set(every_arm["checkpoints"]) >= {f"models/{arm}/seed0.pt" for arm in ("fp32", "bf16", "bf16_sr")}
