"""A signal while a train stage ends (its last seed finished, its run FINISHED, the process not yet gone), through
a real `dvc repro`, with the preload server and without, for the image classifier and the language model: one
line from the stage, and the rerun trains nothing; MLflow holds exactly one FINISHED run per arm × seed.

The window is made deterministic by a hook the test adds to its copy of the pipeline (``pipeline/_hold.py``): the
stage waits at a chosen point of its ending until the test, having sent its signal, says go on:
- ``settle``: the arm's outputs and summary are written, its finished seeds still in ``.resume/`` (the stage exits
  130 and the rerun reuses them);
- ``exit``: past that point, in the exit functions (the stage exits 0 with its outputs, and DVC records it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ARM_RUNS, make_project_repo, run_ok
from test_language_model import write_text_folder

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="signals and /proc: Linux")]

HOLD = '''"""Test hook (tests/test_exit_window.py): the train stage waits at HOLD_AT of its ending until HOLD_DIR/go."""
import atexit
import os
import time
from pathlib import Path

from ampbench.runtime import signals

_AT, _DIR = os.environ.get("HOLD_AT"), Path(os.environ.get("HOLD_DIR", "."))


def _hold():
    # The process DVC started: the preload client for a served stage, else this one.
    (_DIR / "launcher").write_text(os.environ.get("AMPBENCH_LAUNCHER_PID") or str(os.getpid()))
    (_DIR / "held").touch()
    while not (_DIR / "go").exists():
        time.sleep(0.02)


if _AT in ("settle", "exit"):
    _settle = signals.settle

    def settle():
        if _AT == "settle":
            _hold()
        _settle()
        if _AT == "exit":
            atexit.register(_hold)  # after settle's own exit function, so it runs before it

    signals.settle = settle
'''


@pytest.fixture
def project(tmp_path, tiny_params):
    """A project repo whose train stage has the hook, a text folder for the language model, and a runtime folder
    of its own (its own preload server)."""
    tiny_params["train"].update({"precisions": ["fp32"], "seeds": [0]})
    tiny_params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(tmp_path / "project", tiny_params)
    (repo / "pipeline" / "_hold.py").write_text(HOLD)
    train = repo / "pipeline" / "train.py"
    train.write_text(train.read_text().replace("from ampbench.config.arms import",
                                               "import _hold  # noqa: F401\nfrom ampbench.config.arms import", 1))
    write_text_folder(repo / "data" / "raw" / "text")
    run_ok(["git", "add", "-A"], repo, env)
    run_ok(["git", "commit", "-qm", "the exit-window hook"], repo, env)
    run = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))  # a socket's path must be short
    yield repo, {**env, "XDG_RUNTIME_DIR": str(run), "AMPBENCH_PRELOAD_IDLE": "20"}
    shutil.rmtree(run, ignore_errors=True)


def _language_model(repo: Path) -> None:
    import yaml

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prepare"].update({"dataset": "text", "raw_dir": "data/raw/text", "max_train": None})
    params["train"].update({"task": "language_model", "model": "gpt", "width": 16, "block_size": 16,
                            "model_args": {"depth": 1, "heads": 2}, "lr": 0.003, "scheduler": "constant"})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _repro(repo: Path, env: dict, at: str | None = None, sig: signal.Signals | None = None,
           to: str = "group") -> tuple[int, str]:
    """`dvc repro train@fp32`; with ``at``, the stage is held there and sent ``sig`` (``to`` the whole process
    group, as Ctrl-C at a terminal, or to the process DVC started), then let go. Returns (status, output)."""
    hold = Path(tempfile.mkdtemp(prefix="hold-", dir=repo.parent))
    env = {**env, "HOLD_AT": at or "", "HOLD_DIR": str(hold)}
    dvc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "train@fp32"], cwd=repo, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if at:
        deadline = time.monotonic() + 300
        while not (hold / "held").exists() and dvc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (hold / "held").exists(), dvc.communicate()[0][-3000:]
        if to == "group":
            os.killpg(dvc.pid, sig)
        else:
            os.kill(int((hold / "launcher").read_text()), sig)
        time.sleep(1.0)  # the signal has reached the stage (forwarded by the preload client, if served)
        (hold / "go").touch()
    out, _ = dvc.communicate(timeout=600)
    return dvc.returncode, out


def _arm_runs(repo: Path) -> list[tuple[str, str, str]]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list", filter_string=ARM_RUNS)
    return sorted((r.data.params["train.task"], r.info.run_name, r.info.status) for r in runs)


def _ours(out: str) -> list[str]:
    """The lines the stage printed about the signal (not DVC's)."""
    return [line for line in out.splitlines() if line.startswith("[train@fp32]")]


# Each case: (task, where the stage is held, the signal, to whom). Across the two modes every window meets every
# task and both signals; plain and served each see both windows.
CASES = {"0": [("classification", "settle", signal.SIGINT, "group"), ("language_model", "exit", signal.SIGTERM,
                                                                         "launcher")],
         "1": [("classification", "exit", signal.SIGTERM, "launcher"), ("language_model", "settle", signal.SIGINT,
                                                                          "group")]}


@pytest.mark.parametrize("preload", ["0", "1"], ids=["plain", "preloaded"])
def test_a_signal_as_the_train_stage_ends_costs_no_retraining(project, preload):
    repo, env = project
    env = {**env, "AMPBENCH_PRELOAD": preload}
    for task, at, sig, to in CASES[preload]:
        if task == "language_model":
            _language_model(repo)
        status, out = _repro(repo, env, at, sig, to)
        assert "Traceback" not in out, out[-3000:]
        if at == "settle":  # the outputs were complete, the seeds not yet let go: the stage says so and fails
            assert status != 0 and "exited with 130" in out, out[-3000:]
            assert _ours(out) == [f"[train@fp32] interrupted ({sig.name}): the arm had completed; its 1 seed(s) are "
                                  "kept in .resume/fp32, and running the stage again reuses them without training"]
            status, out = _repro(repo, env)
            assert status == 0 and "seed 0: finished earlier" in out and "epoch 1/1" not in out, out[-3000:]
        else:  # past that point: the stage completed, says it got the signal, and DVC records it
            assert status == 0, out[-3000:]
            assert _ours(out) == [f"[train@fp32] {sig.name} after the stage completed: its outputs are complete and "
                                  "kept; it ends as it would have"]
            status, out = _repro(repo, env)
            assert status == 0 and "Data and pipelines are up to date" in out, out[-3000:]
        assert not (repo / ".resume" / "fp32").exists()
    assert _arm_runs(repo) == [("classification", "fp32-seed0", "FINISHED"),
                               ("language_model", "fp32-seed0", "FINISHED")]
