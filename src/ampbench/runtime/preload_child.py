"""What a child forked by the preload server does to become the stage (``preload.py`` says what carries over).

It takes the client's stdin/stdout/stderr, directory, umask, environment, signal dispositions and ``sys.path``,
runs the script in a new ``__main__`` module and returns to the top of the server's stack, so that the interpreter
ends the stage as it ends any script: non-daemon threads joined, every exit function run. Only the last step of
that ending, the teardown of the thousands of modules the server imported (1.3 s with torch and MLflow, for a
process that is going away), is cut: ``finish``, registered before the server imports anything and so run after
every other exit function, collects the stage's garbage, flushes what is buffered and calls ``os._exit`` with the
status the script would have had under ``python SCRIPT``. A stage without the server runs through the same code in
a fresh interpreter (``python preload_child.py SCRIPT ARGS``), so both end alike. Standard library only.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

from preload import LAUNCHER_ENV  # (the dvc watch in processes.py reads it)

# How the stage ends (set in the child only; the server ends as a normal interpreter). "status": the exit status;
# "sigint": the script died of an uncaught KeyboardInterrupt, and python then kills itself with SIGINT.
_ENDING: dict[str, object] = {"armed": False, "status": 0, "sigint": False}


def become(job: dict) -> None:
    """In the forked child: take the client's stdio, directory, environment and path, then run the script. Returns
    (to the server's ``main``) when the script has ended; the interpreter's own ending follows, and ``finish``."""
    try:
        _take_over(job)
        _ENDING["armed"] = True
    except BaseException:  # noqa: BLE001  (nothing of the stage ran: say why on its stderr, never serve on)
        import traceback

        traceback.print_exc()
        os._exit(1)
    _run(job["argv"][0])


def _take_over(job: dict) -> None:
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
    _place(job)
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


def _place(job: dict) -> None:
    """The command's CPUs, resource limits and priority, not the server's (``preload.placement``): ``taskset -c 0
    dvc repro`` pins its stages, ``ulimit -v`` bounds them. A limit above what the server may raise to stays at the
    server's, said on the stage's stderr (its control group, too, is the server's: docs/operations.md)."""
    import resource

    os.sched_setaffinity(0, job["affinity"])
    for name, (soft, hard) in job["limits"].items():
        which = getattr(resource, name, None)
        if which is None or resource.getrlimit(which) == (soft, hard):
            continue
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            print(f"ampbench: {name} stays at the preload server's {resource.getrlimit(which)}, not the command's "
                  f"{(soft, hard)} ({exc}); AMPBENCH_PRELOAD=0 runs the stage with the command's", file=sys.stderr)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, job["nice"])
    except PermissionError:  # a priority above the server's needs privileges the command may have had
        print(f"ampbench: the stage runs at the preload server's priority (nice {os.getpriority(os.PRIO_PROCESS, 0)}"
              f"), not the command's ({job['nice']}); AMPBENCH_PRELOAD=0 runs it at the command's", file=sys.stderr)


def _run(script: str) -> None:
    """Run ``script`` as ``python SCRIPT`` would: in a fresh ``__main__`` module that stays in place until the
    process ends, the status recorded, an uncaught exception printed from the script's frame."""
    import builtins
    import types
    from importlib.machinery import SourceFileLoader

    script = os.path.abspath(script)  # `python SCRIPT` makes __main__.__file__ absolute too
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __cached__=None, __builtins__=builtins,
                         __loader__=SourceFileLoader("__main__", script))
    sys.modules["__main__"] = main
    try:
        with open(script, "rb") as f:
            code = compile(f.read(), script, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as exc:
        _ENDING["status"] = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001  (printed as the interpreter prints it; KeyboardInterrupt too)
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:  # from the script's frame, as python
            tb = tb.tb_next
        exc.__traceback__ = tb or exc.__traceback__
        sys.excepthook(type(exc), exc, exc.__traceback__)
        _ENDING["status"] = 1
        _ENDING["sigint"] = isinstance(exc, KeyboardInterrupt)


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s status: None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish() -> None:
    """The stage's last exit function (the server registers it before anything else): what the skipped module
    teardown would still have done that anyone outside the process can see, then ``os._exit``.

    - The script's ``__main__`` module is dropped and the garbage collected, so the objects the script left in its
      globals or in reference cycles are finalized, as at teardown (a ``GzipFile`` writes its trailer). Objects
      that other modules' globals hold are not: python's teardown would, which is the part skipped.
    - Every open file is flushed (python closes them at teardown); a failing flush is printed as python prints it
      ("Exception ignored …"), and a failing stdout makes the status 120, as python does.
    - libc's buffers are flushed (``os._exit`` skips C's exit): output of C extensions is not lost.
    Whatever happens here, the status is the script's: ``os._exit`` runs in a ``finally``."""
    if not _ENDING["armed"]:  # the server's own end: a normal interpreter's
        return
    status = int(_ENDING["status"])  # type: ignore[arg-type]
    try:
        _collect_main()
        status = _flush_files(status)
        import ctypes

        ctypes.CDLL(None).fflush(None)
        if _ENDING["sigint"]:  # an uncaught Ctrl-C: die of SIGINT, as python does, so the shell sees it
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            status = 130
    finally:
        os._exit(status)


def _collect_main() -> None:
    """Python's teardown order for the script's module: unreferenced, collected; if something still holds it, its
    globals cleared and collected again."""
    import gc
    import weakref

    main = sys.modules.pop("__main__", None)
    alive = weakref.ref(main) if main is not None else lambda: None
    del main
    gc.collect()
    module = alive()
    if module is not None:
        module.__dict__.clear()
        del module
        gc.collect()


def _flush_files(status: int) -> int:
    """Flush every open file object of the stage (text layers before their buffers) and then stdout and stderr;
    returns the status (120 if stdout cannot be flushed, as python's ``Py_FinalizeEx``). Looked up by exact
    type, which reads no attribute of any object: inspecting objects can run their code (proxies, deprecation
    hooks)."""
    import gc
    import io

    files = [o for o in gc.get_objects() if type(o) is io.TextIOWrapper]
    files += [o for o in gc.get_objects() if type(o) in (io.BufferedWriter, io.BufferedRandom)]
    for stream in files:
        if stream is sys.stdout or stream is sys.stderr or stream.closed:
            continue
        try:
            stream.flush()
        except Exception as exc:  # noqa: BLE001  (python prints these and exits as it would have)
            _unraisable(f"flushing {stream!r}", exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception as exc:  # noqa: BLE001
            _unraisable(f"flushing sys.{'stdout' if stream is sys.stdout else 'stderr'}", exc)
            if stream is sys.stdout and status == 0:
                status = 120
    return status


def _unraisable(what: str, exc: BaseException) -> None:
    try:
        os.write(2, f"Exception ignored while {what}: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
    except OSError:
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


def main(argv: list[str]) -> None:
    """A stage without the server (``AMPBENCH_PRELOAD=0``, or no server to be had): the same script, the same
    ending, in a fresh interpreter: ``python preload_child.py SCRIPT ARGS…``."""
    atexit.register(finish)  # before the script imports anything: the last exit function, as in a child
    del sys.modules["preload"]  # the stage's own `import preload` must not find ours
    sys.argv[:] = argv
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))  # the script's folder, as `python SCRIPT` puts it
    _ENDING["armed"] = True
    _run(argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
