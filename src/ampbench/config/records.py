"""The schemas of the files one stage writes and the next reads: ``data/prepared/meta.json`` (prepare → train,
evaluate), ``models/<arm>/summary.json``, ``history.json`` and the final checkpoints' meta (train → evaluate),
``reports/interleaved.json`` (speed → evaluate). Every field the reader uses, with its type, checked before
anything is written, so a damaged or hand-edited file is one line naming the file and the field instead of a
traceback halfway through a stage; a field the code indexes has no default. Each of an arm's files says which arm
(and a checkpoint which seed) it belongs to, checked against where it was found. The checked objects are what the
evaluate stage and the report read (attributes, not keys); meta.json stays a dict, the form a Task's
``model_args(meta)`` receives.

Strict types: a string where a number belongs is refused, not converted; a boolean is not a number. Impossible
values are refused too: a summary's epochs below 1, a throughput that is not a positive finite number, a NaN, an
infinity or a negative memory, time, share or count. Fields the evaluate stage does not read may be added freely
(``extra="allow"``): a newer train stage's summary still reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampbench.errors import DataError

Number = float | None
# What training measured: JSON's NaN and Infinity parse as floats, and a hand edit can make anything negative.
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)] | None  # samples/s of an arm that trained
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)] | None  # MB, seconds, a share, FLOPs
Count = Annotated[int, Field(ge=0)]  # steps, windows, parameters
M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class SeedSummary(_Strict):
    run_id: str  # the seed's MLflow run, which evaluate attaches its test metrics to
    diverged: str | None = None
    checkpoint: str | None = None
    train_samples_per_s: Rate = None
    timing_windows: Count | None = None
    peak_memory_mb: Amount = None
    train_seconds: Amount = None
    skipped_steps_total: Count = 0
    optimizer_steps_total: Count = 0
    input_path: str | None = None
    input_wait_share: Amount = None
    final: dict[str, float | str | None] = {}
    first_nonfinite: dict[str, Any] | None = None
    activations: list[dict[str, Any]] | None = None
    model_uri: str | None = None
    flops: dict[str, Any] | None = None
    evaluations: list[dict[str, float]] = []  # step, seconds, val_loss: what time to fp32's quality reads
    optimizer: dict[str, str] | None = None  # optimizers.describe: class, rounding, weight dtype
    state_bytes: dict[str, Any] | None = None  # optimizers.state_bytes: weights, gradients, optimizer state
    float8: dict[str, Any] | None = None  # float8.record: recipe, each Linear layer converted or not and why
    device: str | None = None  # where it trained (stages.seed_record.where); absent in summaries from before it
    host: str | None = None
    node: str | None = None  # the Ray node of a cluster cell


class Hardware(_Strict):
    """The device fingerprint (``runtime.hardware.fingerprint``); the keys compared across arms may be absent."""

    device_name: str
    device_type: str
    cpu_16bit_flags: str = "none"  # CPUs: the 16-bit instructions it reports

    def get(self, key: str) -> Any:
        """A fingerprint key, None when this device has none (a CPU has no CUDA version)."""
        return self.model_dump().get(key)


class ModelRecord(_Strict):
    """What ``models.factory`` built: its name and arguments, its parameters and FLOPs per sample."""

    name: str
    parameters: Count
    flops_per_sample: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    kind: str | None = None
    width: int | None = None
    args: dict[str, Any] = {}


class ArmSummary(_Strict):
    arm: str
    skipped: str | None  # why the device could not run it; None: it ran
    hardware: Hardware
    model: ModelRecord | None = None  # None only for an arm skipped before its model was built
    diverged: dict[str, str] | None = None  # seed → why the guard stopped it
    ablation: bool = False
    policy: dict[str, Any] = {}
    epochs: Annotated[int, Field(ge=1)] | None = None
    world_size: Annotated[int, Field(ge=1)] = 1
    seeds: dict[str, SeedSummary] = {}
    samples_per_s: Rate = None
    peak_memory_mb: Amount = None
    skipped_steps: Count = 0
    optimizer_steps: Count = 0
    input_path: str | None = None
    input_wait_share: Amount = None
    flops: dict[str, Any] | None = None
    optimizer: dict[str, str] | None = None
    state_bytes: dict[str, Any] | None = None
    float8: dict[str, Any] | None = None
    framework: dict[str, Any] | None = None  # a framework's trainer: its precision setting and what was read back
    first_nonfinite: dict[str, dict[str, Any]] = {}
    activations: list[dict[str, Any]] = []

    @property
    def ran(self) -> bool:
        """Trained every seed to the end: neither skipped nor stopped by the divergence guard."""
        return self.skipped is None and not self.diverged


class ArmSpeed(_Strict):
    """One arm's row of the speed stage (``speed.ratios.summarise``): samples/s per round and their median, its
    ratio to fp32 (and tf32) round by round with the interval; the baseline has no ratio to itself."""

    rounds: list[float | None]
    samples_per_s: Number
    speedup_vs_fp32: Number = None
    speedup_vs_fp32_ci: list[float] | None = None
    speedup_vs_tf32: Number = None
    speedup_vs_tf32_ci: list[float] | None = None
    ratios: list[float] = []
    coverage: Number = None
    unstable: bool = False
    disagreeing_rounds: list[int] = []
    peak_memory_mb: Number = None  # with only this arm alive (CUDA); set from SpeedResult.memory


class SpeedResult(_Strict):
    device: str  # the device it ran on, which must be the one the arms trained on
    device_type: str
    params: dict[str, Any]
    arms: dict[str, ArmSpeed]
    skipped: dict[str, str] = {}
    budget: dict[str, dict[str, Any]] = {}
    memory: dict[str, Number] = {}

    def arm(self, name: str) -> ArmSpeed | None:
        """``name``'s row with its isolated peak memory, or None when the speed stage did not time it."""
        row = self.arms.get(name)
        return None if row is None else row.model_copy(update={"peak_memory_mb": self.memory.get(name)})


class PreparedMeta(_Strict):
    dataset: str
    input_shape: list[int]  # [] for token streams
    sizes: dict[str, int]
    checksum: str
    kind: str | None = None  # "tokens" for text; "inputs" for a LightningDataModule's batches; images otherwise
    classes: list[str] = []
    scale: float | None = None
    mean: list[float] = []
    std: list[float] = []
    test_from: str | None = None  # "publisher" (the data set's own test split) | "test_fraction" (cut from the data)
    test_available: int | None = None  # the test split's size before prepare.max_test, in the unit of sizes
    # Train's and validation's sizes before prepare.max_train / max_val, written where the cap cut the split (so
    # the default run's meta.json stays as it was); absent: not cut.
    train_available: int | None = None
    val_available: int | None = None


class _History(_Strict):
    arm: str  # the arm that wrote it: a history copied into another arm's folder is refused
    seeds: dict[str, list[dict[str, float | None]]]  # seed -> its epochs' rows of numbers


class CheckpointMeta(_Strict):
    """What a final checkpoint (``models/<arm>/seed<N>.pt``) says it is (``stages.outputs.SeedJob.model_meta``)."""

    arm: str
    seed: int
    model: dict[str, Any]  # models.factory.ModelSpec.to_meta(): what rebuilds the model
    task: str
    contract: dict[str, Any]  # what the model factory received (Task.model_args)
    policy: dict[str, Any] = {}


def check(schema: type[M], raw: Any, path: Path, what: str, fix: str) -> M:
    """``raw`` (a parsed JSON file) as a ``schema`` object; else one DataError naming ``path``, the first wrong
    field and what it holds, ``what`` the file should be and ``fix``."""
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "the top level"
        if err["type"] == "missing":
            raise DataError(f"{path}: field {field} is missing; not {what}; {fix}") from None
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        raise DataError(f"{path}: field {field}: {err['msg']} (holds {got}); not {what}; {fix}") from None


def check_meta(raw: Any, path: Path) -> dict[str, Any]:
    """``raw`` (meta.json) checked; returned as the dict it is, which a Task's ``model_args`` reads."""
    meta = check(PreparedMeta, raw, path, "the meta.json the prepare stage wrote", "rerun prepare")
    if meta.kind != "tokens":
        check(_ImageMeta, raw, path, "the meta.json the prepare stage wrote", "rerun prepare")
    return raw


class _ImageMeta(PreparedMeta):
    scale: float
    mean: list[float]
    std: list[float]


def check_history(raw: Any, path: Path, arm: str, retrain: str) -> dict[int, list[dict[str, float | None]]]:
    """``raw`` (history.json) of ``arm``, checked, as seed → its epochs' rows (the numbers as written: an epoch
    stays an int)."""
    history = check(_History, raw, path, "a history the train stage wrote", retrain)
    _belongs(path, "arm", history.arm, arm, retrain)
    return {int(seed): rows for seed, rows in raw["seeds"].items()}


def check_checkpoint(raw: Any, path: Path, arm: str, seed: int, retrain: str) -> CheckpointMeta:
    """``raw`` (a loaded final checkpoint's ``meta``) as the ``CheckpointMeta`` of ``arm``'s seed ``seed``: a
    checkpoint copied into another arm's folder, or renamed to another seed, is refused (it would be judged as that
    arm, or paired with another seed's baseline)."""
    meta = check(CheckpointMeta, raw, path, "a checkpoint the train stage wrote", retrain)
    _belongs(path, "arm", meta.arm, arm, retrain)
    _belongs(path, "seed", meta.seed, seed, retrain)
    return meta


def _belongs(path: Path, what: str, says: Any, found: Any, retrain: str) -> None:
    """One line when a file says it belongs to another arm or seed than where it was found."""
    if says != found:
        where = f"{found}'s folder" if what == "arm" else f"seed {found}'s file"
        raise DataError(f"{path}: says it belongs to {what} {says!r}, but it is in {where}; {retrain}")


def check_summary(raw: Any, path: Path, arm: str, retrain: str) -> ArmSummary:
    """``raw`` (a parsed summary.json) as an ``ArmSummary`` that belongs to ``arm``; else one DataError naming
    ``path``, the first wrong field and what it holds."""
    summary = check(ArmSummary, raw, path, "a summary the train stage wrote", retrain)
    _belongs(path, "arm", summary.arm, arm, retrain)
    if summary.skipped is None and summary.model is None:
        raise DataError(f"{path}: field model is missing; not a summary the train stage wrote; {retrain}")
    return summary


def check_speed(raw: Any, path: Path, arms: list[str], device_name: str, rerun: str) -> SpeedResult:
    """``raw`` (reports/interleaved.json) as a ``SpeedResult`` measured on the device the arms trained on, with
    every arm of ``arms`` timed or skipped."""
    result = check(SpeedResult, raw, path, "what the speed stage writes", rerun)
    if result.device != device_name:
        raise DataError(f"{path}: measured on {result.device!r}, but the arms trained on {device_name!r}; {rerun}")
    missing = [a for a in arms if a not in result.arms and a not in result.skipped]
    if missing:
        raise DataError(f"{path}: no timing for {', '.join(missing)} of train.precisions; {rerun}")
    return result
