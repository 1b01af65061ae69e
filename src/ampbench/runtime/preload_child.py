"""What a child forked by the preload server does to become the stage (``preload.py`` says what carries over).

It takes the client's stdin/stdout/stderr, directory, umask, environment, signal dispositions and ``sys.path``,
runs the script as ``__main__`` and ends the way the interpreter would, minus the teardown of the modules the
server imported. Standard library only, imported by ``preload_server.py`` before it forks.
"""

from __future__ import annotations

import os
import signal
import sys

from preload import LAUNCHER_ENV  # (the dvc watch in processes.py reads it)


def become(job: dict) -> None:
    """In the forked child: take the client's stdio, directory, environment and path, then run the script."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in job["ignored"]:
        signal.signal(sig, signal.SIG_IGN)
    for thing in job["close"]:
        thing.close()
    _die_with_parent()
    for target, fd in enumerate(job["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.umask(job["umask"])
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update({**job["imported_env"], **job["env"]})
    os.environ[LAUNCHER_ENV] = str(job["client"])
    sys.path[:] = job["path"]
    sys.argv[:] = job["argv"]
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr, write_through=unbuffered)
    import tempfile

    tempfile.tempdir = None  # TMPDIR is the client's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    os._exit(_run(job["argv"][0]))


def _run(script: str) -> int:
    """Run the script as ``__main__`` and end the way the interpreter would, but for tearing down the thousands of
    modules the server imported (about 2 s, for nothing: the process is going away). What the teardown would still
    have done is done here: non-daemon threads joined, atexit functions run (MLflow's, tempfile's finalizers…),
    every open file's buffer flushed (io objects of the standard types; a user's own subclass is not looked for)."""
    import atexit
    import gc
    import runpy
    import threading

    code, script = 0, os.path.abspath(script)  # `python SCRIPT` makes __main__.__file__ absolute too
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001  (printed as the interpreter prints it; KeyboardInterrupt too)
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:  # from the script's frame, as python
            tb = tb.tb_next
        exc.__traceback__ = tb or exc.__traceback__
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    getattr(threading, "_shutdown", lambda: None)()
    # No collection from here on: a file in a reference cycle can lose its text when the collector finalizes its
    # buffer before its text layer (CPython's bpo-17852); the teardown skipped below is where it would be flushed.
    gc.disable()
    _flush_files()
    atexit._run_exitfuncs()
    _flush_files()  # what the exit functions wrote
    _close_databases()
    if code == -signal.SIGINT:  # an uncaught Ctrl-C: die of SIGINT, as Python does, so the shell sees it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    return code


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s status: None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush_files() -> None:
    import gc
    import io

    writers = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    for stream in [o for o in gc.get_objects() if type(o) in writers]:  # text wrappers before their buffers
        try:
            if not stream.closed:
                stream.flush()
        except (OSError, ValueError):
            pass


def _close_databases() -> None:
    """Close SQLite connections as their collection would: the last one to close folds the write-ahead log into
    the database file (MLflow's store is WAL; a copied ``mlflow.db`` without its ``-wal`` would miss the runs)."""
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is None:
        return
    import gc

    for conn in [o for o in gc.get_objects() if isinstance(o, sqlite3.Connection)]:
        try:
            conn.close()  # an open transaction is rolled back, as at collection
        except Exception:  # noqa: BLE001, S110  (used by another thread, already broken: as the teardown would)
            pass


def _die_with_parent() -> None:
    """SIGTERM when the server exits (prctl PR_SET_PDEATHSIG), so a killed server cannot orphan a stage."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the server died before the line above
        os._exit(1)
