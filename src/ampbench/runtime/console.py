"""Progress lines for people: one line per event on stderr, flushed at once (stdout stays for stage results)."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    """Print ``msg`` as one line on stderr."""
    print(msg, file=sys.stderr, flush=True)
