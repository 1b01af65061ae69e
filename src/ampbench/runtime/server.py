"""A server process of ours (the MLflow UI): a port checked before it starts, its output in a log, the wait until
it answers, and its whole process group stopped on Ctrl-C or SIGTERM."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ampbench.errors import AmpbenchError
from ampbench.runtime import processes, signals


def free_port(host: str, port: int) -> int:
    """``port`` if it can be bound on ``host`` (one line otherwise, before any server starts); for 0, a port the
    system picks as free."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise AmpbenchError(f"cannot serve on {host}:{port} ({exc.strerror}); choose another --port") from None
        return probe.getsockname()[1]


def serve(cmd: list[str], env: dict[str, str], address: tuple[str, int], wait: float, log: Path,
          answered: Callable[[Path], None]) -> None:
    """Run the server with its output in ``log``; call ``answered(log)`` once /health answers; stop it on Ctrl-C or
    SIGTERM. One-line errors: the server exiting early (with the log's last line), no answer within ``wait`` s.

    The server runs in a process group of its own, and stopping it stops the whole group: `mlflow server` starts
    uvicorn workers and job consumers (≈ 200 MB each) that outlive their parent when only it is signalled.
    """
    host, port = address
    signals.handle_signals_once()  # SIGTERM (a supervisor, `kill`) unwinds like Ctrl-C: the server is stopped below
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        server = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + wait
        while True:
            if server.poll() is not None:
                lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
                last = f": {lines[-1].strip()[:300]}" if lines else ""
                raise AmpbenchError(f"the MLflow server exited with code {server.returncode} before answering "
                                    f"(its output is in {log}{last})")
            try:
                urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AmpbenchError(f"the MLflow server did not answer on {host}:{port} within {wait:g} s; "
                                        "stopped it") from None
                time.sleep(0.5)
        answered(log)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        processes.end_group(server)
