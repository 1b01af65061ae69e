"""Shared test fixtures: tiny params, an MLflow store under tmp_path, the pipeline scripts importable, and the
helpers subprocess tests share (a cleaned environment, a throwaway project repo)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ampbench.config.params import Params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pipeline"))  # stage scripts import `_common` as a sibling module

# The processes the tests start (DVC, stages, commands) hear SIGINT as a terminal's foreground job does, also when
# the suite itself was started with it ignored (`make test &` in a script, nohup): a stage keeps an inherited
# SIG_IGN (runtime/signals.py), and the tests that send SIGINT would wait on a process that never hears it. A
# Python handler is not inherited across exec; the default is.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Each test project links this venv at a path of its own (link_venv), and torch's C++ compile caches are keyed by
# include paths under it: pipeline/python runs the venv by its physical path, but a process started through the
# link compiles bf16_sr's optimizer afresh, and with precompiled headers on each such compile also wrote a 158 MB
# header to /tmp/torchinductor_<user> and took longer (a first step of 8.0 s against 5.3-6.1 s without, measured).
# Off for the tests and the stages they start; a user's one project reuses its header.
os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")  # in-process DVC commands too (clean_env says why)

# The end-to-end test commits in temporary repos; give git an identity without touching global config.
for var, value in {"GIT_AUTHOR_NAME": "ampbench tests", "GIT_AUTHOR_EMAIL": "tests@ampbench.invalid",
                   "GIT_COMMITTER_NAME": "ampbench tests", "GIT_COMMITTER_EMAIL": "tests@ampbench.invalid"}.items():
    os.environ.setdefault(var, value)


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


# The repo's params.yaml with tiny overrides: a complete file, as DVC needs every key a stage lists.
_TINY_OVERRIDES = {
    "prepare": {"dataset": "digits", "seed": 0, "max_train": 240, "val_fraction": 0.15, "test_fraction": 0.15},
    "train": {"precisions": ["fp32", "tf32", "fp16", "bf16"], "seeds": [0], "device": "cpu", "model": "small_cnn",
              "epochs": 1, "batch_size": 32, "progress": False,
              "eval_every": 0},  # validation at epoch ends only; test_cli's stages run the default (4 per epoch)
    "speed": {"rounds": 3, "steps": 6, "window": 3, "warmup_steps": 3, "seconds_per_arm": 3},
    "evaluate": {"batch_size": 512},
    "mlflow": {"experiment": "ampbench-tests", "log_model": True},
}
TINY = _merged(Params().to_dict(), _TINY_OVERRIDES)  # the schema's defaults, not the workspace's params.yaml
# The speed harness at its smallest, for a test that needs its line, not a good measurement (`ampbench fix`'s cost)
QUICK_SPEED = {"rounds": 2, "steps": 2, "window": 1, "warmup_steps": 0, "seconds_per_arm": 1}


# The longest test files first: `make test` runs files on two workers (pytest-xdist, --dist loadfile, in this
# order), and a long file started last would run alone at the end.
LONGEST_FIRST = ("test_default_path.py", "test_e2e.py", "test_faults.py", "test_lightning.py", "test_decide.py",
                 "test_reliability.py", "test_exit_window.py", "test_team_server.py", "test_hf_trainer.py",
                 "test_bench.py", "test_language_model.py", "test_cli.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


ARM_RUNS = "tags.`ampbench.role` = 'arm'"  # MLflow filter: the arm × seed runs, not the executions' parent runs

PROJECT_FILES = ["pipeline", "src", "examples", "data/raw/README.md", "reports/fix/README.md", "reports/fix_trial.json",
                 "dvc.yaml", ".dvcignore", ".gitignore", ".dvc/config", ".dvc/.gitignore", ".dvc/plots"]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without MLflow, DVC and torchrun variables (a subprocess must not inherit this
    test run's store, experiment or rank), with the venv's bin first on PATH (stages call `python`), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "DVC_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    # No usage report: DVC starts a daemon after every command to send one (half a second of CPU each, 54 in a
    # run of the suite, and this machine has no network to send it over).
    env["DVC_NO_ANALYTICS"] = "1"
    return {**env, **extra}


def run_ok(cmd: list[str], cwd: Path, env: dict) -> str:
    """Run a command; fail the test with its output tail if it fails; return stdout + stderr."""
    import subprocess

    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def link_venv(checkout: Path, env: dict[str, str]) -> dict[str, str]:
    """Make ``checkout`` look like a user's set-up one: this test run's venv at ``.venv`` and PATH without it (no
    activated venv), so the stages must find their interpreter through pipeline/python. Outside a venv, the
    interpreter is named in ``AMPBENCH_PYTHON`` instead. Returns the environment to run commands with."""
    venv = Path(sys.prefix)
    if not (venv / "pyvenv.cfg").exists():
        return {**env, "AMPBENCH_PYTHON": sys.executable}
    if not (checkout / ".venv").exists():
        (checkout / ".venv").symlink_to(venv, target_is_directory=True)
    return {**env, "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != venv / "bin")}


def pipeline_processes(root: Path) -> list[tuple[int, str]]:
    """Processes still at work in ``root`` (their directory is in it): dvc, stages, preloaded stages and their
    clients; not a preload server (the leader of its own session, shared by stages to come; it exits when idle),
    not a zombie. (pid, command line) each."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = (entry / "cwd").resolve()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            leader = os.getsid(int(entry.name)) == int(entry.name)
        except (OSError, ProcessLookupError):
            continue
        server = any(a.endswith("preload_server.py") for a in argv) and leader
        if state != "Z" and not server and (cwd == root.resolve() or root.resolve() in cwd.parents):
            found.append((int(entry.name), " ".join(argv)))
    return found


def none_left(root: Path, within: float = 5.0) -> list[tuple[int, str]]:
    """``pipeline_processes(root)`` once none is left or ``within`` seconds have passed (the leftovers, killed)."""
    import signal
    import time

    deadline = time.monotonic() + within
    while (left := pipeline_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def make_project_repo(repo: Path, params: dict) -> tuple[Path, dict]:
    """A fresh git + DVC repo holding this project's pipeline and ``params``, committed. Returns (repo, env)."""
    import shutil

    repo.mkdir(parents=True)
    for rel in PROJECT_FILES:
        src, dst = ROOT / rel, repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dst)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # DVC runs a stage as `$SHELL -c CMD`: /bin/sh is what CI and many accounts have, and dash, unlike bash, does
    # not replace itself with the command, so a stage's signals and exit status pass one more process.
    env = link_venv(repo, clean_env(SHELL="/bin/sh"))
    run_ok(["git", "init", "-q"], repo, env)
    run_ok(["git", "add", "-A"], repo, env)
    run_ok(["git", "commit", "-qm", "tiny pipeline"], repo, env)
    return repo, env


def dvc_exps(repo: Path) -> dict[str, dict]:
    """`dvc exp show --json`'s experiments of HEAD, by name: their params.yaml and metrics as DVC reads them."""
    shown = json.loads(subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=repo, check=True,
                                      capture_output=True, text=True).stdout)
    got = {}
    for row in shown:
        for exp in row.get("experiments") or []:
            for rev in exp["revs"]:
                data = rev["data"]
                got[rev["name"]] = {"params": data["params"]["params.yaml"]["data"],
                                    "metrics": {path: m["data"] for path, m in data["metrics"].items() if "data" in m}}
    return got


TORCH_ONLY = ("mlflow", "dvc", "pydantic", "click", "tqdm", "yaml", "sklearn", "matplotlib", "scipy", "pytest")
# The lent GPU machine has torch, torchvision, numpy, scipy, matplotlib, click, pyyaml, tqdm, psutil and pytest.
GPU_MACHINE_LACKS = ("mlflow", "dvc", "pydantic", "sklearn", "ruamel")


def gpu_box_env(tmp_path: Path, blocked: tuple[str, ...] = TORCH_ONLY) -> dict[str, str]:
    """Environment of a simulated GPU box without the ``blocked`` packages (default: torch and torchvision only).
    Importing a blocked package fails as if it were absent; a mere probe (torch probes optional packages with
    importlib.util.find_spec) still succeeds, so only real imports are caught."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, importlib.machinery, sys\n"
        f"BLOCKED = {set(blocked)!r}\n"
        "class _Absent(importlib.abc.Loader):\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        "        raise ImportError(f'{module.__name__} is not installed on this (simulated) GPU box')\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            return importlib.machinery.ModuleSpec(name, _Absent())\n"
        "sys.meta_path.insert(0, _Block())\n")
    return {"PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}", "PATH": "/usr/bin:/bin"}


def prepare_in_process(params: Path, out: Path) -> Path:
    """The prepare stage, in this process (its output is the same as a subprocess's; tests of the stage as a
    process are elsewhere): ``out``."""
    from click.testing import CliRunner
    from pipeline.prepare import main as prepare_stage

    result = CliRunner().invoke(prepare_stage, ["--params", str(params), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def train_in_process(args: list[str], tracking_uri: str) -> str:
    """The train stage with ``args``, in this process, against the store ``tracking_uri`` (for the reruns and
    references of process-level tests, where the process under test is another one): its output, exit 0."""
    from click.testing import CliRunner
    from pipeline.train import main as train_stage

    with pytest.MonkeyPatch.context() as mp, torch_flags_restored():
        mp.setenv("MLFLOW_TRACKING_URI", tracking_uri)
        result = CliRunner().invoke(train_stage, [str(a) for a in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def prepare_synthetic(folder: Path, prepare: dict, train: dict | None = None) -> tuple[dict, Path]:
    """The tiny params with synthetic data (``prepare`` overrides, ``train`` overrides, no model logging), written
    to ``folder``/params.yaml and prepared by the prepare stage into ``folder``/prepared: (params, prepared)."""
    from click.testing import CliRunner
    from pipeline.prepare import main as prepare_stage

    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["prepare"].update({"dataset": "synthetic", "max_train": None, **prepare})
    params["train"].update(train or {})
    params["mlflow"]["log_model"] = False
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    result = CliRunner().invoke(prepare_stage, ["--params", str(path), "--out", str(folder / "prepared")])
    assert result.exit_code == 0, result.output
    return params, folder / "prepared"


@pytest.fixture
def tiny_params() -> dict:
    """A deep copy of the tiny params (1 epoch, 1 seed, 240 digits, CPU)."""
    return yaml.safe_load(yaml.safe_dump(TINY))


@pytest.fixture(scope="module")
def tiny_params_module() -> dict:
    """The same, for a module-scoped set-up that several tests read."""
    return yaml.safe_load(yaml.safe_dump(TINY))


def interrupted_at_epoch_log(monkeypatch, n: int, train) -> None:
    """Run ``train()`` with the ``n``-th epoch's MLflow log raising KeyboardInterrupt (as the SIGTERM handler does
    wherever the signal lands), and expect it to propagate."""
    from ampbench import tracking

    real, calls = tracking.log_epoch, {"n": 0}

    def flaky(row, steps):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt("SIGTERM")
        real(row, steps)

    with monkeypatch.context() as m:  # undoes only this patch, not a fixture's MLFLOW_TRACKING_URI
        m.setattr(tracking, "log_epoch", flaky)
        with pytest.raises(KeyboardInterrupt):
            train()


def stage_command(name: str, params: Path, *args: str) -> list[str]:
    """The command line of stage ``name`` (pipeline/<name>.py) with ``params`` and further options."""
    return [sys.executable, str(ROOT / "pipeline" / f"{name}.py"), "--params", str(params), *args]


def train_fp32_only(root: Path, data: Path) -> tuple[dict, Path, Path]:
    """(params, params file, models folder) of the tiny params' fp32 arm alone (no logged model) trained once in
    ``root`` on the prepared ``data``: the models the evaluate-side tests damage or evaluate again."""
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["train"].update({"precisions": ["fp32"]})
    params["mlflow"]["log_model"] = False
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    # In a subprocess: training sets process-wide torch flags that a module fixture would leak into later tests.
    run_ok(stage_command("train", path, "--precision", "fp32", "--data", str(data), "--out",
                         str(root / "models" / "fp32"), "--resume-dir", str(root / ".resume")), root,
           clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}"))
    return params, path, root / "models"


@pytest.fixture
def write_params(tmp_path):
    def write(params: dict, name: str = "params.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(params))
        return path

    return write


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    """Point MLflow at a fresh SQLite store in tmp_path for this test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@contextlib.contextmanager
def torch_flags_restored():
    """Put torch's global backend flags (precision policies, deterministic mode) back as they were afterwards."""
    kernels = (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn,
               torch.backends.mkldnn.matmul, torch.backends.mkldnn.conv, torch.backends.mkldnn.rnn)
    saved = [k.fp32_precision for k in kernels]
    deterministic, matmul = torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision()
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)  # first: it sets some of the flags below
        for k, mode in zip(kernels, saved, strict=True):
            k.fp32_precision = mode
        torch.use_deterministic_algorithms(deterministic)


@pytest.fixture(autouse=True)
def _restore_torch_flags():
    """Tests change global backend flags through precision policies; put them back afterwards. (A module-scoped
    set-up that trains in this process wraps itself in ``torch_flags_restored`` too: it runs before this.)"""
    with torch_flags_restored():
        yield


def arm_summary(arm: str, **fields):
    """A summary.json's record (``config.records.ArmSummary``) for tests that build reports by hand: an arm that
    trained on a CPU, with ``fields`` on top."""
    from ampbench.config.records import ArmSummary

    raw = {"arm": arm, "skipped": None, "hardware": {"device_name": "CPU: test", "device_type": "cpu"},
           "model": {"name": "small_cnn", "args": {}, "width": None, "parameters": 1, "flops_per_sample": 1},
           "samples_per_s": 100.0, "peak_memory_mb": 10.0, "policy": {}, **fields}
    return ArmSummary.model_validate(raw)
