"""MLflow's own log records (and those of SQLAlchemy and alembic beneath its SQL store) go to a file, not to the
terminal: ``logs/mlflow.log`` under the project root (git-ignored), where a stage's error stays its one line.

MLflow gives its loggers a handler that writes to stderr; a store that fails (a full disk) logs a SQLAlchemy
traceback of ~45 lines there before the exception reaches us and becomes our one ``error:`` line. ``route``
replaces those handlers with one that appends WARNING and above to the file, and decides what the terminal sees:

- records of the store layer (``mlflow.store.*``, SQLAlchemy, alembic): nothing. Their failures reach the stage as
  exceptions, and its one line says the store, the cause and where this file is (``said``).
- any other MLflow warning or error (MLflow carries on after it, e.g. system metrics that cannot be sampled, a
  deprecated store): one short line, the first of a process only — nothing else would tell the user.

A file that cannot be written (the project's disk is full too) drops the records and says so in the error line.
Python ``warnings`` MLflow raises (deprecations: ours to fix, and the tests turn them into errors) are unchanged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ampbench.runtime.console import log
from ampbench.tracking.uris import mask

LOG = Path("logs") / "mlflow.log"  # under the project root
# MLflow puts a stderr handler on "mlflow", "sqlalchemy.engine", "alembic" and "huey" (propagate off); the rest of
# SQLAlchemy propagates to the root logger, whose last-resort handler prints warnings to stderr.
_LOGGERS = ("mlflow", "sqlalchemy", "sqlalchemy.engine", "alembic", "huey")
_STORE_LAYER = ("mlflow.store.", "sqlalchemy", "alembic", "huey")
_ROTATE_BYTES = 2 * 2**20  # then the file moves to mlflow.log.1: only problems are logged, so this is rare


class _ToFile(logging.Handler):
    """Appends each record to ``path`` (opened per record: no descriptor left open across a fork or at exit)."""

    def __init__(self, path: Path, uri: str):
        super().__init__(logging.WARNING)
        self.path, self.uri = path, uri
        self.written = False  # a record reached the file since ``route``
        self.lost: str | None = None  # why a record could not be written
        self.noted = False  # the terminal's one line about a record outside the store layer was printed
        self.setFormatter(logging.Formatter("%(asctime)s pid %(process)d %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        text = mask(self.format(record), self.uri)  # MLflow's messages may hold the URI with its password
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size > _ROTATE_BYTES:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(text + "\n")
            self.written = True
        except OSError as exc:  # never logging's "--- Logging error ---" page on stderr
            self.lost = f"{exc.filename or self.path}: {exc.strerror or exc}"
        if not self.noted and not record.name.startswith(_STORE_LAYER):
            self.noted = True
            message = (record.getMessage().strip().splitlines() or [""])[0][:200]
            where = f"its log: {self.path}" if self.written else f"its log could not be written: {self.lost}"
            log(mask(f"MLflow {record.levelname.lower()}: {message} ({where})", self.uri))


_handler: _ToFile | None = None


def route(project_root: Path, uri: str) -> Path:
    """Send MLflow's, SQLAlchemy's and alembic's log records to ``project_root``/logs/mlflow.log instead of stderr
    (this process, from now on; again on every call, which resets ``said``). Returns the file's path."""
    global _handler
    _handler = _ToFile(Path(project_root).resolve() / LOG, uri)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = [_handler]  # replaces MLflow's stderr handler (or ours from an earlier call)
        logger.propagate = False
    # A new store's "Creating initial tables…" and each migration: not even for the file.
    for noisy in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return _handler.path


def said() -> str:
    """Where MLflow's own records went since ``route`` (for an error line): "", or "; MLflow's log of it: …"."""
    if _handler is None or not (_handler.written or _handler.lost):
        return ""
    if _handler.written:
        return f"; MLflow's own log of it: {_handler.path}"
    return f"; MLflow's own log of it was dropped ({_handler.lost})"
