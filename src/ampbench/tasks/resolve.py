"""``train.task`` → a Task (``contract.py`` has the contract): a built-in, or a callable of yours, checked to fulfil
the contract before any work, its code a DVC dependency (``train.task_code``)."""

from __future__ import annotations

from ampbench.errors import ParamsError
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task

METHODS = ("view", "model_args", "output_error", "logits", "loss", "correct", "validate", "evaluate", "paired")
LABELS = ("deciding", "accuracy_label", "loss_label")  # strings: which metric decides, and their names
DECIDING = ("accuracy", "loss")


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
    missing += [a for a in LABELS if not isinstance(getattr(task, a, None), str)]
    if missing:
        raise ParamsError(f"train.task {name!r} returned a {type(task).__name__} without {', '.join(missing)} (the "
                          "Task contract: ampbench.Task, docs/your-task.md)")
    if task.deciding not in DECIDING:
        raise ParamsError(f"train.task {name!r}: deciding is {task.deciding!r}; the verdict is decided by one of "
                          f"{', '.join(DECIDING)}")
    return task
