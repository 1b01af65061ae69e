"""The output layout: the one module that knows where stages read and write (dvc.yaml names the same paths).

Paths are relative to the project root; every stage takes its folders as options, so tests redirect them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RAW = Path("data/raw")  # the default prepare.raw_dir: downloads and user-placed raw data (git-ignored but README.md)
PARAMS_CHECK = Path("data/params-checked.txt")  # the check stage's output: only orders it before prepare
PREPARED = Path("data/prepared")  # the prepare stage's output
MODELS = Path("models")  # one folder per arm: the train stages' outputs
RESUME = Path(".resume")  # per-epoch checkpoints of unfinished arms: outside models/, which DVC empties
REPORTS = Path("reports")  # the evaluate stage's outputs
INTERLEAVED = REPORTS / "interleaved.json"  # the speed stage's output, which evaluate reads


@dataclass(frozen=True)
class ArmFiles:
    """What one train stage writes under ``models/<arm>/``."""

    root: Path

    @property
    def summary(self) -> Path:
        """What ran, per seed: run ids, throughput, memory, final metrics, hardware (summary.json)."""
        return self.root / "summary.json"

    @property
    def history(self) -> Path:
        """Every seed's per-epoch rows, by seed."""
        return self.root / "history.json"

    def checkpoint(self, seed: int) -> Path:
        return self.root / f"seed{seed}.pt"

    def seed_history(self, seed: int) -> Path:
        return self.root / f"history-seed{seed}.json"

    def grad_layers(self, seed: int) -> Path:
        """Per-epoch, per-parameter gradient range shares."""
        return self.root / f"grad_layers-seed{seed}.json"

    def activations(self, seed: int) -> Path:
        """Per-module output ranges over the sampled steps (activations.merge_tables), closest to fp16's top first."""
        return self.root / f"activations-seed{seed}.json"


@dataclass(frozen=True)
class ReportFiles:
    """What the evaluate stage writes under ``reports/``."""

    root: Path

    @property
    def comparison(self) -> Path:
        """DVC metrics that training reproduces exactly: verdicts, Δ with CI, agreement, KL, ECE."""
        return self.root / "comparison.json"

    @property
    def speed(self) -> Path:
        """DVC metrics that never repeat exactly: throughput, memory and their ratios."""
        return self.root / "speed.json"

    @property
    def details(self) -> Path:
        return self.root / "details.json"

    @property
    def curves(self) -> Path:
        """DVC plots: one row per arm, seed and epoch."""
        return self.root / "curves.json"

    @property
    def quality(self) -> Path:
        """DVC plots: validation loss against time, one row per arm, seed and evaluation."""
        return self.root / "quality.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    @property
    def fix(self) -> Path:
        """The records ``ampbench fix`` writes (stages/fix_record.py), which this stage reads into report.md."""
        return self.root / "fix"

    @property
    def tracked(self) -> list[Path]:
        """The files logged as artifacts of the execution's MLflow parent run (figures go in their own folder)."""
        return [self.report, self.comparison, self.speed, self.details, self.curves, self.quality]
