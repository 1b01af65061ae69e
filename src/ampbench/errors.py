"""Exceptions for errors a user can cause; the CLI edge turns them into one clear line."""


class AmpbenchError(Exception):
    """Base class: the message is meant for the user as it is."""


class ParamsError(AmpbenchError):
    """params.yaml (or a ``-S`` override) holds a value we cannot use."""


class DataError(AmpbenchError):
    """Input data is missing, corrupt or inconsistent."""


class ArmUnavailable(AmpbenchError):
    """A precision arm this device cannot run honestly (it would silently run as something else)."""


class DeviceError(AmpbenchError):
    """The requested device does not exist here."""


class ResumeRefused(AmpbenchError):
    """A checkpoint cannot be resumed as asked (e.g. it belongs to another precision)."""


class StoreError(AmpbenchError):
    """The MLflow tracking store failed (unreachable, corrupt, full)."""


class ModelError(AmpbenchError):
    """train.model cannot be built, or what it builds does not fit the data."""


class Diverged(AmpbenchError):
    """Training of one arm went numerically wrong; the message says how. ``culprit``: the first module that went
    non-finite (``training.nonfinite.Culprit.to_dict``), ``activations``: the epoch's per-module table so far."""

    def __init__(self, message: str, culprit: dict | None = None, activations: list | None = None):
        super().__init__(message)
        self.culprit, self.activations = culprit, activations or []


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the work (``args[0]``: the signal's name); ``kept`` says, for the user's one
    line, what was kept and how to go on. A KeyboardInterrupt, so that everything on the way out treats it as one
    (MLflow runs end KILLED)."""

    def __init__(self, signal_name: str, kept: str):
        super().__init__(signal_name)
        self.kept = kept


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """``interrupted (SIGTERM): what is kept``: the one line a command ends with when a signal stopped it."""
    kept = getattr(exc, "kept", None)
    return f"interrupted ({exc.args[0] if exc.args else 'SIGINT'})" + (f": {kept}" if kept else "")
