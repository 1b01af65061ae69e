"""Where the MLflow store is and whether it can be used: URIs, artifact locations, passwords kept out of logs.

Default store: SQLite ``mlflow.db`` plus an ``mlartifacts/`` folder at the project root (absolute paths, so runs
from ``dvc repro``, ``dvc exp run`` and queued experiments in temporary copies all land in one store);
``MLFLOW_TRACKING_URI`` overrides. Torch- and MLflow-free: nothing here imports MLflow.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ampbench.errors import AmpbenchError

DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"


def store_uris(project_root: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location for new experiments).

    Artifacts must outlive the folder a stage runs in (DVC's temporary copy of a queued experiment, a clone that
    is deleted later): ``AMPBENCH_ARTIFACT_LOCATION`` when set; else ``mlartifacts/`` beside a SQLite file (a
    relative ``sqlite:///name.db`` is taken relative to the project root, not to the temporary copy); None where
    the store decides itself (an MLflow server, a ``file:`` store). A database server URI without a server in
    front (``postgresql://…``) needs ``AMPBENCH_ARTIFACT_LOCATION``: ``setup`` says so.
    """
    root = Path(project_root).resolve()
    chosen = os.environ.get("AMPBENCH_ARTIFACT_LOCATION") or None
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not env_uri:
        return f"sqlite:///{root / DB_NAME}", chosen or (root / ARTIFACTS_DIR).as_uri()
    env_uri = parse(env_uri)  # one line for a URI no store can be opened at, before anything uses it
    if env_uri.startswith("sqlite:///"):
        db = Path(sqlite_path(env_uri))
        if not db.is_absolute():
            db = root / db
            env_uri = f"sqlite:///{db}" + (env_uri[env_uri.index("?"):] if "?" in env_uri else "")
        return env_uri, chosen or (db.parent / ARTIFACTS_DIR).as_uri()
    return env_uri, chosen


def redact(uri: str) -> str:
    """The URI without a password, safe to log as a tag."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def mask(text: str, uri: str | None = None) -> str:
    """``text`` (an error message, a log line) with the tracking URI's password replaced by ***."""
    uri = uri if uri is not None else os.environ.get("MLFLOW_TRACKING_URI", "")
    try:
        password = urlsplit(uri).password
    except ValueError:
        return text
    if not password:
        return text
    return text.replace(uri, redact(uri)).replace(password, "***")


_KNOWN_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")
_FIX = "fix or unset MLFLOW_TRACKING_URI"


def parse(uri: str) -> str:
    """Every tracking URI form, accepted with one meaning (returned normalised: the scheme in lower case, as
    SQLAlchemy needs it) or refused in one line: unknown or missing scheme, a SQLite URI that names no file
    (``sqlite://``, SQLAlchemy's in-memory database) or an in-memory one (``sqlite:///:memory:``: runs must
    outlive the process), a SQLite URI with a host, a server URI without a host, a malformed port."""
    if uri.strip() == "databricks":  # MLflow's name for the default Databricks workspace
        return "databricks"
    try:
        parts = urlsplit(uri.strip())
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise AmpbenchError(f"MLflow tracking URI {redact_safe(uri)!r} is malformed ({exc}); {_FIX}") from None
    scheme = parts.scheme.lower()
    if scheme.split("+")[0] not in _KNOWN_SCHEMES:
        raise AmpbenchError(f"MLflow tracking URI {redact_safe(uri)!r} is not one MLflow can use (expected "
                            f"sqlite:///path, http(s)://host:port, postgresql://…); {_FIX}")
    normalised = scheme + uri.strip()[len(parts.scheme):]
    if scheme == "sqlite":
        if parts.netloc:
            raise AmpbenchError(f"MLflow tracking URI {uri!r}: a SQLite URI has no host (sqlite:///relative.db or "
                                f"sqlite:////absolute/path.db); {_FIX}")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path or path == ":memory:" or "mode=memory" in parts.query:
            raise AmpbenchError(f"MLflow tracking URI {uri!r} names no database file (an in-memory store ends "
                                f"with the process, and every stage is a process of its own): use "
                                f"sqlite:///path/to/mlflow.db; {_FIX}")
    elif scheme.split("+")[0] in ("http", "https", "postgresql", "mysql", "mssql") and not parts.hostname:
        raise AmpbenchError(f"MLflow tracking URI {redact_safe(uri)!r} names no host; {_FIX}")
    return normalised


def redact_safe(uri: str) -> str:
    """``redact`` for a URI that may not even parse."""
    try:
        return redact(uri)
    except ValueError:
        return "<a URI that does not parse>"


def check_uri(uri: str) -> None:
    """Fail fast, before any training, on a tracking URI that is malformed or unreachable."""
    uri = parse(uri)
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme in ("http", "https"):
        import urllib.request

        try:
            urllib.request.urlopen(_health_request(uri), timeout=5).close()
        except Exception as exc:  # URLError, timeout, HTTP errors: one message for all
            raise AmpbenchError(f"MLflow server {redact(uri)} is unreachable ({mask(str(exc), uri)}); start it "
                                "(docs/operations.md, team mode) or unset MLFLOW_TRACKING_URI") from None
    if scheme == "sqlite":
        db = Path(sqlite_path(uri))
        folder = db.parent if db.parent.exists() else next(p for p in db.parents if p.exists())
        if not os.access(folder, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise AmpbenchError(f"MLflow store {db} is not writable; fix the permissions or set MLFLOW_TRACKING_URI")


def _health_request(uri: str):
    """GET <server>/health, with ``user:password@`` moved from the host into a Basic auth header (urllib would
    otherwise look up "user:password@host" as the host name)."""
    import base64
    import urllib.request

    parts = urlsplit(uri)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    request = urllib.request.Request(urlunsplit(parts._replace(netloc=netloc)).rstrip("/") + "/health")
    if parts.username is not None:
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


def sqlite_path(uri: str) -> str:
    return uri.split("sqlite:///", 1)[1].split("?", 1)[0]
