"""Store writes that survive concurrent writers and signals: the first-use lock of a SQLite store, retries of
transient conflicts, whole transactions before a signal is handled, and store errors as one line.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from ampbench.errors import StoreError
from ampbench.runtime import signals
from ampbench.tracking import own_log
from ampbench.tracking.uris import mask, redact, sqlite_path


@contextmanager
def init_lock(uri: str) -> Iterator[None]:
    """Serialise first use of a SQLite store across processes: schema creation and experiment creation race
    otherwise ("table already exists", "database is locked"). Other stores handle this themselves."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl
    import sqlite3

    db = Path(sqlite_path(uri))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        new = not db.exists() or db.stat().st_size == 0
        try:
            # WAL lets readers and one writer work at once and is stored in the file: set once, kept.
            with sqlite3.connect(db, timeout=60) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
            yield
        except BaseException:
            if new:  # half-created (disk full, signal): MLflow would fail on it forever ("table … already exists")
                for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                    path.unlink(missing_ok=True)
            raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# Transient conflicts of several experiments writing at once: SQLite's lock, and a row (e.g. a data set) that
# another writer inserted between MLflow's "does it exist?" and its insert — on retry MLflow finds it.
_TRANSIENT = ("locked", "duplicate key value", "UNIQUE constraint failed")


def retry(fn):
    """Retry a store write that hit a transient conflict with a concurrent writer (``_TRANSIENT``); a store that
    fails for good raises StoreError (one line, password masked) instead of pages of driver traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in range(10):
            try:
                with _whole_transactions():
                    return fn(*args, **kwargs)
            except Exception as exc:
                if any(t in str(exc) for t in _TRANSIENT) and attempt < 9:
                    time.sleep(0.05 * 2**attempt)  # 0.05 s … 25 s in total
                    continue
                if _from_store(exc) or _out_of_space(exc):
                    raise StoreError(store_message(exc)) from None
                raise

    return wrapper


def _whole_transactions():
    """Signals wait until a write to a database store (SQLite, PostgreSQL…) is done: interrupted mid-transaction,
    its connection keeps the lock and the KILLED bookkeeping that follows waits on it. A server's HTTP calls stay
    interruptible (its transactions are the server's)."""
    import mlflow

    scheme = urlsplit(mlflow.get_tracking_uri()).scheme.split("+")[0]
    databases = ("sqlite", "postgresql", "mysql", "mssql")
    return signals.signals_deferred() if scheme in databases else contextlib.nullcontext()


_STORE_MODULES = ("mlflow", "sqlalchemy", "sqlite3", "requests", "urllib3", "psycopg2", "pymysql")


def _from_store(exc: BaseException) -> bool:
    """An error of the tracking store or the way to it (not of our code, not a disk error we report as such)."""
    return type(exc).__module__.split(".")[0] in _STORE_MODULES


def _out_of_space(exc: BaseException) -> bool:
    """An OSError of a full disk or quota inside an MLflow call: its artifacts (``mlartifacts/``) could not be
    copied. Its file name is the source's, which looks like the culprit; the store's message says what it is."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def store_message(exc: BaseException) -> str:
    """One line: the store (password masked), the error's first line, a full disk where that is the cause, and
    where MLflow's own log of it went (``own_log``)."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    if isinstance(exc, OSError):  # shutil's copy names the destination second
        first = f"{exc.strerror or exc}" + (f" (writing {exc.filename2 or exc.filename})" if exc.filename else "")
    else:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
    return mask(f"MLflow store {redact(uri)}: {first[:300]}{_full_disk(exc, uri)}{own_log.said()}", uri)


FULL_BELOW = 2**20  # bytes free under which a "disk is full" or "disk I/O" error of the store is the disk's


def _full_disk(exc: BaseException, uri: str) -> str:
    """"; its disk is full (N KiB free in FOLDER)" when the error says so (SQLite: "database or disk is full", or a
    "disk I/O error" for its shared-memory file; an OSError ENOSPC) and the folder the store writes to has less than
    ``FULL_BELOW`` free; else "". Only the folder named by the error or a SQLite store's own folder is looked at."""
    text = str(exc).lower()
    if not (_out_of_space(exc) or "full" in text or "disk i/o" in text):
        return ""
    written = getattr(exc, "filename2", None) or getattr(exc, "filename", None)
    target = Path(written) if written else Path(sqlite_path(uri)) if uri.startswith("sqlite:///") else None
    folder = next((p for p in (target, *target.parents) if p.is_dir()), None) if target else None
    if folder is None:
        return ""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f"; its disk is full ({free // 1024} KiB free in {folder})" if free < FULL_BELOW else ""


def current_uri() -> str:
    import mlflow

    return mlflow.get_tracking_uri()
