"""Resume policy of the train stage: when a checkpoint may be continued, and what it carries besides the state.

After every epoch each seed of an unfinished arm has a checkpoint under ``.resume/<arm>/seed<N>.pt``: the training
state (``training/checkpoint.py``) plus a ``SeedProgress`` record: the epochs so far, the MLflow run id, and, once
the seed is done, its summary record. Run the stage again with the same params, data and code (the resume key) and
a seed continues from its last epoch in the same MLflow run; a finished seed is reused, not retrained. Once the
arm is complete the folder is removed, unless ``train.keep_finished`` (``ampbench decide``) keeps the finished
seeds for a later run with more seeds. A
checkpoint of another arm is refused outright; one written with other params, data or code is ignored.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampbench.config.params import TrainParams
from ampbench.errors import ResumeRefused
from ampbench.runtime.files import json_digest
from ampbench.training import checkpoint
from ampbench.training.state import EpochRecord, TrainState

# Train params that do not change what training computes: a checkpoint stays resumable across them.
NOT_IN_KEY = ("progress", "precisions", "seeds", "keep_finished")


def resume_key(train: TrainParams, data_checksum: str, arm: str, seed: int, code_version: str) -> str:
    """What must be equal for a checkpoint to be resumed: params that shape training, data, arm, seed, code."""
    shaping = {k: v for k, v in train.to_dict().items() if k not in NOT_IN_KEY}
    return json_digest([shaping, data_checksum, arm, seed, code_version])


@dataclass
class SeedProgress:
    """A seed's progress as stored in its resume checkpoint."""

    arm: str
    key: str  # resume_key() at the time of writing
    records: list[EpochRecord] = field(default_factory=list)
    run_id: str | None = None  # the seed's MLflow run, reopened on resume
    done: dict[str, Any] | None = None  # the seed's summary record once it finished (or diverged)

    def to_meta(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # records become plain dicts (weights_only loading)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> SeedProgress:
        return cls(meta["arm"], meta["key"], [EpochRecord(**r) for r in meta["records"]], meta["run_id"],
                   meta["done"])


def save(state: TrainState | dict[str, Any], progress: SeedProgress, path: Path) -> None:
    """The state (a ``TrainState``, or a framework's checkpoint dict) and the progress after an epoch (or at the end
    of a seed), atomically."""
    ck = state if isinstance(state, dict) else checkpoint.state_dict(state)
    checkpoint.write(ck, {"resume": progress.to_meta()}, path)


def load(path: Path, arm: str, key: str) -> tuple[dict[str, Any], SeedProgress] | None:
    """(checkpoint, progress) at ``path`` if training may continue from it, else None (absent, or params, data
    or code changed). A checkpoint of another arm raises ResumeRefused: resuming fp16 weights, optimizer and
    scaler state as a bf16 run would silently mix two experiments."""
    if not Path(path).exists():
        return None
    ck = checkpoint.load(path)
    meta = ck.get("meta", {}).get("resume", {})
    if meta.get("arm") != arm:
        raise ResumeRefused(f"{path} was trained as {meta.get('arm')!r}; refusing to resume it as {arm!r}. "
                            f"Delete it to start {arm} from scratch.")
    if meta.get("key") != key:
        print(f"[{arm}] {path}: params, data or code changed since it was written; starting over", file=sys.stderr)
        return None
    return ck, SeedProgress.from_meta(meta)
