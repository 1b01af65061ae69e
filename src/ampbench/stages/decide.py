"""``ampbench decide``: seeds until decided. Each look is one DVC experiment in the workspace (``dvc exp run``) with
``train.seeds`` grown by one seed and ``evaluate.sequential`` naming the design. The train stage reuses the seeds
it already finished (``resume.py``; ``train.keep_finished`` keeps them past the arm's end) and DVC's run cache
restores a look that ran before, so a rerun trains nothing new. After each look the evaluate stage's details.json
says whether the procedure stops (``verdict/sequential.py``); the workspace ends holding the last look's params and
outputs, each look stays in ``dvc exp show``, and in MLflow every look's parent run carries ``sequential.*`` tags
with one ``sequential.group``.

Before the first look the settings of every look (the user's ``-S`` ones applied by DVC's own parser) go through
the check stage's checks; a look that fails or is interrupted leaves params.yaml as it was before ``decide``. Each
look's ``dvc exp run`` runs in a process group of its own, which a SIGINT or SIGTERM to ``decide`` is passed to:
the look's stage says it was interrupted, DVC exits, and so does ``decide``, with one line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from ampbench.config.layout import ReportFiles
from ampbench.config.validation import validate
from ampbench.errors import AmpbenchError, DataError, Interrupted, ParamsError
from ampbench.precision.checks import check_run
from ampbench.runtime import processes, signals
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


def every_look(setting: str) -> str:
    """A user's ``-S`` setting as every look gives it: ``+key=value`` (append: DVC refuses it once the key exists)
    becomes ``++key=value`` (add or override), since each look's settings stay in params.yaml and the second look
    (or a rerun of ``decide``) finds the key already there, with this value."""
    return "+" + setting if setting.startswith("+") and not setting.startswith("++") else setting


def settings(design: Design, seeds: list[int]) -> list[str]:
    """The ``-S`` settings of one look (lists and booleans as YAML writes them: [0,1,2], true)."""
    text = {list: lambda v: "[" + ",".join(map(str, v)) + "]", bool: lambda v: str(v).lower()}
    return [arg for key, value in overrides(design, seeds).items()
            for arg in ("-S", f"{key}={text.get(type(value), str)(value)}")]


def check_design(root: Path, design: Design, first_seed: int, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The workspace's params.yaml with the user's ``extra`` settings (applied as ``dvc exp run -S`` applies them)
    and the first look's, through the check stage's checks: one line before any look when a look could not run (a
    typo in a setting, an ``auto`` margin, an arm that cannot run, a broken optional package…). Changes no file.
    Returns the arms a missing optional package will skip, with why."""
    path = root / "params.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "params.yaml"
        try:
            shutil.copyfile(path, copy)
        except OSError as exc:
            raise ParamsError(f"{path}: {exc.strerror}") from None
        if extra:
            apply_settings(copy, extra)
        try:
            raw: dict[str, Any] = yaml.safe_load(copy.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ParamsError(f"{path}: {exc}") from None
    for key, value in overrides(design, list(range(first_seed, first_seed + design.min_seeds))).items():
        *sections, name = key.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return check_run(validate(raw), root, root)


def apply_settings(path: Path, settings: tuple[str, ...]) -> None:
    """``-S`` settings applied to ``path`` by DVC's own function (Hydra's override grammar), so that what is checked
    is what ``dvc exp run -S`` will write."""
    try:
        from dvc.utils.hydra import apply_overrides
    except ImportError:  # pragma: no cover  (dvc is a requirement; without it no look could run either)
        raise ParamsError("-S: DVC is not installed in this environment (pip install -r requirements.lock)") from None
    for setting in settings:  # one at a time: the line names the setting that is wrong
        try:
            apply_overrides(path, [setting])
        except Exception as exc:  # noqa: BLE001  (DVC's and Hydra's errors for a malformed or unknown setting)
            cause = exc.__cause__ or exc  # DVC's own is "Invalid `--set-param` value"; Hydra's says why
            why = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
            if why.startswith("Could not override"):
                why = why.rstrip(".") + " (no such key in params.yaml)"
            raise ParamsError(f"-S {setting}: {why}") from None


def decide(root: Path, design: Design, first_seed: int = 0, extra: tuple[str, ...] = (),
           say: Callable[[str], None] = print, dvc: tuple[str, ...] = (sys.executable, "-m", "dvc")) -> Decision:
    """Run the looks of ``design`` in ``root`` (seeds ``first_seed``, ``first_seed + 1``, …) until the evaluate
    stage says the procedure stops. ``extra``: more ``key=value`` settings for every look."""
    extra = tuple(every_look(setting) for setting in extra)
    for arm, why in check_design(root, design, first_seed, extra).items():
        say(f"ampbench decide: {arm} will be skipped: {why}")
    user = [arg for setting in extra for arg in ("-S", setting)]
    with _params_kept_on_failure(root / "params.yaml"):
        for look in design.looks():
            seeds = list(range(first_seed, first_seed + look.seeds))
            say(f"ampbench decide: look {look.index} of {len(design.looks())}: {look.seeds} seeds {seeds}")
            status = _run_look([*dvc, "exp", "run", *settings(design, seeds), *user], root, look.index)
            if status:
                raise AmpbenchError(f"look {look.index} ({look.seeds} seeds): `dvc exp run` failed (exit {status}); "
                                    "its output is above, params.yaml is as it was. Rerun `ampbench decide` with "
                                    "the same options once fixed: finished seeds are not trained again")
            state = _state(ReportFiles(root / "reports").details, look.seeds)
            say(f"ampbench decide: {state['reason']}")
            if state["stopped"]:
                return Decision(look.index, seeds, state["reason"], state["decided_at_seeds"])
    raise AssertionError("the last look always stops")  # outcome() stops at max_seeds


@contextmanager
def _params_kept_on_failure(path: Path) -> Iterator[None]:
    """params.yaml as it was before ``decide`` if a look fails or is interrupted (``dvc exp run`` leaves a failed
    look's settings in it, which the next ``decide`` would then start from); a look that ran keeps its own."""
    before = path.read_bytes()
    try:
        yield
    except BaseException:
        with signals.signals_deferred():
            if path.read_bytes() != before:
                path.write_bytes(before)
        raise


def _run_look(cmd: list[str], root: Path, index: int) -> int:
    """``dvc exp run`` in a process group of its own; a SIGINT or SIGTERM we get is passed to the whole group (DVC,
    its stage, a preloaded stage's client) and waited for; then Interrupted. Returns the exit status."""
    proc = subprocess.Popen(cmd, cwd=root, start_new_session=True)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = proc.wait()
        if got:  # DVC may exit before its stage has ended its run KILLED and said what it kept: wait for them
            processes.end_group(proc, steps=(None, signal.SIGTERM, signal.SIGKILL), grace=10.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if got:
        raise Interrupted(signal.Signals(got[0]).name, f"look {index} was stopped (its stage says what it kept: "
                          "finished seeds stay in .resume/); params.yaml is as it was. Rerun `ampbench decide` with "
                          "the same options to go on")
    return status


def _state(path: Path, seeds: int) -> dict[str, Any]:
    """details.json's ``sequential`` after a look of ``seeds`` seeds."""
    state = read_json(path, "the evaluate stage did not write it").get("sequential")
    if not isinstance(state, dict) or state.get("seeds") != seeds:
        raise DataError(f"{path}: no sequential look of {seeds} seeds in it; was evaluate.sequential overridden?")
    return state
