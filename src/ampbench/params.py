"""The schema of params.yaml: one frozen model per section, validated before any work starts.

``load_params(path)`` reads and validates the whole file; a bad value raises ``ParamsError`` with one line that
names the key, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ampbench.errors import ParamsError

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "synthetic")
MODELS = ("small_cnn", "resnet18", "mlp")
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("constant", "cosine")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
ABLATIONS = ("fp16_noscaler", "fp16_pure", "bf16_pure")  # opt-in arms that show what goes wrong
BASELINE = "fp32"


class _Section(BaseModel):
    # extra="forbid" turns a typo such as `epoch:` into an error instead of a silently ignored key.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SyntheticParams(_Section):
    image_size: int = Field(32, ge=4, le=1024, description="height = width of the generated images, pixels")
    channels: int = Field(3, ge=1, le=16)
    classes: int = Field(10, ge=2, le=1000)
    count: int = Field(4096, ge=30, description="images generated in total, before the split")
    noise: float = Field(1.0, ge=0, description="std of the Gaussian noise added to each class prototype")


class PrepareParams(_Section):
    dataset: Literal[DATASETS] = "digits"
    download: bool = False
    seed: int = Field(0, ge=0)
    val_fraction: float = Field(0.15, gt=0, lt=0.5)
    test_fraction: float = Field(0.15, gt=0, lt=0.5)
    max_train: int | None = Field(None, ge=10, description="cap on the training split (None: all)")
    synthetic: SyntheticParams = SyntheticParams()


class GradScalerParams(_Section):
    """torch.amp.GradScaler's settings, used by the fp16 arm."""

    init_scale: float = Field(2.0**16, gt=0)
    growth_factor: float = Field(2.0, gt=1)
    backoff_factor: float = Field(0.5, gt=0, lt=1)
    growth_interval: int = Field(2000, ge=1)


class DivergenceParams(_Section):
    """When to stop an arm as diverged instead of training on garbage."""

    min_loss_scale: float = Field(1.0, gt=0, description="fp16: a loss scale below this means overflow every step")
    max_consecutive_skips: int = Field(50, ge=1, description="fp16: this many skipped steps in a row")


class TrainParams(_Section):
    precisions: list[Literal[PRECISIONS + ABLATIONS]] = Field(default_factory=lambda: list(PRECISIONS), min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    model: Literal[MODELS] = "small_cnn"
    width: int = Field(16, ge=1, le=4096, description="channels of the first conv / MLP units ÷ 8")
    optimizer: Literal[OPTIMIZERS] = "adamw"
    lr: float = Field(3e-3, gt=0, le=10)
    weight_decay: float = Field(1e-4, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    scheduler: Literal[SCHEDULERS] = "cosine"
    epochs: int = Field(8, ge=1)
    batch_size: int = Field(64, ge=1)
    deterministic: bool = True
    progress: bool = True
    clip_grad_norm: float | None = Field(None, gt=0, description="clip the true (unscaled) gradient norm")
    telemetry_every: int = Field(10, ge=1, description="steps between gradient underflow/overflow samples")
    loss_multiplier: float = Field(1.0, gt=0, description="< 1 pushes gradients toward fp16's underflow range")
    nproc_per_node: int = Field(1, ge=1, le=64, description="> 1: the train stage relaunches under torchrun (DDP)")
    channels_last: bool = Field(False, description="channels_last memory format (faster convs on tensor cores)")
    compile: bool = Field(False, description="torch.compile the model; compile time is reported separately")
    cudnn_benchmark: bool = Field(False, description="let cuDNN time kernels and pick the fastest (not deterministic)")
    grad_scaler: GradScalerParams = GradScalerParams()
    divergence: DivergenceParams = DivergenceParams()

    @model_validator(mode="after")
    def _consistent(self) -> TrainParams:
        if self.cudnn_benchmark and self.deterministic:
            raise ValueError("cudnn_benchmark: picks kernels by timing, which is not deterministic: "
                             "set train.deterministic: false to use it")
        if self.batch_size % self.nproc_per_node:
            raise ValueError(f"batch_size: {self.batch_size} does not split evenly over nproc_per_node="
                             f"{self.nproc_per_node} processes (it is the global batch)")
        return self

    @field_validator("precisions", "seeds")
    @classmethod
    def _unique(cls, value: list) -> list:
        if len(set(value)) != len(value):
            raise ValueError(f"entries must be unique, got {value}")
        return value


class MarginParams(_Section):
    """Equivalence margins: a difference whose whole 95% CI lies within ±margin counts as equivalent."""

    accuracy_pp: float = Field(0.5, ge=0, description="test accuracy, percentage points")
    loss: float = Field(0.02, ge=0, description="test cross-entropy, nats")


class EvaluateParams(_Section):
    batch_size: int = Field(1024, ge=1)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    calibration_bins: int = Field(15, ge=2)
    margin: MarginParams = MarginParams()


class MlflowParams(_Section):
    experiment: str = Field("ampbench", min_length=1)
    log_model: bool = True


class Params(_Section):
    prepare: PrepareParams = PrepareParams()
    train: TrainParams = TrainParams()
    evaluate: EvaluateParams = EvaluateParams()
    mlflow: MlflowParams = MlflowParams()

    @model_validator(mode="after")
    def _baseline_present(self) -> Params:
        if BASELINE not in self.train.precisions:
            raise ValueError(
                f"must include the {BASELINE} baseline: every arm is evaluated against it "
                f"(got {self.train.precisions})"
            )
        return self


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error["loc"]) or "params"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key (a typo?)"
    msg = error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"{where}: {msg}{shown}"


def validate(raw: dict[str, Any]) -> Params:
    """Validate a params mapping; raise ParamsError naming the first bad key."""
    try:
        return Params.model_validate(raw or {})
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        if not first["loc"]:  # whole-file check: attribute it to the key it is about
            first = {**first, "loc": ("train", "precisions")}
        elif first["loc"] == ("train",) and first["type"] == "value_error":  # "key: reason" from _consistent
            key, _, reason = first["msg"].removeprefix("Value error, ").partition(": ")
            first = {**first, "loc": ("train", key), "msg": reason, "input": {}}
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ParamsError(_describe(first) + more) from None


def load_params(path: str | Path) -> Params:
    """Read and validate a params.yaml file."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such params file") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if raw is not None and not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return validate(raw)
