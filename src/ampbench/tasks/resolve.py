"""``train.task`` → a Task (``task.py`` has the contract): a built-in, or a callable of yours, checked to fulfil
the contract before any work, its code a DVC dependency (``train.task_code``)."""

from __future__ import annotations

from pathlib import Path

from ampbench.errors import ParamsError
from ampbench.tasks.contract import CLASSIFICATION, Task

METHODS = ("view", "model_args", "output_error", "logits", "loss", "correct", "validate", "evaluate", "paired")


def require_tracked(name: str, task_code: str, root: Path) -> None:
    """A Task of your own must lie in ``train.task_code`` (relative to the project ``root``, as in dvc.yaml, where
    it is a dependency of the train and evaluate stages); ParamsError naming the value to set otherwise."""
    from ampbench.config.user_code import require_tracked as tracked
    from ampbench.config.validation import task_kind

    if task_kind(name) == "factory":
        tracked(name, task_code, root, "train.task", "train.task_code", "the train and evaluate stages", ParamsError)


def resolve_task(name: str, block_size: int | None = None) -> Task:
    """The task ``train.task`` names (``block_size``: train.block_size, for the language model): a built-in, or
    what ``package.module:callable`` returns (checked to have every method of the contract: ParamsError naming
    the missing ones)."""
    if name == "classification":
        return CLASSIFICATION
    if name == "language_model":
        from ampbench.tasks.language_model import LanguageModel

        return LanguageModel(block_size)
    from ampbench.config.user_code import import_callable

    try:
        task = import_callable(name, "train.task", ParamsError)()
    except ParamsError:
        raise
    except Exception as exc:  # the user's callable failed
        raise ParamsError(f"train.task {name!r}: calling it failed ({type(exc).__name__}: {exc})") from None
    missing = [m for m in METHODS if not callable(getattr(task, m, None))]
    if missing:
        raise ParamsError(f"train.task {name!r} returned a {type(task).__name__} without {', '.join(missing)} (the "
                          "Task contract: ampbench.tasks.contract.Task)")
    return task
