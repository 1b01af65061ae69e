"""The pieces every params section is made of: ``knob`` (a key's comment, the stages that read it and its
constraints), bounds for members of unions and lists, and the shared base of the section dataclasses
(``params.py``). pydantic is imported only when a file is validated or synced.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def at_least(bound: float, most: float | None = None):
    """Bounds for one member of a union (``float | Literal["auto"]``, where a knob's ge would also be applied to
    the string) or of a list (each seed)."""
    from pydantic import Field

    return Field(ge=bound, le=most)


def text(most: int):
    """Bounds for one string of a list: not empty, at most ``most`` characters."""
    from pydantic import Field

    return Field(min_length=1, max_length=most)


# Upper bounds are what a machine can honour: NumPy seeds are 32-bit; counts and sizes beyond these would take
# days or more memory than any machine has, and are far more likely a typo than a plan.
SEED_MAX = 2**32 - 1


# extra="forbid": a typo such as `train.epoch` is an error instead of a silently ignored key.
_FORBID_EXTRA = {"extra": "forbid"}


def knob(doc: str, *, stages: tuple[str, ...] | None = None, **constraints: Any):
    """Annotation metadata for one key: its comment in params.yaml, the stages whose outputs depend on it (None:
    the section's stages; ``()``: none, e.g. display only) and pydantic constraints (gt=0, …).

    Only evaluated when validating or syncing files, where pydantic is installed.
    """
    from pydantic import Field

    extra = None if stages is None else {"stages": list(stages)}
    return Field(description=doc, json_schema_extra=extra, **constraints)


class _Section:
    """Shared helpers of the section dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (for MLflow params, resume keys and params.yaml)."""
        return dataclasses.asdict(self)
