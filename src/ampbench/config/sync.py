"""Derive the files that repeat the schema: params.yaml's comments and layout, dvc.yaml's ``params:`` lists.

``ampbench sync-params`` (``make params``) rewrites both from ``params.py``, keeping the values in params.yaml;
the tests fail when the committed files differ from what this module renders from the defaults.
"""

from __future__ import annotations

import dataclasses
import io
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampbench.config.params import NOT_READ_BY_SPEED, SECTION_STAGES, STAGES, Params
from ampbench.config.validation import load_params

HEADER = """\
# ampbench parameters: one section per DVC stage (prepare, train, speed, evaluate) plus mlflow.
# Change any value for one run with:  .venv/bin/dvc exp run --temp -S train.epochs=12  (docs/mlflow-and-dvc.md)
# Defaults and comments come from src/ampbench/config/params.py: after changing it, run `make params`.
"""
COMMENT_COLUMN = 27
LINE_WIDTH = 118


@dataclass(frozen=True)
class Key:
    """One key of the schema: dotted path, its doc, the stages that read it, its sub-keys if it is a group."""

    path: str
    doc: str
    stages: tuple[str, ...]
    children: tuple[Key, ...] = ()

    def leaves(self) -> list[Key]:
        return [leaf for child in self.children for leaf in child.leaves()] if self.children else [self]


def _fields(cls: type, prefix: str, inherited: tuple[str, ...] | None) -> tuple[Key, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)  # evaluates the knob(...) annotations
    keys = []
    for f in dataclasses.fields(cls):
        hint, path = hints[f.name], f"{prefix}{f.name}"
        info = hint.__metadata__[0] if hasattr(hint, "__metadata__") else None
        kind = typing.get_args(hint)[0] if info is not None else hint
        extra = (info.json_schema_extra or {}) if info is not None else {}
        stages = tuple(extra["stages"]) if "stages" in extra else (
            inherited if inherited is not None else SECTION_STAGES[f.name])
        if path.startswith("train.") and path not in NOT_READ_BY_SPEED and "speed" not in stages:
            stages += ("speed",)
        children = _fields(kind, f"{path}.", stages) if dataclasses.is_dataclass(kind) else ()
        keys.append(Key(path, info.description if info is not None else "", stages, children))
    return tuple(keys)


def schema() -> tuple[Key, ...]:
    """The sections of params.yaml as a tree of ``Key``."""
    return _fields(Params, "", None)


def stage_params(stage: str) -> list[str]:
    """The ``params:`` list of ``stage`` in dvc.yaml: every key it reads, a section or group named whole when the
    stage reads all of it."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}")

    def collect(key: Key) -> list[str]:
        leaves = key.leaves()
        if all(stage in leaf.stages for leaf in leaves):
            return [key.path]
        return [p for child in key.children for p in collect(child)]

    return [p for section in schema() for p in collect(section)]


def _scalar(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def _line(indent: int, body: str, doc: str) -> list[str]:
    """``body`` at ``indent`` with ``doc`` as a comment at the comment column, wrapped onto comment lines."""
    head = " " * indent + body
    if not doc:
        return [head]
    column = max(COMMENT_COLUMN, len(head) + 2)
    chunks = textwrap.wrap(doc, max(LINE_WIDTH - column - 2, 30))
    lines = [head.ljust(column) + "# " + chunks[0]]
    lines += [" " * column + "#   " + chunk for chunk in chunks[1:]]
    return lines


def render(params: Params) -> str:
    """params.yaml for ``params``: every key in schema order, the schema's docs as comments."""
    values = params.to_dict()

    def block(keys: tuple[Key, ...], indent: int) -> list[str]:
        out = []
        for key in keys:
            name = key.path.rsplit(".", 1)[-1]
            if key.children:
                out += _line(indent, f"{name}:", key.doc) + block(key.children, indent + 2)
            else:
                value = values
                for part in key.path.split("."):
                    value = value[part]
                out += _line(indent, f"{name}: {_scalar(value)}", key.doc)
        return out

    sections = []
    for section in schema():
        sections.append("\n".join([f"{section.path}:", *block(section.children, 2)]))
    return HEADER + "\n\n".join(sections) + "\n"


def _yaml_round_trip():
    from ruamel.yaml import YAML

    y = YAML()  # round trip: keeps dvc.yaml's comments and layout
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096
    y.preserve_quotes = True
    return y


def render_dvc_yaml(text: str) -> str:
    """dvc.yaml ``text`` with every stage's ``params:`` list replaced by ``stage_params(stage)``."""
    from ruamel.yaml.comments import CommentedSeq

    y = _yaml_round_trip()
    doc = y.load(text)
    for stage in STAGES:
        doc["stages"][stage]["params"] = CommentedSeq(stage_params(stage))
    buf = io.StringIO()
    y.dump(doc, buf)
    return buf.getvalue()


def sync(root: Path, write: bool = True) -> list[Path]:
    """Rewrite ``root``/params.yaml (values kept) and the params lists of ``root``/dvc.yaml; return the files that
    were (``write`` False: would be) changed."""
    from ampbench.runtime.files import atomic_write_text

    wanted = {root / "params.yaml": render(load_params(root / "params.yaml")),
              root / "dvc.yaml": render_dvc_yaml((root / "dvc.yaml").read_text())}
    changed = [path for path, text in wanted.items() if text != path.read_text()]
    if write:
        for path in changed:
            atomic_write_text(path, wanted[path])
    return changed
