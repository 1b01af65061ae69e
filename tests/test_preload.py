"""The preload server (src/ampbench/runtime/preload*.py): a script handed to it behaves as under ``python SCRIPT``.

Each test has its own runtime folder (XDG_RUNTIME_DIR), so its own server, which imports only ``json`` (the
``AMPBENCH_PRELOAD_MODULES`` knob) unless the test is about the real list; servers idle out within seconds.
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

from conftest import ROOT, clean_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the preload server is Linux-only")

RUNTIME = ROOT / "src" / "ampbench" / "runtime"
sys.path.insert(0, str(RUNTIME))
import preload  # noqa: E402  (a script's module, by path as the server imports it)

sys.path.remove(str(RUNTIME))


@pytest.fixture(autouse=True)
def _short_runtime_dir(tmp_path):
    """A runtime folder of the test's own (a socket's path must be short: pytest's tmp_path can be too long)."""
    run = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))
    (tmp_path / "run").symlink_to(run)
    yield
    shutil.rmtree(run, ignore_errors=True)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    run = (tmp_path / "run").resolve()
    return clean_env(XDG_RUNTIME_DIR=str(run), AMPBENCH_PRELOAD_MODULES="json", AMPBENCH_PRELOAD_IDLE="20", **extra)


def _client(script: Path, *args: str, env: dict, cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(RUNTIME / "preload.py"), str(script), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _logs(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "run" / "ampbench").glob("*.log"))


PROBE = """import os, sys
print(__name__, __file__, sys.argv, os.getcwd(), sys.path[0], os.environ.get("PROBE"), sys.stdin.read().strip())
print(os.environ.get("AMPBENCH_LAUNCHER_PID"), os.getpid(), os.getppid(), file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_script_runs_as_under_python_and_the_second_is_served(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = _env(tmp_path, PROBE="from the caller")
    plain = subprocess.run([sys.executable, str(script), "3", "x"], cwd=tmp_path, env=env, input="stdin text",
                           capture_output=True, text=True)
    for _ in range(2):
        proc = _client(script, "3", "x", env=env, cwd=tmp_path, stdin=subprocess.PIPE)
        out, err = proc.communicate("stdin text", timeout=60)
        assert (proc.returncode, out) == (3, plain.stdout), err
        launcher, pid, parent = err.split()
        assert launcher == str(proc.pid) and pid != str(proc.pid)  # forked by the server, for this client
    assert _logs(tmp_path).count(" for client ") == 2


def test_signals_reach_the_stage_and_a_killed_client_stops_it(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text("import os, signal, sys, time\n"
                      "def bye(signum, frame):\n"
                      f"    open({str(tmp_path / 'got')!r} + sys.argv[1], 'w').write(str(signum)); sys.exit(7)\n"
                      "signal.signal(signal.SIGTERM, bye)\n"
                      "print('ready', flush=True)\n"
                      "time.sleep(60)\n")
    env = _env(tmp_path)
    proc = _client(script, "1", env=env, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7 and (tmp_path / "got1").read_text() == str(int(signal.SIGTERM))

    proc = _client(script, "2", env=env, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()  # SIGKILL: the client cannot pass anything on; the server sees its end close
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    got = tmp_path / "got2"  # open() creates it before write() fills it: wait for its content
    while not (got.exists() and got.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got.read_text() == str(int(signal.SIGTERM))

    killed = tmp_path / "killed.py"
    killed.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert _client(killed, env=env, cwd=tmp_path).wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("preload", ["0", "1"], ids=["plain", "served"])
def test_a_stage_started_with_sigint_ignored_keeps_it_ignored(tmp_path, preload):
    """A shell starts a background job (`dvc repro &` in a script) with SIGINT ignored, so that a Ctrl-C meant for
    the foreground leaves it alone; python keeps that, and so does a stage, served or not. SIGTERM still stops it."""
    script = tmp_path / "stage.py"
    script.write_text("import os, sys, time\n"
                      "from ampbench.runtime import signals\n"
                      "signals.handle_signals_once()\n"
                      "try:\n"
                      "    print('ready', flush=True)\n"  # inside: a signal right after it is handled too
                      "    while not os.path.exists('go'):\n"
                      "        signals.checkpoint(); time.sleep(0.02)\n"
                      "except KeyboardInterrupt as exc:\n"
                      "    print('interrupted', exc); sys.exit(130)\n"
                      "print('finished')\n")
    env = _env(tmp_path, AMPBENCH_PRELOAD=preload)
    for sig, expected in ((signal.SIGINT, (0, "finished")), (signal.SIGTERM, (130, "interrupted SIGTERM"))):
        (tmp_path / "go").unlink(missing_ok=True)
        proc = _client(script, env=env, cwd=tmp_path,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        if sig == signal.SIGINT:  # ignored, the wait goes on until told; heard, it would have ended by now
            time.sleep(0.5)
            (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=30)  # SIGTERM must end the wait by itself
        assert (proc.returncode, out.strip()) == expected, err


# Scripts whose ending is easy to get wrong without the interpreter's teardown; each must end exactly as under
# `python SCRIPT`: the same status (or signal), stdout, stderr and files.
ENDINGS = {
    # A dead weak proxy in the heap (inspecting it raises ReferenceError: it failed the bf16_sr stage), an object
    # whose __class__ warns (as torch's deprecated names do), and an SQLite database as MLflow's store keeps one.
    "inspection": ("import sqlite3, weakref\nclass A: pass\na = A()\nkept = [weakref.proxy(a)]\ndel a\n"
                   "db = sqlite3.connect('x.db')\ndb.execute('create table t (x)')\nprint('ok')\n"),
    # A gzip file never closed, in the script's globals and in a cycle: its trailer is written at teardown.
    "gzip": ("import gzip\nf = gzip.open('out.gz', 'wt')\nf.write('x' * 1000)\n"
             "class Cycle: pass\nc = Cycle(); c.me = c; c.g = gzip.open('cycle.gz', 'wt'); c.g.write('y')\n"),
    # C's stdio buffer (stdout is a pipe, so fully buffered): written by libc at exit.
    "libc": "import ctypes\nctypes.CDLL(None).printf(b'from C\\n')\n",
    "exit_code": "import sys\nprint('before')\nsys.exit(5)\n",
    "exit_message": "import sys\nsys.exit('a message')\n",
    "exception": "def f():\n    raise ValueError('boom')\nf()\n",
    "ctrl_c": "raise KeyboardInterrupt\n",
    "threads_and_atexit": ("import atexit, threading, time\n"
                           "def later(): time.sleep(0.3); print('thread done', flush=True)\n"
                           "threading.Thread(target=later).start()\n"
                           "atexit.register(lambda: print('atexit ran'))\n"),
}


def _files(folder: Path) -> dict[str, bytes]:
    import gzip

    out = {}
    for p in sorted(folder.glob("*.gz")):
        out[p.name] = gzip.decompress(p.read_bytes())  # raises on a missing trailer
    return out


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_a_script_ends_as_under_python_served_or_not(tmp_path, name):
    """The same status, output and files under `python SCRIPT`, through the server, and through the client with
    AMPBENCH_PRELOAD=0; a module the server preloaded has its exit function run in the stage too."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "registers.py").write_text(
        "import atexit, warnings\natexit.register(print, 'library atexit')\n"
        "class Deprecated:\n    @property\n    def __class__(self):\n"
        "        warnings.warn('inspected', FutureWarning)\n        return Deprecated\nthing = Deprecated()\n")
    script = tmp_path / f"{name}.py"
    script.write_text("import registers\n" + ENDINGS[name])
    env = {**_env(tmp_path), "AMPBENCH_PRELOAD_MODULES": "registers", "PYTHONPATH": str(tmp_path / "lib")}
    results = {}
    for how in ("python", "served", "served again", "plain"):
        work = tmp_path / how.replace(" ", "_")
        work.mkdir()
        if how == "python":
            proc = subprocess.Popen([sys.executable, str(script)], cwd=work, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        else:
            proc = _client(script, env={**env, "AMPBENCH_PRELOAD": "0" if how == "plain" else "1"}, cwd=work)
        out, err = proc.communicate(timeout=60)
        results[how] = (proc.returncode, out, err.replace(str(work), "WORK"), _files(work))
    assert results["served"] == results["python"] == results["served again"] == results["plain"], results
    assert "library atexit" in results["python"][1]
    assert _logs(tmp_path).count(" for client ") == 2  # two were served (the server did not refuse)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_a_served_script_has_the_commands_cpus_limits_and_priority(tmp_path):
    """The server was started by an unpinned command; a pinned, limited, nice'd one gets its own settings."""
    import resource

    script = tmp_path / "where.py"
    script.write_text("import os, resource\nprint(sorted(os.sched_getaffinity(0)), "
                      "resource.getrlimit(resource.RLIMIT_NOFILE)[0], os.getpriority(os.PRIO_PROCESS, 0))\n")
    env = _env(tmp_path)
    assert _client(script, env=env, cwd=tmp_path).wait(timeout=60) == 0  # starts the server, unpinned
    cpu = sorted(os.sched_getaffinity(0))[-1]
    soft = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1024) - 1

    def pinned():
        os.sched_setaffinity(0, {cpu})
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.nice(3)

    proc = _client(script, env=env, cwd=tmp_path, preexec_fn=pinned)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out.split(), err) == (0, [f"[{cpu}]", str(soft), str(os.getpriority(os.PRIO_PROCESS, 0)
                                                                                    + 3)], "")
    assert _logs(tmp_path).count(" for client ") == 2


def test_a_server_whose_imports_start_a_thread_is_not_used(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "spins.py").write_text("import threading, time\n"
                                               "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**_env(tmp_path), "AMPBENCH_PRELOAD_MODULES": "spins", "PYTHONPATH": str(tmp_path / "lib")}
    for _ in range(2):
        proc = _client(script, "0", env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and err.split()[:2] == ["None", str(proc.pid)]  # the client became the script
    assert "refusing to serve: importing spins started 1 thread(s)" in _logs(tmp_path)
    assert _logs(tmp_path).count("starting:") == 1  # remembered: the second run did not try again


def test_what_selects_a_server():
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    path = sys.path[1:]
    same = preload.key(env, path)
    assert preload.key({**env, "MLFLOW_TRACKING_URI": "sqlite:///x", "DVC_STAGE": "train",
                        "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace"}, path) == same  # read when called
    for changed in ({"OMP_NUM_THREADS": "2"}, {"CUDA_VISIBLE_DEVICES": "1"}, {"AMPBENCH_PRELOAD_MODULES": "json"},
                    {"PYTHONHASHSEED": "0"}):
        assert preload.key({**env, **changed}, path) != same
    assert not preload.enabled({"AMPBENCH_PRELOAD": "0"}) and preload.enabled({}) == sys.platform.startswith("linux")


def test_an_idle_server_exits(tmp_path):
    script = tmp_path / "quick.py"
    script.write_text("print('hi')\n")
    env = {**_env(tmp_path), "AMPBENCH_PRELOAD_IDLE": "1"}
    assert _client(script, env=env, cwd=tmp_path).wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while list((tmp_path / "run" / "ampbench").glob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list((tmp_path / "run" / "ampbench").glob("*.sock")) and "idle: exiting" in _logs(tmp_path)
