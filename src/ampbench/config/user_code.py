"""The user's own code named in params as ``package.module:callable`` (a data set factory, a model factory, a task):
import it with one-line errors, and check that the file defining it is a DVC dependency of the stages that call it.

Imported from the project root (the stages put it on ``sys.path``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any, Callable

from ampbench.errors import AmpbenchError, DataError, ModelError, ParamsError

FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")  # package.module:callable


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _ours_or_installed(filename: str) -> bool:
    """Is ``filename`` this library, its stage scripts, an installed package or Python itself (not the user's)?"""
    import sysconfig

    if filename.startswith("<"):  # <frozen …>, <string>: nothing a user can open
        return True
    path = Path(filename).resolve()
    library = Path(__file__).resolve().parents[1]  # src/ampbench
    ours = (library, library.parents[1] / "pipeline")
    python = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return (any(path.is_relative_to(p) for p in (*ours, *python))
            or "site-packages" in path.parts or "dist-packages" in path.parts)


def user_frame(exc: BaseException) -> str | None:
    """``file:line (function)`` of the deepest frame of ``exc``'s traceback that is the user's code (a model,
    data set or task factory's module), or None when the error did not pass through any."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours_or_installed(f.filename)]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} ({f.name})"


def source_file(name: str, key: str, error: type[AmpbenchError]) -> Path | None:
    """The file that defines ``package.module:callable`` (None if it has none, e.g. a C extension); ``key`` (the
    params key, e.g. "train.model") and ``error`` only shape the message."""
    module = name.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:  # a parent package that cannot be imported
        raise error(f"{key} {name!r}: cannot import {module} ({type(exc).__name__}: {exc})") from None
    if spec is None:
        raise error(f"{key} {name!r}: no module named {module!r} (importable from the project root)")
    return Path(spec.origin).resolve() if spec.origin and spec.has_location else None


def import_callable(name: str, key: str, error: type[AmpbenchError]) -> Callable[..., Any]:
    """The callable ``package.module:callable``; ``error`` with one line naming ``key`` when it cannot be had."""
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module can raise anything while importing
        raise error(f"{key} {name!r}: cannot import {module_name} ({type(exc).__name__}: {first_line(exc)})"
                    ) from None
    if not hasattr(module, attr):
        raise error(f"{key} {name!r}: {module_name} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise error(f"{key} {name!r}: {module_name}.{attr} is a {type(fn).__name__}, not a callable")
    return fn


# The params that may name code of yours → the param naming its file (a dependency in dvc.yaml), the stages that
# depend on it, and the error class of a failure to import it.
CODE_PARAMS = {"prepare.dataset": ("prepare.dataset_code", "the prepare stage", DataError),
               "train.model": ("train.model_code", "the train stages", ModelError),
               "train.task": ("train.task_code", "the train and evaluate stages", ParamsError)}


def require_tracked(key: str, name: str, code: str, root: Path) -> None:
    """When ``name`` (the value of param ``key``: a dataset, model or task) is your code
    (``package.module:callable``), the file defining it must lie in its code param's path ``code`` (relative to
    the project ``root``, as in dvc.yaml, where it is a dependency of the stages that import it), so that editing
    it reruns them; ParamsError naming the value to set otherwise. A built-in has nothing to check."""
    if not FACTORY.match(name):
        return
    code_key, stages, error = CODE_PARAMS[key]
    source = source_file(name, key, error)
    path = (root / code).resolve()
    if source is None or source == path or path in source.parents:
        return
    try:
        shown = source.relative_to(root.resolve())
    except ValueError:
        shown = source
    raise ParamsError(f"{code_key}: {code} does not hold {source.name}, which defines {name}; "
                      f"set {code_key}: {shown} so that changing it reruns {stages}")


CODE_KEYS = ("prepare.dataset_code", "train.model_code", "train.task_code")  # the paths dvc.yaml names as deps


def require_present(paths: dict[str, str], checkout: Path, project: Path) -> None:
    """Every code path (``paths``: params key → path relative to ``checkout``, as in dvc.yaml) must exist in
    ``checkout``, the copy DVC runs the stages in. ``project`` is the user's project (DVC_ROOT): when it differs,
    this is a temporary or queued experiment, whose copy holds only the files git tracks, and a file present in
    the project but absent here is one ``git add`` away. ParamsError with one line otherwise."""
    for key, code in paths.items():
        if (checkout / code).exists():
            continue
        if checkout.resolve() != project.resolve() and (project / code).exists():
            raise ParamsError(f"{key}: {code} is in your project but not in the copy DVC made for this experiment: "
                              "temporary and queued experiments (dvc exp run --temp / --queue) copy only the files "
                              f"git tracks; run `git add {code}` (no commit needed) and run the experiment again")
        raise ParamsError(f"{key}: {code} does not exist (a path relative to the project root, as in dvc.yaml)")
