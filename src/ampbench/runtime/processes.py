"""Processes: who we are (so a later run can tell that a run's process died), a watch on the ``dvc`` that
launched us (so a stage never outlives it), and process groups stopped as a whole (``signals.py``: how a process
of ours ends when it is told to).

Linux ``/proc`` is read where it exists; elsewhere identity falls back to the pid alone and the watch is off.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ampbench.runtime import signals
from ampbench.runtime.preload import LAUNCHER_ENV


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # after "pid (comm)": the command name may hold spaces


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22), or None if there is no such process. With
    the pid it identifies a process even after the pid is reused."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@dataclass(frozen=True)
class Identity:
    """A process, told apart from a later one with the same pid by its start time."""

    host: str
    pid: int
    started: str  # "" where /proc is missing

    @classmethod
    def current(cls) -> Identity:
        return cls(socket.gethostname(), os.getpid(), start_time(os.getpid()) or "")

    def tags(self) -> dict[str, str]:
        return {"ampbench.host": self.host, "ampbench.pid": str(self.pid), "ampbench.pid_started": self.started}

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Identity | None:
        try:
            return cls(tags["ampbench.host"], int(tags["ampbench.pid"]), tags.get("ampbench.pid_started", ""))
        except (KeyError, ValueError):
            return None

    def dead(self) -> bool:
        """True only when it is certain: the process ran on this host and is gone (or its pid was reused, or it is a
        zombie: it has exited and only waits for its parent to read its status)."""
        if self.host != socket.gethostname():
            return False  # another machine's process: cannot tell
        if self.pid <= 0:  # dvc_ancestor(): gone before it was looked for
            return True
        fields = _stat(self.pid)
        if fields is not None:
            if fields[0] == "Z":
                return True
            return bool(self.started) and fields[19] != self.started  # same pid, another process: ours is gone
        if Path("/proc").is_dir():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


def _is_dvc(argv: list[str]) -> bool:
    """``dvc …``, ``/path/to/dvc …`` or ``python -m dvc …``."""
    names = [os.path.basename(a) for a in argv if a]
    if not names:
        return False
    return names[0] == "dvc" or (len(names) > 1 and (names[1] == "dvc" or names[1:3] == ["-m", "dvc"]))


def dvc_ancestor() -> Identity | None:
    """The ``dvc`` process that runs this stage (an ancestor: dvc → shell → python), or None outside DVC. If dvc has
    already exited (killed just as it started the stage), an Identity with pid 0, which is ``dead()``: the stage,
    or the shell DVC started it with, was adopted by init, with nothing but shells between it and init."""
    if not os.environ.get("DVC_STAGE"):
        return None
    pid = _parent(os.getpid())
    adopted = True  # every process passed so far stood where DVC's chain would (a shell, the preload client)
    for _ in range(8):  # dvc, its shell, torchrun…: a short chain
        if pid is None:
            return None
        if pid <= 1:
            return Identity(socket.gethostname(), 0, "") if adopted else None
        argv = _cmdline(pid)
        if _is_dvc(argv):
            return Identity(socket.gethostname(), pid, start_time(pid) or "")
        if _is_preload_server(argv):  # forked by it (runtime/preload.py): the client stands where our parent would
            pid = int(os.environ.get(LAUNCHER_ENV) or 0)
            continue
        adopted = adopted and (_is_shell(argv) or _is_preload_client(argv))
        pid = _parent(pid)
    return None


def _is_shell(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) in ("sh", "dash", "bash", "zsh", "ash", "busybox")


def _is_preload_client(argv: list[str]) -> bool:
    return len(argv) > 1 and os.path.basename(argv[1]) == "preload.py"


def _is_preload_server(argv: list[str]) -> bool:
    return len(argv) > 1 and os.path.basename(argv[1]) == "preload_server.py"


def stop_when_gone(owner: Identity, interval: float = 0.5) -> threading.Thread:
    """Send ourselves SIGTERM once ``owner`` has exited: killed ``dvc repro`` must not leave a stage running that
    would later overwrite the outputs DVC has already restored. The interruption's one line says why. Returns the
    (daemon) watching thread. The one place a stage learns that its pipeline is gone, served or not: a preloaded
    stage's launcher is its client, which waits for it."""

    def watch() -> None:
        while not owner.dead():
            threading.Event().wait(interval)
        signals.stopping_because(f"dvc (pid {owner.pid}) has exited" if owner.pid else
                                 "the dvc that started this stage had exited")
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="ampbench-dvc-watch", daemon=True)
    thread.start()
    return thread


def group_alive(pgid: int) -> bool:
    """Is any process of the process group ``pgid`` left (zombies too, until reaped)?"""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def end_group(proc, steps=(signal.SIGTERM, signal.SIGKILL), grace: float = 20.0) -> None:
    """Wait for the process group led by ``proc`` (a ``subprocess.Popen`` started in a session or group of its
    own) to empty, sending it each of ``steps`` in turn (None: only wait) and waiting up to ``grace`` seconds after
    each; the leader is reaped on the way. A group, not a process: children outlive a parent signalled alone."""
    for sig in steps:
        if sig is not None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # the whole group is gone
                return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, so that the group empties
            if not group_alive(proc.pid):
                return
            time.sleep(0.1)
