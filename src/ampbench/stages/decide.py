"""``ampbench decide``: seeds until decided. Each look is one DVC experiment in the workspace (``dvc exp run``) with
``train.seeds`` grown by one seed and ``evaluate.sequential`` naming the design. The train stage reuses the seeds
it already finished (``resume.py``; ``train.keep_finished`` keeps them past the arm's end) and DVC's run cache
restores a look that ran before, so a rerun trains nothing new. After each look the evaluate stage's details.json
says whether the procedure stops (``verdict/sequential.py``); the workspace ends holding the last look's params and
outputs, each look stays in ``dvc exp show``, and in MLflow every look's parent run carries ``sequential.*`` tags
with one ``sequential.group``."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from ampbench.config.layout import ReportFiles
from ampbench.config.validation import validate
from ampbench.errors import AmpbenchError, DataError, ParamsError
from ampbench.runtime.files import read_json
from ampbench.verdict.sequential import Design


@dataclass(frozen=True)
class Decision:
    """Where ``decide`` stopped: the look's seeds, why, and the seeds at which each arm decided (None: never)."""

    look: int
    seeds: list[int]
    reason: str
    decided_at: dict[str, int | None]


def overrides(design: Design, seeds: list[int]) -> dict[str, Any]:
    """What one look sets, by dotted params key: its seeds, the design, and finished seeds kept for the next look."""
    return {"train.seeds": seeds, "train.keep_finished": True, "evaluate.sequential.max_seeds": design.max_seeds,
            "evaluate.sequential.min_seeds": design.min_seeds, "evaluate.sequential.spending": design.spending,
            "evaluate.sequential.until": design.until}


def settings(design: Design, seeds: list[int]) -> list[str]:
    """The ``-S`` settings of one look (lists and booleans as YAML writes them: [0,1,2], true)."""
    text = {list: lambda v: "[" + ",".join(map(str, v)) + "]", bool: lambda v: str(v).lower()}
    return [arg for key, value in overrides(design, seeds).items()
            for arg in ("-S", f"{key}={text.get(type(value), str)(value)}")]


def check_design(root: Path, design: Design, first_seed: int) -> None:
    """The workspace's params.yaml with the first look's settings, through the check stage's rules: one line
    before any look when a look could not run (an ``auto`` margin, an arm that cannot run, …)."""
    path = root / "params.yaml"
    try:
        raw: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ParamsError(f"{path}: {exc}") from None
    for key, value in overrides(design, list(range(first_seed, first_seed + design.min_seeds))).items():
        *sections, name = key.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    validate(raw)


def decide(root: Path, design: Design, first_seed: int = 0, extra: tuple[str, ...] = (),
           say: Callable[[str], None] = print, dvc: tuple[str, ...] = (sys.executable, "-m", "dvc")) -> Decision:
    """Run the looks of ``design`` in ``root`` (seeds ``first_seed``, ``first_seed + 1``, …) until the evaluate
    stage says the procedure stops. ``extra``: more ``key=value`` settings for every look."""
    check_design(root, design, first_seed)
    user = [arg for setting in extra for arg in ("-S", setting)]
    for look in design.looks():
        seeds = list(range(first_seed, first_seed + look.seeds))
        say(f"ampbench decide: look {look.index} of {len(design.looks())}: {look.seeds} seeds {seeds}")
        proc = subprocess.run([*dvc, "exp", "run", *settings(design, seeds), *user], cwd=root)
        if proc.returncode:
            raise AmpbenchError(f"look {look.index} ({look.seeds} seeds): `dvc exp run` failed (exit "
                                f"{proc.returncode}); its output is above. Rerun `ampbench decide` with the same "
                                "options once fixed: finished seeds are not trained again")
        state = _state(ReportFiles(root / "reports").details, look.seeds)
        say(f"ampbench decide: {state['reason']}")
        if state["stopped"]:
            return Decision(look.index, seeds, state["reason"], state["decided_at_seeds"])
    raise AssertionError("the last look always stops")  # outcome() stops at max_seeds


def _state(path: Path, seeds: int) -> dict[str, Any]:
    """details.json's ``sequential`` after a look of ``seeds`` seeds."""
    state = read_json(path, "the evaluate stage did not write it").get("sequential")
    if not isinstance(state, dict) or state.get("seeds") != seeds:
        raise DataError(f"{path}: no sequential look of {seeds} seeds in it; was evaluate.sequential overridden?")
    return state
