"""Atomic file writes: write to a temporary name in the same folder, then rename into place; JSON read back with
one-line errors; the hashes DVC and the stages key files and runs by.

An interrupted stage therefore never leaves a truncated file that DVC or the next stage would take as good.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ampbench.runtime import signals


def json_digest(obj: Any, length: int | None = None) -> str:
    """sha256 (hex, cut to ``length``) of ``obj`` as canonical JSON (sorted keys; non-JSON values as ``str``): the
    key of a resume checkpoint, of a pipeline execution and of an evaluation."""
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (``os.umask`` sets while it reads: a file
    another thread creates at that instant would get the temporary mask)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp creates 0600 whatever the umask; the output gets the mode a plain open() would give it, so a team's
    # shared folder (or a DVC remote filled from it) stays readable to the group the umask allows.
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename in (None, tmp):  # a failed write names no file, or the temporary one: name the output
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    _atomic(path, lambda tmp: tmp.write_text(text))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    _atomic(path, lambda tmp: tmp.write_bytes(data))


def _finite(obj: Any) -> Any:
    """``obj`` with NaN and ±inf floats as None: JSON has no such numbers (Python would write invalid NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def read_json(path: Path, hint: str = "") -> Any:
    """Parse the JSON file at ``path``; a missing or malformed file is one DataError naming it (and ``hint``)."""
    from ampbench.errors import DataError

    hint = f"; {hint}" if hint else ""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: missing{hint}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc}){hint}") from None


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically (non-finite numbers as null)."""
    atomic_write_text(path, json.dumps(_finite(obj), indent=2, sort_keys=False, allow_nan=False) + "\n")


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` atomically, with the same bytes for the same object on every run.

    torch.save names its zip entries after the file it writes to, so it writes to a buffer here: saved under the
    temporary name, the bytes (and DVC's hashes) would differ on every run.
    """
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    _atomic(path, lambda tmp: tmp.write_bytes(buf.getvalue()))


def atomic_savefig(fig, path: Path) -> None:
    """Save a matplotlib figure as PNG atomically, then close it (pyplot keeps every open figure alive)."""
    import matplotlib.pyplot as plt

    try:
        _atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)


@contextmanager
def published_together(root: Path) -> Iterator[Path]:
    """Yield a staging folder inside ``root``; the files written under it replace their namesakes under ``root``
    together when the block ends, with SIGINT/SIGTERM held off while renaming, or none of them on an error or a
    signal: a stage's outputs are never half old, half new. Leftover staging folders (kill -9) are removed."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(".staging-*"):
        shutil.rmtree(old, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        yield staging
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        with signals.signals_deferred():
            for f in files:
                dest = root / f.relative_to(staging)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def dvc_md5(folder: Path) -> str:
    """The hash DVC records for ``folder`` in dvc.lock (``<md5>.dir``: the md5 of the JSON list of its files'
    relative paths and md5s), computed here so a stage can tag its runs with it without importing DVC (absent on
    some machines). Tested equal to DVC's."""
    import hashlib

    folder = Path(folder)
    entries = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.md5()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        entries.append({"md5": digest.hexdigest(), "relpath": path.relative_to(folder).as_posix()})
    entries.sort(key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"
