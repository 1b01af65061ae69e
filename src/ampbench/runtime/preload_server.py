"""The preload server (``preload.py`` says what and why): import once, then fork a child per stage command.

Run as ``python preload_server.py SOCKET`` by the first client of a key. It holds ``SOCKET.lock`` while it lives,
imports the modules, checks that forking from it is safe, then accepts connections: one fork per request, the
client told the child's pid, then its exit status. The child returns up the stack to this file's ``main`` and
becomes the stage there (``preload_child.become``). Its log is ``SOCKET`` with ``.log`` for ``.sock``.
"""

from __future__ import annotations

import atexit
import gc
import os
import select
import signal
import socket
import struct
import sys
import time

import preload as wire  # this folder is sys.path[0]
import preload_child

# First of all exit functions, so the last to run: in a child it ends the stage once every other one (the
# preloaded libraries' too, registered by the imports below) has run; in the server it does nothing.
atexit.register(preload_child.finish)
# The stage's own `import preload` (or a module of that name in a user's project) must not find ours.
del sys.modules["preload"], sys.modules["preload_child"]

IDLE_SECONDS = 300.0
# Packages whose import starts native threads that survive a fork (see _preload).
FORK_SAFE_POOLS = ("numpy", "scipy", "mlflow")


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {message}", flush=True)


def _threads() -> int:
    """Threads of this process, native ones included (OpenMP pools, ...), from /proc."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _preload() -> str | None:
    """Import the modules; the reason not to fork from this process, or None. A fork copies only the forking thread:
    a lock another thread holds stays held in the child. Python threads are refused; native ones only where the
    library that starts them at import makes itself fork-safe (pthread_atfork): OpenBLAS's pool (numpy, scipy)
    and jemalloc's background thread (loaded with MLflow's dependencies)."""
    import importlib
    import threading

    for name in wire.modules(dict(os.environ)):
        before, started = _threads(), time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  (a module that is not installed, or fails: the stage will see it)
            _log(f"not preloaded: {name} ({type(exc).__name__}: {exc})")
            continue
        after = _threads()
        _log(f"imported {name} in {time.perf_counter() - started:.2f} s ({after} threads)")
        if after > before and not name.startswith(FORK_SAFE_POOLS):
            return f"importing {name} started {after - before} thread(s)"
    if threading.active_count() != 1:
        return f"{threading.active_count() - 1} Python thread(s) started by the imports"
    return None


class _Serving:
    """The accept loop: one fork per request; the client is told the pid, then the exit status."""

    def __init__(self, path: str, listener: socket.socket, wake: socket.socket, idle: float):
        self.path, self.listener, self.wake, self.idle = path, listener, wake, idle
        self.inode = os.stat(path).st_ino
        self.children: dict[int, socket.socket] = {}
        self.doomed: dict[int, float] = {}  # pid → when SIGKILL follows the SIGTERM of a vanished client
        self.last = time.monotonic()

    def still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def loop(self) -> dict | None:
        """Serve until idle; returns a request only in a forked child (which then becomes the stage)."""
        while True:
            if not self.children and (time.monotonic() - self.last > self.idle or not self.still_ours()):
                _log("idle: exiting")
                return None
            readable, _, _ = select.select([self.listener, self.wake, *self.children.values()], [], [], 1.0)
            for sock in readable:
                if sock is self.wake:
                    self.wake.recv(4096)
                elif sock is self.listener:
                    job = self.accept()
                    if job is not None:
                        return job
                else:
                    self.client_gone(sock)
            self.reap()
            for pid, when in list(self.doomed.items()):
                if time.monotonic() > when:
                    wire.forward(pid, signal.SIGKILL)
                    del self.doomed[pid]

    def accept(self) -> dict | None:
        conn, _ = self.listener.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        client_pid, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            conn.close()
            return None
        try:
            request, fds = wire.recv(conn, with_fds=3)
        except (OSError, EOFError, ValueError) as exc:
            _log(f"bad request from pid {client_pid}: {exc}")
            conn.close()
            return None
        self.last = time.monotonic()
        # Everything the server holds moves to the collector's permanent generation: a child's collections (its
        # last one in preload_child.finish included) never walk the preloaded modules' objects, nor touch their
        # pages (copy-on-write stays shared). Python's gc docs give this pattern for forking servers.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            return {**request, "fds": fds, "client": client_pid, "close": [self.listener, self.wake, conn,
                                                                           *self.children.values()]}
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        _log(f"pid {pid} for client {client_pid}: {' '.join(request['argv'])}")
        try:
            wire.send(conn, {"pid": pid})
        except OSError:
            self.client_gone(conn)
        return None

    def client_gone(self, conn: socket.socket) -> None:
        """The client's end closed while its stage runs (it was killed): stop the stage as DVC would."""
        for pid, sock in self.children.items():
            if sock is conn and pid not in self.doomed:
                _log(f"client of pid {pid} is gone: SIGTERM")
                wire.forward(pid, signal.SIGTERM)
                self.doomed[pid] = time.monotonic() + 60.0

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.doomed.pop(pid, None)
            self.last = time.monotonic()
            if conn is None:
                continue
            result = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                      else {"exit": os.WEXITSTATUS(status)})
            _log(f"pid {pid}: {result}")
            try:
                wire.send(conn, result)
            except OSError:
                pass
            conn.close()


def serve(path: str) -> dict | None:
    """Become the server for ``path`` (unless another one is, or is starting); returns a request in a child."""
    import fcntl

    lock = open(path + ".lock", "w")  # noqa: SIM115  (held for the server's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None  # another server for this key
    if wire.connect(path) is not None:
        return None
    env_then, path_then = dict(os.environ), sys.path[1:]  # as the client saw them: imports may set variables
    material = wire.key_material(env_then, path_then)
    _log(f"starting: {material['python']}; import-time environment {dict(material['env'])}")
    started = time.perf_counter()
    refused = _preload()
    if refused:  # it would refuse again: remembered for this key, whose stages run as plain processes
        _log(f"refusing to serve: {refused}; stages run as plain processes")
        with open(path + ".refused", "w") as f:
            f.write(refused + "\n")
        sys.exit(3)
    if wire.key(env_then, path_then) != os.path.basename(path)[:-len(".sock")]:
        _log("not serving: the installed packages or this file changed while it started (the next stage starts "
             "another server)")
        sys.exit(3)
    _log(f"preloaded in {time.perf_counter() - started:.1f} s")
    _sweep(os.path.dirname(path))
    listener, wake, wake_in = _listen(path)
    idle = float(os.environ.get("AMPBENCH_PRELOAD_IDLE", IDLE_SECONDS))
    serving = _Serving(path, listener, wake, idle)
    job = serving.loop()
    if job is not None:
        job["close"] += [wake_in, lock]
        # What the imports set (TORCHINDUCTOR_CACHE_DIR…): a plain process would have it too, unless its caller did.
        job["imported_env"] = {k: v for k, v in os.environ.items() if k not in env_then}
        return job
    if serving.still_ours():  # a later server may have replaced a socket we lost: leave that one alone
        os.unlink(path)
    return None


def _listen(path: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    """The listening socket at ``path`` (in a folder only we can enter), and a socket pair SIGCHLD wakes."""
    try:
        os.unlink(path)  # a dead server's (we hold the lock)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    wake, wake_in = socket.socketpair()
    for end in (wake, wake_in):
        end.setblocking(False)
    signal.set_wakeup_fd(wake_in.fileno())
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select through the wakeup socket
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return listener, wake, wake_in


def _sweep(folder: str, days: float = 7.0) -> None:
    """Remove week-old logs and markers: a server exits after minutes without work, so they are no live one's."""
    cutoff = time.time() - days * 86400
    for name in os.listdir(folder):
        entry = os.path.join(folder, name)
        try:
            if name.endswith((".log", ".lock", ".refused")) and os.stat(entry).st_mtime < cutoff:
                os.unlink(entry)
        except OSError:
            pass


def main(argv: list[str]) -> None:
    job = serve(argv[0])
    if job is not None:
        preload_child.become(job)  # the stage runs at the top of this process's stack: exiting is as a script's


if __name__ == "__main__":
    main(sys.argv[1:])
