"""Signals that C code wraps: a KeyboardInterrupt raised by our handler inside a callback that C code runs comes
out as that code's own error (sqlite3 here: "user-defined function raised exception"; pydantic-core's SchemaError
while MLflow is imported, seen in CI); it must still end the work as an interruption."""

import signal
import sqlite3

import pytest

from ampbench import tracking
from ampbench.runtime import signals


def _stopped_in_c(sig=signal.SIGTERM):
    """A signal that arrives while C code (SQLite) runs a Python callback: the callback's KeyboardInterrupt
    leaves as an sqlite3.OperationalError."""
    db = sqlite3.connect(":memory:")
    db.create_function("stop", 0, lambda: signal.raise_signal(sig))
    db.execute("select stop()")


@pytest.fixture
def handling():
    """``interrupt_once`` in place for the test, as a stage has it; the handlers before it back afterwards, and the
    signal it heard forgotten (were those handlers ``interrupt_once`` too, every later error in this worker would
    read as that signal's)."""
    previous = signals.handle_signals_once()
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    signals._interrupted.clear()


def test_the_wrapped_error_is_what_a_signal_did_and_is_raised_as_one(handling):
    with pytest.raises(sqlite3.OperationalError):  # without the unwrapping: an error, as CI saw it
        _stopped_in_c()
    assert signals.interruption(ValueError("anything after the signal")).args == ("SIGTERM",)
    with pytest.raises(KeyboardInterrupt) as got:
        with signals.interruptions_unwrapped():
            raise sqlite3.OperationalError("user-defined function raised exception")
    assert got.value.args == ("SIGTERM",) and isinstance(got.value.__cause__, sqlite3.OperationalError)


def test_without_a_signal_an_error_stays_an_error(handling):
    assert signals.interruption(ValueError("boom")) is None
    with pytest.raises(ValueError, match="boom"):
        with signals.interruptions_unwrapped():
            raise ValueError("boom")


@pytest.fixture
def pythons_own_handlers():
    """Python's own SIGINT/SIGTERM handlers for the test, as a library's caller has them (a test before it in the
    same worker may have run a command in-process that left ``interrupt_once`` in place, as its process would)."""
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    signals._interrupted.clear()


def test_a_run_stopped_inside_c_code_ends_killed_and_later_errors_are_errors(tmp_path, monkeypatch,
                                                                              pythons_own_handlers):
    """Called as a library (its own handlers for the run's length): the run ends KILLED, not FAILED, and once the
    run has undone its handlers an error is an error again, though a signal once came."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    tracking.setup(tmp_path, "t")
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with tracking.open_run("stopped", {}, {}) as run_id:
            _stopped_in_c()
    run = mlflow.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["ampbench.ended_by"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is not signals.interrupt_once
    assert signals.interruption(ValueError("later")) is None
