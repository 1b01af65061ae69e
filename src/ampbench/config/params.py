"""The schema of params.yaml: one frozen dataclass per section, the single source of every default and comment.

Each key is declared once: its type, default, constraints and one-line doc (``knob``), and which stages read it
(default: the section's own stage). From this, ``sync`` writes params.yaml's comments and dvc.yaml's
``params:`` lists, and ``validation.load_params(path)`` validates a file (pydantic), raising ``ParamsError`` with
one line naming the key, the value and what is allowed. The classes are plain dataclasses so the training loop and the
bench take them as they are, also on a GPU box without pydantic (annotations are only evaluated to validate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from ampbench.config.arms import ABLATIONS, BASELINE, MAIN, NAMES, OPT_IN
from ampbench.config.knobs import _FORBID_EXTRA, SEED_MAX, _Section, at_least, knob, text  # noqa: F401

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "imagefolder", "synthetic", "text")  # or a factory
MODELS = ("small_cnn", "resnet18", "mlp", "vit_tiny", "gpt")  # the built-ins; see model_kind for the other forms
IMAGE_MODELS = MODELS[:4]  # for classification; gpt for the language model
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("constant", "cosine")
STAGES = ("prepare", "train", "speed", "evaluate")
# The stages that read each section unless a key says otherwise (mlflow: where runs are logged).
SECTION_STAGES = {"prepare": ("prepare",), "train": ("train",), "speed": ("speed",), "evaluate": ("evaluate",),
                  "mlflow": ("train", "evaluate")}
# The speed stage times every arm's training step, so it reads every train key that shapes a step (the input path
# too) — but not the run's length, its seeds or the progress bar. config/sync.py applies this to the train keys.
NOT_READ_BY_SPEED = ("train.seeds", "train.epochs", "train.progress", "train.nproc_per_node", "train.eval_every",
                     "train.keep_finished")


@dataclass(frozen=True)
class SyntheticParams(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    image_size: Annotated[int, knob("height = width of the generated images, pixels", ge=4, le=1024)] = 32
    channels: Annotated[int, knob("image channels", ge=1, le=16)] = 3
    classes: Annotated[int, knob("number of classes", ge=2, le=1000)] = 10
    count: Annotated[int, knob("images generated in total, before the split", ge=30, le=10_000_000)] = 4096
    noise: Annotated[float, knob("std of the Gaussian noise added to each class prototype", ge=0, le=1e6)] = 1.0


@dataclass(frozen=True)
class PrepareParams(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    dataset: Annotated[str, knob(
        "digits (ships with scikit-learn) | mnist | fashion_mnist | cifar10 (the publishers' files in raw_dir) | "
        "imagefolder (class folders in raw_dir) | synthetic | text (UTF-8 files in raw_dir, for train.task: "
        "language_model) | package.module:callable (your Datasets, docs/your-data.md; or your LightningDataModule, "
        "docs/your-framework.md)")] = "digits"
    raw_dir: Annotated[str, knob(
        "where raw data is read from, a dependency of prepare: the idx files / CIFAR tarball, or imagefolder's "
        "class folders (e.g. /usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist)",
        min_length=1)] = "data/raw"
    image_size: Annotated[int | None, knob(
        "imagefolder and your Datasets: resize every image to this square size, pixels (null: keep; all images "
        "must then be one size)", ge=4, le=4096)] = None
    dataset_args: Annotated[dict[str, Any], knob("keyword arguments for your dataset factory")] = field(
        default_factory=dict)
    dataset_code: Annotated[str, knob(
        "the file or folder with your dataset factory's code, a dependency of prepare (default: the built-in "
        "readers)", min_length=1)] = "src/ampbench/data/user_data.py"
    download: Annotated[bool, knob("torchvision sets: fetch into raw_dir when missing (needs network)")] = False
    seed: Annotated[int, knob("seeds the train/val/test split", ge=0, le=SEED_MAX)] = 0
    val_fraction: Annotated[float, knob("share of the data held out for validation", gt=0, lt=0.5)] = 0.1
    test_fraction: Annotated[float, knob("share held out for testing; ignored for data sets with an official "
                                         "test split", gt=0, lt=0.5)] = 0.25
    max_train: Annotated[int | None, knob("cap on training samples (text: its first tokens; null: all)", ge=10,
                                          le=10**9)] = None
    max_val: Annotated[int | None, knob(
        "cap on validation samples, a seeded random subset (text: its first tokens; null: all); validation runs "
        "several times an epoch: one far larger than training slows every epoch", ge=10, le=10**9)] = None
    max_test: Annotated[int | None, knob(
        "cap on test samples, a seeded random subset (text: its first tokens; null: all); fewer test samples "
        "widen the verdicts' intervals", ge=10, le=10**9)] = None
    synthetic: Annotated[SyntheticParams, knob("used when dataset: synthetic")] = field(
        default_factory=SyntheticParams)


@dataclass(frozen=True)
class GradScalerParams(_Section):
    """torch.amp.GradScaler's settings, used by arms with a scaler (fp16)."""

    __pydantic_config__ = _FORBID_EXTRA

    init_scale: Annotated[float, knob("loss scale to start from (finite in float32)", gt=0, le=2.0**127)] = 65536.0
    growth_factor: Annotated[float, knob("scale × this after growth_interval steps without inf/NaN", gt=1,
                                          le=2.0**16)] = 2.0
    backoff_factor: Annotated[float, knob("scale × this after a step with inf/NaN gradients", gt=0, lt=1)] = 0.5
    growth_interval: Annotated[int, knob("steps without inf/NaN before the scale grows", ge=1,
                                         le=10**9)] = 2000


@dataclass(frozen=True)
class DivergenceParams(_Section):
    """When to stop an arm as diverged instead of training on garbage."""

    __pydantic_config__ = _FORBID_EXTRA

    min_loss_scale: Annotated[float, knob("the fp16 loss scale fell below this: overflow on every step",
                                          gt=0)] = 1.0
    max_consecutive_skips: Annotated[int, knob("or this many optimizer steps in a row were skipped", ge=1,
                                                   le=10**9)] = 50


@dataclass(frozen=True)
class TrainParams(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    precisions: Annotated[list[Literal[NAMES]], knob(
        f"arms to train; {BASELINE} is the baseline and must stay. Opt-in: {', '.join(OPT_IN)} (pure bfloat16 "
        f"that trains, float8 Linear layers: docs/precision-arms.md); ablations: {', '.join(ABLATIONS)}",
        # Not a dependency of the train stages: dvc.yaml's matrix makes one stage per entry.
        stages=("evaluate",), min_length=1)] = field(default_factory=lambda: list(MAIN))
    seeds: Annotated[list[Annotated[int, at_least(0, SEED_MAX)]], knob(
        "each arm trains once per seed and is compared with fp32 of the same seed", stages=("train", "evaluate"),
        min_length=1, max_length=1000)] = field(
        default_factory=lambda: [0, 1, 2, 3, 4])
    device: Annotated[Literal["auto", "cpu", "cuda"], knob("auto (CUDA when present) | cuda | cpu",
                                                           stages=("train", "evaluate"))] = "auto"
    task: Annotated[str, knob(
        "what the model learns: classification (images → classes) | language_model (next byte of text; needs "
        "prepare.dataset: text) | package.module:callable (a callable returning your Task; docs/your-task.md)",
        stages=("train", "evaluate"), min_length=1)] = "classification"
    task_code: Annotated[str, knob(
        "the file or folder with train.task's code, a dependency of the train and evaluate stages: the default for "
        "the built-in tasks; your Task's module (or package folder) otherwise", stages=("train", "evaluate"),
        min_length=1)] = "src/ampbench/tasks/contract.py"
    block_size: Annotated[int | None, knob(
        "language_model: tokens per sequence (null: 64); a factory's model gets it as its block_size",
        stages=("train", "evaluate"), ge=2, le=2**20)] = None
    model: Annotated[str, knob(
        "small_cnn | resnet18 | mlp | vit_tiny | gpt (for language_model) | torchvision.<name> (any torchvision "
        "classifier, e.g. torchvision.mobilenet_v3_small) | package.module:callable (your factory; "
        "docs/your-model.md)",
        min_length=1)] = "small_cnn"
    model_args: Annotated[dict[str, Any], knob(
        "keyword arguments for the model: vit_tiny's patch_size, depth, heads, mlp_ratio; gpt's depth, heads, "
        "dropout; a torchvision builder's; your factory's")] = field(default_factory=dict)
    model_code: Annotated[str, knob(
        "the file or folder with train.model's code, a dependency of the train stages: the default for the "
        "built-ins and torchvision; your factory's module (or package folder) otherwise",
        stages=("train", "evaluate"), min_length=1)] = "src/ampbench/models/builtins.py"
    width: Annotated[int | None, knob(
        "built-ins only. small_cnn: channels of the first conv (null: 16); resnet18: of the stem and first stage, "
        "doubled per stage (null: 64); mlp: hidden units (null: 128); vit_tiny: embedding width (null: 64); gpt: "
        "embedding width (null: 128)",
        ge=1, le=4096)] = None
    framework: Annotated[Literal["ampbench", "lightning", "hf_trainer"], knob(
        "who trains: ampbench (the pipeline's loop, with the optimizer and schedule below) | lightning (your "
        "LightningModule, train.model = package.module:Class with train.model_args, through Lightning's Trainer "
        "and its precision plugins on the data of your LightningDataModule, prepare.dataset) | hf_trainer (your "
        "function that builds a transformers.Trainer, as both train.model and prepare.dataset, run with the arm's "
        "fp16/bf16/tf32 flags); the optimizer, schedule and batches are then your job's (docs/your-framework.md)",
        stages=("train",))] = "ampbench"
    optimizer: Annotated[Literal[OPTIMIZERS], knob("sgd | adam | adamw (bf16_sr: adamw only)")] = "adamw"
    lr: Annotated[float, knob("learning rate (the start of the cosine schedule)", gt=0, le=10)] = 0.003
    weight_decay: Annotated[float, knob("decoupled for adamw, L2 for sgd and adam", ge=0, le=10)] = 0.0001
    momentum: Annotated[float, knob("sgd only", ge=0, lt=1)] = 0.9
    scheduler: Annotated[Literal[SCHEDULERS], knob("constant | cosine (per epoch, to zero)")] = "cosine"
    epochs: Annotated[int, knob("passes over the training split", ge=1, le=100_000)] = 8
    batch_size: Annotated[int, knob("samples per optimizer step (the global batch under DDP)", ge=1, le=2**24,
                                    stages=("train", "evaluate"))] = 64
    augment: Annotated[Literal["none", "crop_flip"], knob(
        "none | crop_flip (zero-pad 4, random crop, horizontal flip: the CIFAR recipe; the same augmented batches "
        "for every arm of a seed)")] = "none"
    data_on_device: Annotated[bool | Literal["auto"], knob(
        "auto | true | false: keep the training split on the device (fast indexing) or stream it through a "
        "DataLoader; auto keeps it when it takes at most a quarter of the free device memory", stages=())] = "auto"
    loader_workers: Annotated[int, knob("DataLoader worker processes when streaming", ge=0, le=64,
                                        stages=())] = 2
    deterministic: Annotated[bool, knob("seed everything, deterministic kernels, cuDNN autotuning off")] = True
    progress: Annotated[bool, knob("tqdm bar per epoch (on a terminal)", stages=())] = True
    keep_finished: Annotated[bool, knob(
        "keep each finished seed's final training state in .resume/ once the arm is complete, so a run with more "
        "seeds reuses it instead of training it again (ampbench decide sets it; one checkpoint per seed on disk)",
        stages=())] = False
    nproc_per_node: Annotated[int, knob("> 1: DDP through torchrun (gloo on CPU, NCCL on CUDA)", ge=1,
                                        le=64)] = 1
    channels_last: Annotated[bool, knob("GPU: channels_last memory format (faster convs on tensor cores)")] = False
    compile: Annotated[bool, knob("torch.compile the model (first-epoch compile time reported apart)")] = False
    cudnn_benchmark: Annotated[bool, knob("cuDNN autotuning; needs deterministic: false")] = False
    clip_grad_norm: Annotated[float | None, knob("e.g. 1.0: clip the true (unscaled) gradient norm", gt=0,
                                                 le=1e12)] = None
    fp32_modules: Annotated[list[Annotated[str, text(500)]], knob(
        "module name patterns (e.g. [blocks.*.attn, head]) that 16-bit arms run in float32, outside autocast: the "
        "fix for a layer that overflows (the report names it and gives the -S line)", stages=("train", "evaluate"),
        max_length=1000)] = field(default_factory=list)
    telemetry_every: Annotated[int, knob("steps between sampled steps: gradient and activation ranges, the "
                                         "divergence check, the first non-finite module",
                                         ge=1, le=10**9)] = 10
    eval_every: Annotated[int | None, knob(
        "optimizer steps between validation losses within an epoch, for time to fp32's quality (null: four per "
        "epoch; 0: at epoch ends only); training is unchanged and the evaluations are not timed",
        stages=("train",), ge=0, le=10**9)] = None
    loss_multiplier: Annotated[float, knob("< 1 shrinks gradients toward fp16's underflow range (stress test of "
                                           "the scaler); reported losses stay unscaled", gt=0, le=1e6)] = 1.0
    grad_scaler: Annotated[GradScalerParams, knob("torch.amp.GradScaler settings (fp16 arm)")] = field(
        default_factory=GradScalerParams)
    divergence: Annotated[DivergenceParams, knob("stop an arm (run FAILED, comparison shows \"diverged\") when:")] = (
        field(default_factory=DivergenceParams))


@dataclass(frozen=True)
class MarginParams(_Section):
    """Equivalence margins: a difference whose whole confidence interval lies within ±margin counts as equivalent."""

    __pydantic_config__ = _FORBID_EXTRA

    accuracy_pp: Annotated[Annotated[float, at_least(0)] | Literal["auto"], knob(
        "|Δ test accuracy| in percentage points, or auto: fp32's seed-to-seed standard deviation of test accuracy "
        "(at least one test example; needs ≥ 2 seeds)")] = 0.5
    loss: Annotated[Annotated[float, at_least(0)] | Literal["auto"], knob(
        "|Δ test loss| in nats, or auto: fp32's seed-to-seed standard deviation of test loss")] = 0.02


@dataclass(frozen=True)
class SequentialParams(_Section):
    """Seeds until decided (``ampbench decide``): the looks, one per seed from min_seeds, and their boundaries."""

    __pydantic_config__ = _FORBID_EXTRA

    max_seeds: Annotated[int | None, knob(
        "null: the fixed design (every seed of train.seeds, one look). A number: train.seeds are the looks so far "
        "of a sequential design that stops at this many seeds at most (docs/verdict.md#seeds-until-decided)",
        ge=2, le=1000)] = None
    min_seeds: Annotated[int, knob("seeds at the first look", ge=2, le=1000)] = 3
    spending: Annotated[Literal["pocock", "obrien_fleming"], knob(
        "alpha-spending function: pocock (the error spread evenly over the looks: early stops) | obrien_fleming "
        "(almost none early: a last look nearly as strict as the fixed design's)")] = "pocock"
    until: Annotated[Literal["not_worse", "equivalent"], knob(
        "stop when every arm's deciding not-worse verdict is decided, or its equivalence verdict too")] = "not_worse"


@dataclass(frozen=True)
class EvaluateParams(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    batch_size: Annotated[int, knob("test samples per forward pass", ge=1, le=2**24)] = 1024
    confidence: Annotated[float, knob("of the paired intervals (per-example score interval and t over seeds)", gt=0.5,
                                      lt=1)] = 0.95
    calibration_bins: Annotated[int, knob("bins of the expected calibration error", ge=2, le=10_000)] = 15
    margin: Annotated[MarginParams, knob("equivalence margins for the verdicts")] = field(
        default_factory=MarginParams)
    sequential: Annotated[SequentialParams, knob("seeds until decided: set by ampbench decide")] = field(
        default_factory=SequentialParams)


@dataclass(frozen=True)
class SpeedParams(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    rounds: Annotated[int, knob("interleaved rounds after a warm-up round: every arm steps once per round, A B C "
                                "then C B A …, so a neighbour's load lands on all of them", ge=1, le=10_000)] = 9
    steps: Annotated[int, knob("optimizer steps per arm and round (at most: the budget may cut them)", ge=2,
                               le=10**6)] = 60
    window: Annotated[int, knob("steps per timing window (one device sync each); a round's first window is not "
                                "counted (it pays for starting the round)", ge=1, le=10**6)] = 10
    warmup_steps: Annotated[int, knob("steps per arm before any window counts (allocator, autotuning, caches)",
                                      ge=0, le=10**6)] = 10
    seconds_per_arm: Annotated[float | None, knob(
        "wall-time budget per arm for all it runs: two steps first whatever they cost, then the warm-up and the "
        "rounds as far as they fit (null: every round in full; fp16 autocast on some CPUs runs at 1% of fp32)", gt=0,
        le=10**6)] = 10.0


@dataclass(frozen=True)
class MlflowParams(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    # 256: the experiments table's name column (MLflow's own check allows 500; PostgreSQL and MySQL stores do not)
    experiment: Annotated[str, knob("MLflow experiment name", min_length=1, max_length=256)] = "ampbench"
    log_model: Annotated[bool, knob("mlflow.pytorch.log_model per run (loadable with mlflow.pytorch.load_model)",
                                    stages=("train",))] = True
    system_metrics_every: Annotated[float, knob(
        "seconds between MLflow system metrics samples per run (system/*: CPU, memory; GPU utilisation and "
        "memory on CUDA); 0: off", stages=(), ge=0, le=3600)] = 1.0


@dataclass(frozen=True)
class Params(_Section):
    __pydantic_config__ = _FORBID_EXTRA

    prepare: PrepareParams = field(default_factory=PrepareParams)
    train: TrainParams = field(default_factory=TrainParams)
    speed: SpeedParams = field(default_factory=SpeedParams)
    evaluate: EvaluateParams = field(default_factory=EvaluateParams)
    mlflow: MlflowParams = field(default_factory=MlflowParams)
