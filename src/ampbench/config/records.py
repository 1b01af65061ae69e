"""The schemas of the JSON files one stage writes and the next reads: ``data/prepared/meta.json`` (prepare → train,
evaluate), ``models/<arm>/summary.json`` and ``history.json`` (train → evaluate). Every field the reader uses, with
its type, checked before anything is written, so a damaged or hand-edited file is one line naming the file and the
field instead of a traceback halfway through a stage.

Strict types: a string where a number belongs is refused, not converted; a boolean is not a number. Fields the
evaluate stage does not read may be added freely (``extra="allow"``): a newer train stage's summary still reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, RootModel, ValidationError

from ampbench.errors import DataError

Number = float | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class SeedSummary(_Strict):
    run_id: str | None = None
    diverged: str | None = None
    checkpoint: str | None = None
    train_samples_per_s: Number = None
    timing_windows: int | None = None
    peak_memory_mb: Number = None
    train_seconds: Number = None
    skipped_steps_total: int = 0
    optimizer_steps_total: int = 0
    input_path: str | None = None
    input_wait_share: Number = None
    final: dict[str, float | str | None] = {}
    first_nonfinite: dict[str, Any] | None = None
    activations: list[dict[str, Any]] | None = None
    model_uri: str | None = None
    flops: dict[str, Any] | None = None
    evaluations: list[dict[str, float]] = []  # step, seconds, val_loss: what time to fp32's quality reads
    optimizer: dict[str, str] | None = None  # optimizers.describe: class, rounding, weight dtype
    state_bytes: dict[str, Any] | None = None  # optimizers.state_bytes: weights, gradients, optimizer state
    float8: dict[str, Any] | None = None  # float8.record: recipe, each Linear layer converted or not and why


class ArmSummary(_Strict):
    arm: str
    skipped: str | None
    hardware: dict[str, Any]
    model: dict[str, Any] | None = None
    diverged: dict[str, str] | None = None
    ablation: bool = False
    policy: dict[str, Any] = {}
    epochs: int | None = None
    world_size: int = 1
    seeds: dict[str, SeedSummary] = {}
    samples_per_s: Number = None
    peak_memory_mb: Number = None
    skipped_steps: int = 0
    optimizer_steps: int = 0
    input_path: str | None = None
    input_wait_share: Number = None
    flops: dict[str, Any] | None = None
    optimizer: dict[str, str] | None = None
    state_bytes: dict[str, Any] | None = None
    float8: dict[str, Any] | None = None
    first_nonfinite: dict[str, dict[str, Any]] = {}
    activations: list[dict[str, Any]] = []


class PreparedMeta(_Strict):
    dataset: str
    input_shape: list[int]  # [] for token streams
    sizes: dict[str, int]
    checksum: str
    kind: str | None = None  # "tokens" for text; images otherwise
    classes: list[str] = []
    scale: float | None = None
    mean: list[float] = []
    std: list[float] = []
    test_from: str | None = None  # "publisher" (the data set's own test split) | "test_fraction" (cut from the data)
    test_available: int | None = None  # the test split's size before prepare.max_test, in the unit of sizes


class _History(RootModel[dict[str, list[dict[str, float | None]]]]):  # seed -> its epochs' rows of numbers
    model_config = ConfigDict(strict=True)


def check(schema: type[BaseModel], raw: Any, path: Path, what: str, fix: str) -> Any:
    """``raw`` (a parsed JSON file) if it fits ``schema``; else one DataError naming ``path``, the first wrong
    field and what it holds, ``what`` the file should be and ``fix``."""
    try:
        schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "the top level"
        if err["type"] == "missing":
            raise DataError(f"{path}: field {field} is missing; not {what}; {fix}") from None
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        raise DataError(f"{path}: field {field}: {err['msg']} (holds {got}); not {what}; {fix}") from None
    return raw


def check_meta(raw: Any, path: Path) -> dict[str, Any]:
    meta = check(PreparedMeta, raw, path, "the meta.json the prepare stage wrote", "rerun prepare")
    if meta.get("kind") != "tokens":
        check(_ImageMeta, raw, path, "the meta.json the prepare stage wrote", "rerun prepare")
    return meta


class _ImageMeta(PreparedMeta):
    scale: float
    mean: list[float]
    std: list[float]


def check_history(raw: Any, path: Path, retrain: str) -> dict[str, Any]:
    check(_History, raw, path, "a history the train stage wrote", retrain)
    return raw


def check_summary(raw: Any, path: Path, arm: str, retrain: str) -> dict[str, Any]:
    """``raw`` (a parsed summary.json) if it has the shape and types above and belongs to ``arm``; else one
    DataError naming ``path``, the first wrong field and what it holds."""
    check(ArmSummary, raw, path, "a summary the train stage wrote", retrain)
    if raw["arm"] != arm:
        raise DataError(f"{path}: says it belongs to arm {raw['arm']!r}, but it is in {arm}'s folder; {retrain}")
    return raw
