"""A stage's start-up paid once: a server that has imported torch and MLflow forks each stage command from itself.

Every DVC stage is a new Python process, and most of its fixed cost is importing torch, torch's compiler front end
(which every ``torch.optim`` optimizer pulls in) and MLflow, then using ``torch.export`` and MLflow's SQL store for
the first time. ``pipeline/python`` runs a stage through this file: the *client* hands the command (argv, working
directory, environment, umask and its own stdin/stdout/stderr, passed as file descriptors) over a Unix socket to a
*server* that imported those modules once; the server forks, the child becomes the stage — it runs the script as
``__main__`` the way ``python script.py`` would, with every ampbench module imported fresh from the checkout the
command names — and the client waits for it, passes on the signals it gets and exits with its status. The first
stage starts the server (paying the imports once, in its own process); a server with no stage running for
``AMPBENCH_PRELOAD_IDLE`` seconds (default 300) exits.

What makes a forked child the same as a new process here, and what does not carry over:

- Only third-party modules are preloaded, never ampbench or a user's code, so an edited checkout is what runs. A
  server serves one interpreter with one set of installed packages and one value of every variable read at import
  (thread counts, locale, ``PYTHON*``, ``TORCH*``, ``CUDA*``…): those are the server's key, a changed key starts
  another server. CUDA is never initialised in the server (a forked CUDA context is unusable).
- The server refuses to serve (the stage runs as a plain process) if preloading started a second thread: a fork
  copies only the forking thread, and a lock held by another would stay held in the child.
- The stage ends as python ends a script (threads joined, every exit function run, the preloaded libraries' too),
  except for the teardown of the modules, which ``preload_child.finish`` replaces by what of it can be seen from
  outside: the script's objects collected, every open file and libc's buffers flushed, the script's status.
- The child sets a parent-death signal (SIGTERM) so a killed server cannot leave it running; a client that
  vanishes (killed with SIGKILL) gets its stage sent SIGTERM, which the stages turn into their KILLED bookkeeping;
  ``AMPBENCH_LAUNCHER_PID`` tells the stage which process stands where its parent would, for its dvc watch
  (``processes.stop_when_gone``), which stops it when ``dvc`` is killed.
- Signals the client gets before the stage exists are kept and passed on once it does (or, if it never will, the
  client says so in one line and exits 130).
- numpy's global generator is reseeded in the child (a fresh process draws its own seed; children of one server
  would otherwise share one). torch's default generator starts from the same constant in any process.
- CPU peak RSS counts only the pages the child touched; CPU affinity, resource limits and cgroup are the server's
  (docs/operations.md).

``AMPBENCH_PRELOAD=0`` runs every stage as a plain process: a fresh interpreter running the same script through
the same ending (``python preload_child.py SCRIPT``). Linux only (elsewhere: a plain process). The server's
log is beside its socket, in ``$XDG_RUNTIME_DIR/ampbench`` or ``/tmp/ampbench-<uid>``.

Three files, run as scripts and using the standard library only, so that no side imports ampbench: this one (the
client, and what both sides agree on; ``python preload.py SCRIPT ARGS…``), ``preload_server.py`` (``python
preload_server.py SOCKET``) and ``preload_child.py`` (what a forked child does to become the stage).
``AMPBENCH_PRELOAD_MODULES`` (comma-separated) replaces the list of modules the server imports: add your task's
heavy imports (``transformers``…), or name none.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

# What a stage imports that costs time; each is imported by the pipeline's stages anyway (ImportError: skipped).
# The second line is what the first `mlflow.pytorch.log_model` of a process imports (torch.export's serializer, the
# compiler modules it reaches, MLflow's pyfunc flavour, GitPython for the run's git tags): 0.3 s of a train stage.
# Not mlflow.pytorch itself: the train stage imports it without its Lightning part (tracking/logs.py), which is all
# it costs (2 s where Lightning is installed), and a served stage must have the modules a plain one has.
PRELOAD = ("numpy", "torch", "torch._dynamo", "torch.export", "torchvision", "mlflow",
           "mlflow.store.tracking.sqlalchemy_store", "mlflow.tracking.fluent", "click", "yaml", "pydantic",
           "scipy.stats",
           "torch._export.serde.serialize", "torch._functorch.aot_autograd", "torch._inductor.ir", "networkx",
           "mlflow.pyfunc", "mlflow.tracing.processor.otel", "git")
# Environment variables read when a module is imported (or by the interpreter at start): part of the server's key.
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "GOTO", "TORCH", "PYTORCH_", "CUDA_",
                   "NVIDIA_", "ROCM", "HIP_", "LD_", "LC_", "LANG", "TZ", "AMPBENCH_PRELOAD_MODULES")
# ...except these, read when used (the child has the command's environment): Ray sets PYTHONBREAKPOINT differently
# for its workers and its driver, which would start a second server for the same interpreter.
RUNTIME_ENV = ("PYTHONBREAKPOINT",)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
START_TIMEOUT = 120.0  # the server's imports on a loaded machine; past it the client runs the stage itself
LAUNCHER_ENV = "AMPBENCH_LAUNCHER_PID"
HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER = struct.Struct("!I")


# --- what both sides agree on ------------------------------------------------------------------------------------

def enabled(env: dict[str, str]) -> bool:
    """Preloading is on unless ``AMPBENCH_PRELOAD=0``; Linux only (fork after import, /proc, SO_PEERCRED)."""
    return sys.platform == "linux" and env.get("AMPBENCH_PRELOAD", "1").strip() not in ("0", "false", "no", "off")


def modules(env: dict[str, str]) -> tuple[str, ...]:
    """What the server imports: ``AMPBENCH_PRELOAD_MODULES`` (comma-separated) or PRELOAD."""
    named = env.get("AMPBENCH_PRELOAD_MODULES")
    return PRELOAD if named is None else tuple(m.strip() for m in named.split(",") if m.strip())


def key(env: dict[str, str], path: list[str]) -> str:
    """The server a command may use: same interpreter, same installed packages, same import-time environment,
    same server code."""
    blob = json.dumps(key_material(env, path), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def key_material(env: dict[str, str], path: list[str]) -> dict:
    # A package directory's mtime changes when a package is installed or removed in it; other folders on the path
    # (PYTHONPATH's: a project, a test's temporary folder) count by name, as nothing in them is preloaded.
    stamp = []
    for entry in path:
        try:
            installs = os.path.basename(entry) in ("site-packages", "dist-packages")
            stamp.append((entry, os.stat(entry).st_mtime_ns if installs else None))
        except OSError:
            stamp.append((entry, None))
    own = hashlib.sha256()
    for name in ("preload.py", "preload_server.py", "preload_child.py"):
        with open(os.path.join(HERE, name), "rb") as f:
            own.update(f.read())
    return {"python": os.path.realpath(sys.executable), "version": sys.version, "prefix": sys.prefix, "path": stamp,
            "env": sorted((k, v) for k, v in env.items()
                          if k.startswith(IMPORT_TIME_ENV) and k not in RUNTIME_ENV),
            "server": own.hexdigest(), "preload": modules(env)}


def runtime_dir(env: dict[str, str]) -> str | None:
    """A folder only this user can enter (the socket's permission check), or None if there is none."""
    base = env.get("XDG_RUNTIME_DIR")
    folder = os.path.join(base, "ampbench") if base and os.path.isdir(base) else ""
    if not folder or len(folder) > 80:  # a socket's path has room for 107 bytes: the folder, a key, ".sock"
        folder = f"/tmp/ampbench-{os.getuid()}"
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(folder) or os.path.islink(folder):
        return None  # someone else's, or open to others: a socket there could be anyone's
    return folder


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, first: bytes = b"") -> bytes:
    data = first
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return data


def recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    if with_fds:
        first, fds, _, _ = socket.recv_fds(sock, 65536, with_fds)
        if not first:
            raise EOFError("connection closed")
    else:
        first = b""
    head = _recv_exact(sock, _HEADER.size, first[:_HEADER.size])
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exact(sock, size, first[_HEADER.size:])), fds


# --- the client: pipeline/python runs it in place of the stage -------------------------------------------------

def placement() -> dict:
    """What the kernel ties to a process and a fork would take from the server instead of the command: the CPUs it
    may run on (``taskset``), its resource limits (``ulimit``) and its scheduling priority (``nice``)."""
    import resource

    limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
    return {"affinity": sorted(os.sched_getaffinity(0)), "limits": limits, "nice": os.getpriority(os.PRIO_PROCESS, 0)}


def _run_plainly(argv: list[str], caught: list[int] | None = None) -> None:
    """The stage as a process of its own (no server): ``python preload_child.py SCRIPT ARGS``, the same script and
    the same ending as a served stage, in a fresh interpreter (interpreter options such as ``-m``: python itself).
    A signal the client caught before this point stops here, with its line: nothing of the stage has run."""
    if caught:
        _stopped_before_start(caught[0])
    sys.stdout.flush()
    runner = [] if not argv or argv[0].startswith("-") else [os.path.join(HERE, "preload_child.py")]
    os.execv(sys.executable, [sys.executable, *runner, *argv])


def _stopped_before_start(signum: int) -> None:
    print(f"ampbench: {signal.Signals(signum).name} before the stage started; nothing of it ran", file=sys.stderr)
    sys.exit(130)


def connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return sock
    except OSError:
        sock.close()
        return None


def _start_server(path: str) -> subprocess.Popen:
    """The server, detached from our session (a Ctrl-C at the terminal reaches the stages, not it)."""
    log = open(path[:-len(".sock")] + ".log", "ab")  # noqa: SIM115  (the server's stdout/stderr from here on)
    with log:
        return subprocess.Popen([sys.executable, os.path.join(HERE, "preload_server.py"), path],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True)


def _server(path: str, caught: list[int]) -> socket.socket | None:
    """A connection to the server for this key, starting one if none answers; None if none could be had (or a
    signal came while the server started: the stage is not to run)."""
    sock = connect(path)
    if sock is not None:
        return sock
    proc = _start_server(path)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and not caught:
        sock = connect(path)
        if sock is not None:
            return sock
        if proc.poll() not in (None, 0) or os.path.exists(path + ".refused"):
            return None  # it will not serve (its log says why); exit 0: another one is starting for this key
        time.sleep(0.05)
    return None


def client(argv: list[str]) -> None:
    """Run ``python ARGV`` through the server for this interpreter, or plainly where there is none."""
    env = dict(os.environ)
    if not argv or argv[0].startswith("-") or not enabled(env):
        _run_plainly(argv)
    script = argv[0]
    # sys.path as `python SCRIPT` would have it: the script's folder first, then what the interpreter adds.
    path = [os.path.dirname(os.path.realpath(script)), *sys.path[1:]]
    folder = runtime_dir(env)
    if folder is None:
        _run_plainly(argv)
    # From here on every signal we get is the stage's: kept until it exists, then passed on (Ctrl-C, DVC or a
    # scheduler stopping it), so that none is lost or kills this process while the server starts or forks.
    ignored = [int(sig) for sig in SIGNALS if signal.getsignal(sig) is signal.SIG_IGN]  # nohup, `cmd &`
    caught: list[int] = []
    stage: list[int] = []
    for sig in set(SIGNALS) - set(ignored):
        signal.signal(sig, lambda signum, frame: forward(stage[0], signum) if stage else caught.append(signum))
    where = os.path.join(folder, key(env, sys.path[1:]) + ".sock")
    sock = None if os.path.exists(where + ".refused") else _server(where, caught)
    if sock is None:
        _run_plainly(argv, caught)
    umask = os.umask(0)
    os.umask(umask)
    try:
        send(sock, {"argv": argv, "cwd": os.getcwd(), "env": env, "path": path, "umask": umask,
                    "ignored": ignored, **placement()}, [0, 1, 2])
        started, _ = recv(sock)
    except (OSError, EOFError, ValueError):
        _run_plainly(argv, caught)  # the server went away before it forked: nothing of the stage has run
    stage.append(started["pid"])
    for signum in caught:  # what came before the fork: the stage is stopped as early as it can be
        forward(stage[0], signum)
    try:
        status, _ = recv(sock)
    except (OSError, EOFError, ValueError):
        status = {"lost": True}
    _exit_as(status, stage[0])


def forward(pid: int, signum: int) -> None:
    """Send ``signum`` to the stage, if it still runs."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _exit_as(status: dict, pid: int) -> None:
    """Exit the way the stage did: its exit code, or killed by the same signal."""
    if status.get("lost"):  # the server died; its parent-death signal stopped the stage
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.1)
        print("ampbench: the preload server exited while the stage ran (its log is in "
              f"{runtime_dir(dict(os.environ))}); run the stage again", file=sys.stderr)
        sys.exit(1)
    if "signal" in status:
        sys.stdout.flush()
        if status["signal"] not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
        time.sleep(1)  # a signal that does not terminate (SIGCHLD…) falls through to the code below
        sys.exit(128 + status["signal"])
    sys.exit(status["exit"])


if __name__ == "__main__":
    client(sys.argv[1:])
