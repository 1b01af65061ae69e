"""What the report says about the run as a whole (``RunContext``): the task and its labels, the data and its test
split, the model, the seeds, the device, the margins and fp32's seed noise. The evaluate stage fills it once;
the recommendation, the plans, the report and the figures read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampbench.config.records import ModelRecord
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task
from ampbench.verdict.sequential import Looks
from ampbench.verdict.stats import Margins, SeedNoise


@dataclass(frozen=True)
class HeldOut:
    """How the test split was made: its size, where it came from (``publisher``: the data set's own;
    ``test_fraction``: cut from the data) and its size before ``prepare.max_test``; None where not recorded."""

    size: int | None = None
    source: str | None = None
    available: int | None = None


@dataclass(frozen=True)
class RunContext:
    """The run as a whole. The defaults are those of a run that says nothing about itself (the built-in
    classification task on a GPU, three seeds), so a partial context (a test's) still reads."""

    task: Task = CLASSIFICATION
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    device_type: str = "cuda"
    device_name: str = ""
    dataset: str = ""
    model: ModelRecord | None = None
    epochs: int | None = None
    margins: Margins | None = None
    noise: SeedNoise | None = None
    confidence: float = 0.95
    prepare: dict[str, Any] = field(default_factory=dict)  # the prepare params (the plans' -S settings)
    batch_size: int = 0
    test: HeldOut = field(default_factory=HeldOut)
    data_notes: tuple[str, ...] = ()  # what prepare's caps cut, in the data's unit (data.prepare.cut_notes)
    note: str | None = None  # the CPU note (advice.cpu_note)
    looks: Looks | None = None  # a sequential comparison: its design and where it stands (verdict/sequential.py)
    searches: tuple[str, ...] = ()  # the section on `ampbench fix`'s searches of this run (report/fix.py)

    @property
    def by_loss(self) -> bool:
        """Whether the task's verdict is its loss's (a language model) rather than accuracy's."""
        return self.task.deciding == "loss"

    @property
    def margin_pp(self) -> float:
        return 100 * self.margins.accuracy

    @property
    def labels(self) -> dict[str, str]:
        """What the task calls its two metrics (the language model: next-token accuracy, loss per token)."""
        return {"accuracy": self.task.accuracy_label, "loss": self.task.loss_label}
