"""Faults with real processes: signal bursts, kill -9, a killed `dvc repro`, a dying tracking server, a corrupted
store, a really full disk (a tmpfs, mounted when the tests run as root). Each ends with one line, nothing left
RUNNING for good, no temporary files, and a rerun that finishes the work."""

from __future__ import annotations

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
import torch

from conftest import (
    ARM_RUNS,
    ROOT,
    clean_env,
    make_project_repo,
    none_left,
    prepare_in_process,
    run_ok,
    train_in_process,
)

pytestmark = pytest.mark.slow

# The train stage with an action run right after the MLflow metrics of epoch AFTER are logged: deterministic,
# unlike a signal timed with sleep().
_DRIVER = """
import os, runpy, signal, sys, threading, time
sys.path[:0] = [{src!r}, {pipeline!r}]
from ampbench import tracking
real, seen = tracking.log_epoch, []
def burst(sig):  # from a thread: a signal every millisecond until the process is gone
    while True:
        os.kill(os.getpid(), sig)
        time.sleep(0.001)
def log_epoch(row, steps=()):
    real(row, steps)
    seen.append(row["epoch"])
    if len(seen) == {after}:
        {action}
tracking.log_epoch = log_epoch
sys.argv = [{train!r}, *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
"""


def _driver(after: int, action: str) -> list[str]:
    code = _DRIVER.format(src=str(ROOT / "src"), pipeline=str(ROOT / "pipeline"), after=after, action=action,
                          train=str(ROOT / "pipeline" / "train.py"))
    return [sys.executable, "-c", code]


def _wait_and_go(marker: Path, go: Path) -> str:
    """Action: say the epoch is logged (``marker``), then wait until the test says go on."""
    return (f"open({str(marker)!r}, 'w').close()\n"
            f"        while not os.path.exists({str(go)!r}): time.sleep(0.05)")


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"exited {proc.returncode} before {path.name}:\n{(err or '')[-3000:]}")
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.1)


@pytest.fixture
def setup(tmp_path, tiny_params, write_params):
    """(params file, prepared data, train args maker) for a 4-epoch fp32 arm."""
    def make(**train):
        tiny_params["train"].update({"epochs": 4, "seeds": [0], "precisions": ["fp32"], **train})
        tiny_params["mlflow"]["log_model"] = False
        return write_params(tiny_params, name=f"params{len(train)}.yaml")

    params = make()
    data = tmp_path / "prepared"
    prepare_in_process(params, data)

    def args(params_file: Path, name: str) -> list[str]:
        return ["--params", str(params_file), "--precision", "fp32", "--data", str(data),
                "--out", str(tmp_path / name / "fp32"), "--resume-dir", str(tmp_path / name / ".resume")]

    return make, params, args


def _runs(uri: str):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list", filter_string=ARM_RUNS)


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.tmp")]


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1 and stderr.strip().splitlines()[-1] == lines[0], stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_burst_of_signals_ends_the_run_killed(tmp_path, setup, sig):
    """Issue 14.1: signals every millisecond from epoch 2 on (so later ones land in the KILLED bookkeeping): the run
    ends KILLED, never FINISHED; exit 130, one line, no traceback, no temporary file; the rerun resumes."""
    _, params, args = setup
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    action = f"threading.Thread(target=burst, args=(signal.{sig.name},), daemon=True).start(); time.sleep(60)"
    cut = subprocess.run([*_driver(2, action), *args(params, "cut")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert cut.returncode == 130, cut.stderr[-3000:]
    assert f"interrupted ({sig.name})" in cut.stderr and "Traceback" not in cut.stderr, cut.stderr[-3000:]
    [run] = _runs(env["MLFLOW_TRACKING_URI"])
    assert run.info.status == "KILLED" and run.data.tags["ampbench.ended_by"] == sig.name
    assert not _temporaries(tmp_path)
    again = train_in_process(args(params, "cut"), env["MLFLOW_TRACKING_URI"])
    assert "resuming after epoch" in again
    assert [r.info.status for r in _runs(env["MLFLOW_TRACKING_URI"])] == ["FINISHED"]


def test_kill_9_leaves_no_run_running_for_good(tmp_path, setup):
    """Issue 14.5: after kill -9, the next run of the stage, even one that starts from scratch (other params), closes
    the dead process's run as KILLED with a reason; the run of a process still alive is left alone."""
    make, params, args = setup
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = clean_env(MLFLOW_TRACKING_URI=uri)
    procs = {}
    for name in ("dead", "alive"):
        marker, go = tmp_path / f"{name}.logged", tmp_path / f"{name}.go"
        procs[name] = subprocess.Popen([*_driver(1, _wait_and_go(marker, go)), *args(params, name)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(marker, procs[name])
    procs["dead"].kill()
    procs["dead"].wait()
    assert sorted(r.info.status for r in _runs(uri)) == ["RUNNING", "RUNNING"]

    other = make(lr=0.02)  # other params: the dead run's checkpoint is not resumed, training starts over
    train_in_process(args(other, "dead"), uri)
    runs = {r.data.tags["ampbench.pid"]: r for r in _runs(uri)}
    dead = runs[str(procs["dead"].pid)]
    assert dead.info.status == "KILLED"
    assert f"process {procs['dead'].pid}" in dead.data.tags["ampbench.ended_by"]
    assert "died" in dead.data.tags["ampbench.ended_by"]
    assert runs[str(procs["alive"].pid)].info.status == "RUNNING"  # alive: not ours to close

    (tmp_path / "alive.go").touch()
    assert procs["alive"].wait(timeout=300) == 0, procs["alive"].communicate()[1][-3000:]
    assert runs[str(procs["alive"].pid)].info.run_id in {r.info.run_id for r in _runs(uri)
                                                           if r.info.status == "FINISHED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(backend: str, artifacts: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--artifacts-destination", str(artifacts)],
                            env=clean_env(MLFLOW_BACKEND_STORE_URI=backend, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    import urllib.request

    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return proc
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the MLflow server did not start"
            time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_tracking_server_killed_mid_run(tmp_path, setup):
    """Issue 14.9: the server dies during training: one line naming the store, exit 2, the epochs done kept; with
    the server back, the rerun resumes in the same run and closes it FINISHED."""
    _, params, args = setup
    backend, port = f"sqlite:///{tmp_path / 'server.db'}", _free_port()
    server = _server(backend, tmp_path / "served", port)
    uri = f"http://127.0.0.1:{port}"
    # MLflow retries HTTP calls for minutes by default; a test cannot wait that long.
    env = clean_env(MLFLOW_TRACKING_URI=uri, MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_TIMEOUT="5")
    marker, go = tmp_path / "logged", tmp_path / "go"
    try:
        proc = subprocess.Popen([*_driver(2, _wait_and_go(marker, go)), *args(params, "m")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(marker, proc)
        _stop(server)
        go.touch()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2
        line = _one_error_line(err)
        assert line.startswith(f"error: MLflow store {uri}") and "run the stage again" in line, line
        assert not _temporaries(tmp_path)
        server = _server(backend, tmp_path / "served", port)
        again = run_ok([sys.executable, str(ROOT / "pipeline" / "train.py"), *args(params, "m")], tmp_path, env)
        assert "resuming after epoch" in again
        assert [r.info.status for r in _runs(uri)] == ["FINISHED"]
    finally:
        _stop(server)


def test_store_corrupted_mid_run(tmp_path, setup):
    """Issue 14.9: the SQLite store is overwritten with garbage during training: one line naming it, exit 2."""
    _, params, args = setup
    db = tmp_path / "mlflow.db"
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    marker, go = tmp_path / "logged", tmp_path / "go"
    proc = subprocess.Popen([*_driver(1, _wait_and_go(marker, go)), *args(params, "m")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(marker, proc)
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if path.exists():
            with open(path, "r+b") as f:
                f.write(os.urandom(path.stat().st_size))
    go.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    line = _one_error_line(err)
    assert f"MLflow store sqlite:///{db}" in line, line
    assert not _temporaries(tmp_path)
    assert (tmp_path / "m" / ".resume" / "seed0.pt").exists()  # the epochs done are kept for the rerun


@pytest.mark.parametrize("command, preload", [(["repro"], "0"), (["exp", "run", "-S", "train.epochs=501"], "1")],
                         ids=["repro-plain", "exp-run-preloaded"])
def test_sigterm_to_dvc_stops_every_process_of_the_pipeline(tmp_path, tiny_params, command, preload):
    """Issue 14.6, 49: SIGTERM to `dvc repro` or `dvc exp run` while a stage trains: within 5 s no process of the
    pipeline is left (the stage watches the dvc that launched it; a served stage's client waits for it), the run
    is KILLED, and the stage's one line says why it stopped."""
    tiny_params["train"].update({"precisions": ["fp32"], "epochs": 500})
    tiny_params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(tmp_path / "project", tiny_params)
    run = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))  # a preload server of its own (a socket's path is short)
    env = {**env, "AMPBENCH_PRELOAD": preload, "XDG_RUNTIME_DIR": str(run), "AMPBENCH_PRELOAD_IDLE": "20"}
    log = open(tmp_path / "dvc.log", "w")  # a file, not a pipe nobody reads: dvc must never block on its output
    dvc = subprocess.Popen([sys.executable, "-m", "dvc", *command], cwd=repo, env=env, stdout=log,
                           stderr=subprocess.STDOUT)
    _wait_for(repo / ".resume" / "fp32" / "seed0.pt", dvc)  # the first epoch is done: training runs
    dvc.send_signal(signal.SIGTERM)
    dvc.wait(timeout=60)
    log.close()
    try:
        assert none_left(repo) == []
    finally:
        shutil.rmtree(run, ignore_errors=True)
    [kept] = _runs(f"sqlite:///{repo / 'mlflow.db'}")
    assert kept.info.status == "KILLED"
    assert "[train@fp32] interrupted (SIGTERM: dvc (pid " in (tmp_path / "dvc.log").read_text()


# --- a really full disk: a tmpfs of a few hundred KiB ------------------------------------------------------------

def _can_mount() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and Path("/proc/filesystems").read_text().find("tmpfs") >= 0


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of the size asked for, mounted under tmp_path (root only; skipped otherwise)."""
    if not _can_mount():
        pytest.skip("mounting a small filesystem needs root")
    mounts = []

    def mount(name: str, size_kib: int) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: Path, leave_kib: int) -> None:
    """Fill ``folder``'s filesystem to ``leave_kib`` KiB free."""
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    (folder / "ballast").write_bytes(b"\0" * max(free - leave_kib * 1024, 0))


def test_disk_full_while_writing_outputs(tmp_path, setup, small_fs):
    """Issue 14.8: the model folder on a full filesystem: one line (the file, "No space left on device"), exit 2,
    no temporary file left on it, the run FAILED (not RUNNING)."""
    _, params, args = setup
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    full = small_fs("full", 512)
    _fill(full, 8)
    cmd = [sys.executable, str(ROOT / "pipeline" / "train.py"), *args(params, "x")]
    cmd[cmd.index("--out") + 1] = str(full / "fp32")
    cmd[cmd.index("--resume-dir") + 1] = str(full / ".resume")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    line = _one_error_line(done.stderr)
    assert "No space left on device" in line and str(full) in line, line
    assert not _temporaries(full) and not list(full.rglob("*.pt"))
    assert [r.info.status for r in _runs(env["MLFLOW_TRACKING_URI"])] in ([], ["FAILED"])


def test_disk_full_while_creating_the_store(tmp_path, setup, small_fs):
    """Issue 14.9: the store's filesystem fills while MLflow creates its tables: one line, and no half-made store
    is left behind to fail forever with "table … already exists"; with space again the same command works."""
    _, params, args = setup
    full = small_fs("store", 256)
    _fill(full, 40)
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{full / 'mlflow.db'}")
    cmd = [sys.executable, str(ROOT / "pipeline" / "train.py"), *args(params, "y")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    line = _one_error_line(done.stderr)
    assert "MLflow store" in line and "full" in line.lower(), line
    assert not (full / "mlflow.db").exists()
    (full / "ballast").unlink()
    subprocess.run(["mount", "-o", "remount,size=65536k", str(full)], check=True)
    run_ok(cmd, tmp_path, env)
    assert [r.info.status for r in _runs(env["MLFLOW_TRACKING_URI"])] == ["FINISHED"]
    assert torch.load(tmp_path / "y" / "fp32" / "seed0.pt", weights_only=True)["epoch"] == 4


@pytest.mark.parametrize("served", [False, True], ids=["plain", "served"])
def test_disk_full_while_evaluate_logs_is_one_line(tmp_path, setup, small_fs, served, request):
    """Issue 53.3: the store's filesystem fills while evaluate logs into it: MLflow logged ~45 lines of its
    SQLAlchemy traceback on stderr before our line, as a plain process and through the preload server. Now exactly
    one stderr line, naming the store, the full disk, where MLflow's own log went and what is kept; exit 2; no report
    published; no run RUNNING; with room again the same command publishes the reports. 96 KiB free: the store opens
    (about 40 KiB: its WAL index), and the first writes of the logging fill it (the figures, copied after them, would
    need 160 KiB more)."""
    import shutil
    import tempfile

    _, params, args = setup
    store = small_fs("store", 16384)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    env = clean_env(MLFLOW_TRACKING_URI=uri, DVC_ROOT=str(tmp_path), AMPBENCH_PRELOAD="0")  # DVC_ROOT: logs/ there
    run_ok([sys.executable, str(ROOT / "pipeline" / "train.py"), *args(params, "m")], tmp_path, env)
    if served:  # a server of the test's own, in a folder of its own (a socket's path must be short)
        run = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))
        request.addfinalizer(lambda: shutil.rmtree(run, ignore_errors=True))
        env.update(AMPBENCH_PRELOAD="1", XDG_RUNTIME_DIR=str(run), AMPBENCH_PRELOAD_IDLE="5")
    launcher = [sys.executable, *([str(ROOT / "src" / "ampbench" / "runtime" / "preload.py")] if served else [])]
    reports = tmp_path / "reports"
    evaluate = [*launcher, str(ROOT / "pipeline" / "evaluate.py"), "--params", str(params), "--data",
                str(tmp_path / "prepared"), "--models", str(tmp_path / "m"), "--reports", str(reports)]
    _fill(store, 96)
    done = subprocess.run(evaluate, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    log = tmp_path / "logs" / "mlflow.log"
    assert line.startswith(f"error: MLflow store {uri}: (sqlite3.OperationalError) database or disk is full; its "
                           f"disk is full ("), line
    assert f"KiB free in {store}); MLflow's own log of it: {log} — no report was published" in line, line
    assert "the trained models are kept" in line, line
    assert "ERROR mlflow.store.db.utils: SQLAlchemy database error" in log.read_text()  # MLflow's, in its file
    assert not [p for p in reports.rglob("*") if p.is_file()]
    if served:  # it was: the server answers (none refused)
        assert list(run.glob("ampbench/*.sock")) and not list(run.glob("ampbench/*.refused"))

    (store / "ballast").unlink()
    import mlflow

    mlflow.set_tracking_uri(uri)
    assert not mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'RUNNING'",
                                  output_format="list")
    run_ok(evaluate, tmp_path, env)
    assert (reports / "report.md").exists() and [r.info.status for r in _runs(uri)] == ["FINISHED"]


_EVALUATE_DRIVER = """
import os, runpy, signal, sys
sys.path[:0] = [{src!r}, {pipeline!r}]
from ampbench.stages import evaluate as evaluate_stage
real = evaluate_stage.atomic_write_text
def write_text(path, text):  # report.md, after comparison.json, speed.json, details.json, curves.json
    os.kill(os.getpid(), signal.SIGTERM)
    real(path, text)
evaluate_stage.atomic_write_text = write_text
sys.argv = [{evaluate!r}, *sys.argv[1:]]
runpy.run_path({evaluate!r}, run_name="__main__")
"""


def test_signal_while_evaluate_writes_reports_leaves_the_old_set(tmp_path, setup, tiny_params, write_params):
    """SIGTERM in the middle of writing the reports: exit 130, no temporary file or staging folder, and the reports
    are the previous run's, every one of them (never half old, half new); the next run replaces them all."""
    make, params, args = setup
    env = clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    train_in_process(args(params, "m"), env["MLFLOW_TRACKING_URI"])
    reports = tmp_path / "reports"
    evaluate = ["--params", str(params), "--data", str(tmp_path / "prepared"), "--models", str(tmp_path / "m"),
                "--reports", str(reports)]
    run_ok([sys.executable, str(ROOT / "pipeline" / "evaluate.py"), *evaluate], tmp_path, env)
    before = {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()}
    assert len(before) >= 8

    changed = make(epochs=4, seeds=[0])  # same training, other evaluate params: every report changes
    text = changed.read_text().replace("confidence: 0.95", "confidence: 0.9")
    assert text != changed.read_text()
    changed.write_text(text)
    evaluate[1] = str(changed)
    driver = _EVALUATE_DRIVER.format(src=str(ROOT / "src"), pipeline=str(ROOT / "pipeline"),
                                     evaluate=str(ROOT / "pipeline" / "evaluate.py"))
    cut = subprocess.run([sys.executable, "-c", driver, *evaluate], env=env, capture_output=True, text=True,
                         timeout=300)
    assert cut.returncode == 130 and "interrupted (SIGTERM)" in cut.stderr, cut.stderr[-3000:]
    assert "Traceback" not in cut.stderr
    after = {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()}
    assert after == before
    assert not list(reports.glob(".staging-*")) and not _temporaries(reports)

    run_ok([sys.executable, str(ROOT / "pipeline" / "evaluate.py"), *evaluate], tmp_path, env)
    assert "90%" in (reports / "report.md").read_text() and "90%" not in before[reports / "report.md"].decode()
