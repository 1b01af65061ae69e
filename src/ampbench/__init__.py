"""ampbench: measure what mixed precision does to a PyTorch training job, against a strict float32 baseline.

The library behind the DVC stages in ``pipeline/``; see README.md and docs/ for the pipeline itself. The names a
user's code needs are here, at the top, and stay here when modules move (docs/your-task.md)::

    from ampbench import Task, Classification, LanguageModel, GPT

They are imported on first use, so ``import ampbench`` (and ``ampbench compare --help``) loads no torch. The
packages, one per concern, each map their modules in their ``__init__.py``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name → the module that defines it
_EXPORTS = {
    "Task": "ampbench.tasks.contract",  # the contract a task fulfils
    "SeedEvaluation": "ampbench.tasks.contract",  # what Task.evaluate gives per arm and seed
    "Classification": "ampbench.tasks.classification",  # the default task, to subclass
    "LanguageModel": "ampbench.tasks.language_model",  # next-token prediction, to subclass
    "GPT": "ampbench.models.gpt",  # the built-in language model
    "CausalSelfAttention": "ampbench.models.gpt",  # its attention block (examples/overflow_gpt.py)
    "PairedSummary": "ampbench.verdict.stats",  # what Task.paired returns, twice
    "paired_accuracy": "ampbench.verdict.stats",  # the paired statistics a Task's paired() uses
    "paired_mean": "ampbench.verdict.stats",
}
__all__ = ["Task", "SeedEvaluation", "Classification", "LanguageModel", "GPT", "CausalSelfAttention",
           "PairedSummary", "paired_accuracy", "paired_mean"]  # = _EXPORTS' names (a literal: linters read it)

# Modules a user's code may still name from before the packages (0.1's flat layout) → where their names live now.
# Old names that are packages today (ampbench.data, .models, .precision, .tasks, .training, .report) import as
# those packages; their docstrings map the modules.
MOVED = {
    "ampbench.task": "from ampbench import Task, Classification, SeedEvaluation (ampbench.tasks.contract, "
                     "ampbench.tasks.classification)",
    "ampbench.language_model": "from ampbench import LanguageModel (ampbench.tasks.language_model)",
    "ampbench.gpt": "from ampbench import GPT, CausalSelfAttention (ampbench.models.gpt)",
    "ampbench.stats": "from ampbench import paired_accuracy, paired_mean, PairedSummary (ampbench.verdict.stats)",
    "ampbench.model_factory": "ampbench.models.factory",
    "ampbench.metrics": "ampbench.verdict.metrics",
    "ampbench.splits": "ampbench.data.splits",
    "ampbench.params": "ampbench.config.params",
    "ampbench.arms": "ampbench.config.arms",
    "ampbench.step": "ampbench.training.step",
}


class _Moved(importlib.abc.MetaPathFinder):
    """Turns an import of a module that moved into one line naming where its names are now."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} moved when the library became packages: {MOVED[fullname]}",
                                      name=fullname)


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())  # last: only asked for what no other finder found


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # the next access does not come here
        return value
    raise AttributeError(f"module 'ampbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # for type checkers and editors; at run time the names come from __getattr__
    from ampbench.models.gpt import GPT, CausalSelfAttention
    from ampbench.tasks.classification import Classification
    from ampbench.tasks.contract import SeedEvaluation, Task
    from ampbench.tasks.language_model import LanguageModel
    from ampbench.verdict.stats import PairedSummary, paired_accuracy, paired_mean
