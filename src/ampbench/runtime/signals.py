"""Signals: how a process of ours ends when it is told to stop, from its first line to its exit.

- A stage's start (``stopped_while_starting``): one line, exit 130, nothing written yet.
- Its work (``handle_signals_once``/``interrupt_once``): the first SIGINT/SIGTERM unwinds as a KeyboardInterrupt
  (MLflow runs end KILLED, what is complete is kept), later ones cannot cut that short; ``checkpoint`` raises it
  again where a finalizer swallowed it; ``signals_deferred`` holds signals off a database transaction.
- Its end (``settle``): once the outputs are complete a signal is said and changes nothing.
- Its status (``keep_status_at_exit``): an interrupted command's 130 holds at exit.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

# Why this process sent itself SIGTERM (the dvc watch), for the interruption's line; empty: the signal came from
# outside (Ctrl-C, DVC, a scheduler).
_self_stopped: list[str] = []
# The first SIGINT/SIGTERM's KeyboardInterrupt argument, once one came (``interrupt_once``).
_interrupted: list[str] = []


def stopping_because(why: str) -> None:
    """The next SIGTERM is the process's own (the dvc watch), for ``why``: the interruption's line says it."""
    _self_stopped.append(why)


def interrupt_once(signum, frame):
    """Signal handler: the first SIGINT/SIGTERM raises KeyboardInterrupt(name, and why when we sent it ourselves);
    every later one does nothing, so that a second Ctrl-C or a scheduler's repeated SIGTERM cannot cut short the
    cleanup the first one started (closing MLflow runs as KILLED, removing temporary files).

    Python runs the handler wherever the main thread is, also inside a finalizer or a weakref callback (SQLAlchemy
    has one per event collection), where an exception is printed as "Exception ignored" and dropped: the work would
    then go on, deaf to every later signal. ``checkpoint``, called between steps of every long loop, raises the
    interruption again there."""
    if _interrupted:
        return
    name = signal.Signals(signum).name
    _interrupted.append(f"{name}: {_self_stopped[0]}" if _self_stopped and signum == signal.SIGTERM else name)
    raise KeyboardInterrupt(_interrupted[0])


def keep_status_at_exit(code: int) -> None:
    """Make ``code`` the process's exit status once its exit functions have run, whatever CPython decides after
    them: it kills itself with SIGINT at exit when a KeyboardInterrupt once passed through C code that runs Python
    source (``PyRun_*``: pybind11, which torch uses), even one caught and handled later, so an interrupted command
    that said its line and chose 130 would die of SIGINT instead. For a process's own entry point (a stage script,
    a command), never a library call: it decides how the whole process ends."""
    _status_at_exit[:] = [code]


def entry_point(command) -> None:
    """Run a process's main ``command`` (a click command in standalone mode, or any callable ending in
    ``sys.exit``); if it exits 130 (interrupted), that status holds at exit (``keep_status_at_exit``)."""
    try:
        command()
    except SystemExit as exc:
        if exc.code == 130:
            keep_status_at_exit(130)
        raise


def _exit_with_the_kept_status() -> None:
    if _status_at_exit:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(_status_at_exit[0])


_status_at_exit: list[int] = []
# Registered when this module is first imported, before torch or MLflow register theirs: it runs after them.
atexit.register(_exit_with_the_kept_status)


def interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The interruption ``exc`` stands for, or None for an error: a KeyboardInterrupt is itself; once a signal has
    come (``interrupt_once``), any exception is the signal's, because C or Rust code that runs Python callbacks
    wraps the KeyboardInterrupt raised inside them in its own error (pydantic-core building a schema while MLflow
    is imported: a ``SchemaError`` ending "KeyboardInterrupt: SIGTERM" made an interrupted bench exit 1, not 130).
    Only while ``interrupt_once`` is in place: a library call that installed it for a while has undone it since."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    return KeyboardInterrupt(_interrupted[0]) if _interrupted and handling() else None


@contextmanager
def interruptions_unwrapped() -> Iterator[None]:
    """An error leaving the block that stands for a signal (``interruption``) leaves it as that KeyboardInterrupt
    (the error as its cause), so that what unwinds treats it as one: MLflow runs end KILLED, the command exits 130."""
    try:
        yield
    except Exception as exc:
        stopped = interruption(exc)
        if stopped is None:
            raise
        raise stopped from exc


def checkpoint() -> None:
    """Raise KeyboardInterrupt if a signal came and its exception never reached this code (``interrupt_once``);
    nothing otherwise. Long loops call it between steps; cleanup code never does."""
    if _interrupted and threading.current_thread() is threading.main_thread() and handling():
        raise KeyboardInterrupt(_interrupted[0])


def handling() -> bool:
    """Whether ``interrupt_once`` is in place (``handle_signals_once``, not yet settled or undone)."""
    return interrupt_once in (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))


def handle_signals_once() -> dict[int, object]:
    """Install ``interrupt_once`` for SIGINT and SIGTERM (main thread only), no signal yet; returns the previous
    handlers of those it installed. A signal the process was started with ignored stays ignored, as python leaves
    it: a shell starts a background job (``cmd &`` in a script) with SIGINT ignored so that Ctrl-C meant for the
    foreground does not stop it, and a stage through the preload server keeps it ignored the same way."""
    _interrupted.clear()
    if sys.unraisablehook is not _quiet_once_interrupted:
        _quiet_once_interrupted.default = sys.unraisablehook  # type: ignore[attr-defined]
        sys.unraisablehook = _quiet_once_interrupted
    return {sig: signal.signal(sig, interrupt_once) for sig in (signal.SIGINT, signal.SIGTERM)
            if signal.getsignal(sig) is not signal.SIG_IGN}


def _quiet_once_interrupted(unraisable) -> None:
    """Once a signal has stopped the work, the errors Python would print as "Exception ignored in …" are its
    debris (the KeyboardInterrupt a finalizer swallowed, which ``checkpoint`` raises again; an object whose
    construction it cut short failing in its ``__del__``): the one line that says what happened stays the only one.
    Before that, Python's own hook prints them."""
    if not _interrupted:
        _quiet_once_interrupted.default(unraisable)  # type: ignore[attr-defined]


def stage_label() -> str:
    """How a stage's lines name it: DVC's stage name (``train@fp32``), else the script's (``train``)."""
    return os.environ.get("DVC_STAGE") or os.path.splitext(os.path.basename(sys.argv[0] or "ampbench"))[0]


def stopped_while_starting(signum, frame):
    """Signal handler for a stage's start (its imports, before its own handling is in place): one line, exit 130.
    Nothing of the stage has been written yet, so there is nothing to clean up."""
    _say(f"[{stage_label()}] interrupted ({signal.Signals(signum).name}) while starting; nothing was written")
    os._exit(130)


def settle() -> None:
    """The stage's work is complete and recorded: a SIGINT/SIGTERM from here to the exit can change nothing, so it
    is said in one line and otherwise ignored (the stage exits with the status it has). Without this, a signal in
    the last moments would fail a stage whose outputs are complete, and DVC would run it again. From the exit
    functions on the signals are ignored outright: the interpreter resets Python handlers to the default (die of
    the signal) for its teardown. Only in a stage process (one that installed ``interrupt_once``; after a first
    signal, which is being handled, nothing changes; one whose exception was lost is raised here)."""
    if not handling():
        return
    checkpoint()
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is interrupt_once:  # one ignored from the start stays so
            signal.signal(sig, _after_settled)
    atexit.register(lambda: [signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)])


def _after_settled(signum, frame) -> None:
    _say(f"[{stage_label()}] {signal.Signals(signum).name} after the stage completed: its outputs are complete "
         "and kept; it ends as it would have")


def _say(line: str) -> None:
    """A line on stderr from a signal handler: one write, no buffered stream that the interrupted code may hold."""
    try:
        os.write(2, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT/SIGTERM that arrive inside the block are delivered when it ends, to the handler in place then (on
    the main thread; elsewhere nothing changes). For work a KeyboardInterrupt must not cut in two: a database
    transaction left open holds the store's lock against this very process's KILLED bookkeeping."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
            for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])
