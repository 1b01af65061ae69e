"""Validation of params.yaml against the schema in ``params.py``: types and bounds (pydantic), then combinations
that are each valid alone but not together (the table in ``rules.py``). Every problem becomes ``ParamsError`` with
one line naming the key, the value and what is allowed, before any stage does work.
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any

from ampbench.config import rules
from ampbench.config.params import Params
from ampbench.errors import ParamsError


def _where(error: dict[str, Any]) -> str:
    # Union members add their tag to the location (e.g. "constrained-float"): not a key, so left out.
    return ".".join(str(p) for p in error["loc"] if not isinstance(p, str) or p.isidentifier()) or "params"


def _siblings(loc: tuple) -> list[str]:
    """The keys the schema allows beside the last part of ``loc`` (a path of keys from the top of params.yaml)."""
    import typing

    cls: Any = Params
    for part in loc[:-1]:
        if not dataclasses.is_dataclass(cls):
            return []
        hint = typing.get_type_hints(cls, include_extras=True).get(part)
        cls = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _describe(error: dict[str, Any], also: list[dict[str, Any]] = ()) -> str:
    import difflib

    where = _where(error)
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        close = difflib.get_close_matches(str(error["loc"][-1]), _siblings(tuple(error["loc"])), n=1)
        return f"{where}: unknown key (a typo?)" + (f"; did you mean {where[:-len(str(error['loc'][-1]))]}{close[0]}?"
                                                     if close else "")
    got = error.get("input")
    text = repr(got)
    if len(text) > 80:  # a 10,000-character name is not worth repeating
        text = f"{text[:60]}…, {len(got)} characters" if isinstance(got, str) else f"{text[:60]}…"
    shown = "" if isinstance(got, dict) else f" (got {text})"
    msgs = [error["msg"]] + [e["msg"] for e in also]  # a union's members: any of them would do
    return f"{where}: {', or '.join(msgs)}{shown}"


MAX_VALUES = 20_000  # values in a whole params file once YAML aliases are expanded (the defaults: about 100)


def _bounded(raw: Any, where: str = "", seen: list[int] | None = None) -> None:
    """Refuse a document that expands to more than ``MAX_VALUES`` values: a YAML alias bomb (a few lines that
    reference each other) parses cheaply but expands exponentially wherever it is copied, hashed or logged. The
    walk stops at the limit, so it is cheap whatever the document."""
    seen = seen if seen is not None else [0]
    seen[0] += 1
    if seen[0] > MAX_VALUES:
        shown = ".".join(where.split(".")[:3]) or "params"
        raise ParamsError(f"{shown}: more than {MAX_VALUES:,} values once YAML aliases are expanded "
                          "(an alias bomb?); write the values out")
    if isinstance(raw, dict):
        for key, value in raw.items():
            _bounded(value, f"{where}.{key}" if where else str(key), seen)
    elif isinstance(raw, list):
        for i, value in enumerate(raw):
            _bounded(value, f"{where}.{i}", seen)


def _numeric(tp: Any) -> tuple[bool, Any]:
    """(is ``tp`` a number type that is not also bool, its element type if it is a list/tuple of them)."""
    import typing

    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return False, (args[0] if args else None)
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    members = {typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in members}
    return bool({int, float} & members) and bool not in members, None


def _booleans_as_numbers(raw: Any, cls: type, where: str = "") -> str | None:
    """The first key where a YAML boolean stands for a number (pydantic would read ``true`` as 1: one epoch)."""
    import typing

    if not (isinstance(raw, dict) and dataclasses.is_dataclass(cls)):
        return None
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        value, key, tp = raw[f.name], f"{where}{f.name}", hints[f.name]
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp
        if dataclasses.is_dataclass(inner):
            found = _booleans_as_numbers(value, inner, f"{key}.")
            if found:
                return found
            continue
        number, element = _numeric(tp)
        if number and isinstance(value, bool):
            return key
        if element is not None and isinstance(value, list) and _numeric(element)[0]:
            for i, v in enumerate(value):
                if isinstance(v, bool):
                    return f"{key}.{i}"
    return None


MLFLOW_PARAM_KEY, MLFLOW_PARAM_VALUE = 250, 6000  # mlflow.utils.validation's limits for a run's params


def _fits_mlflow(params: Params) -> None:
    """Every param the runs log (flattened as ``tracking.flatten`` does) within MLflow's limits; a free-form
    mapping (``train.model_args``) could otherwise fail the run mid-training, blaming the store."""
    from ampbench.tracking.logs import flatten

    for section in ("prepare", "train", "evaluate", "mlflow"):
        for key, value in flatten(section, getattr(params, section).to_dict()).items():
            if len(key) > MLFLOW_PARAM_KEY:
                raise ParamsError(f"{key[:80]}…: a params key of {len(key)} characters; MLflow keeps at most "
                                  f"{MLFLOW_PARAM_KEY} (shorten the names in that mapping)")
            if len(value) > MLFLOW_PARAM_VALUE:
                raise ParamsError(f"{key}: {len(value):,} characters once logged; MLflow keeps params of at most "
                                  f"{MLFLOW_PARAM_VALUE:,} (pass a file path instead of the data itself)")


def validate(raw: dict[str, Any] | None) -> Params:
    """Validate a params mapping; raise ParamsError naming the first bad key (and how many more there are)."""
    from pydantic import TypeAdapter, ValidationError

    _bounded(raw)
    key = _booleans_as_numbers(raw, Params)
    if key:
        raise ParamsError(f"{key}: a boolean where a number belongs (YAML reads true/false/yes/no/on/off as "
                          "booleans); write the number")
    try:
        params = TypeAdapter(Params).validate_python(raw or {})
    except ValidationError as exc:
        errors = exc.errors()
        same = [e for e in errors[1:] if _where(e) == _where(errors[0])]
        rest = len(errors) - 1 - len(same)
        more = f" (and {rest} more)" if rest else ""
        raise ParamsError(_describe(errors[0], same) + more) from None
    _fits_mlflow(params)
    problems = rules.problems(params)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        key, reason = problems[0]
        raise ParamsError(f"{key}: {reason}{more}")
    return params


def load_params(path: str | Path) -> Params:
    """Read and validate a params.yaml file."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such params file") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if raw is not None and not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return validate(raw)
