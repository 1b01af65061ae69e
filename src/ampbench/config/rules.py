"""The rules that tie params keys together: values that are each valid alone but not together. One table
(``RULES``), run whole by the check stage (through ``validation.validate``, which every stage runs first), so a
combination no stage can honour stops ``dvc repro`` before any other stage works; the stages that need one rule's
answer for a value only they know (the device ``train.device: auto`` resolves to) call the same function.

A rule returns (key, reason) pairs; the key is the params key the user should change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ampbench.config.arms import ARMS, BASELINE, conflicts
from ampbench.config.params import DATASETS, IMAGE_MODELS, MODELS
from ampbench.config.user_code import FACTORY

if TYPE_CHECKING:  # the schema's types only: params.py imports nothing from here
    from ampbench.config.params import Params, SpeedParams

Problems = list[tuple[str, str]]


def model_kind(name: str) -> str:
    """The form of ``train.model``: builtin, torchvision (torchvision.<name>) or factory (package.module:callable);
    ValueError for anything else."""
    if name in MODELS:
        return "builtin"
    if name.startswith("torchvision.") and name.count(".") == 1 and name.removeprefix("torchvision.").isidentifier():
        return "torchvision"
    if FACTORY.match(name):
        return "factory"
    raise ValueError(f"{name!r} is none of: {' | '.join(MODELS)} | torchvision.<name> | package.module:callable")


TASKS = ("classification", "language_model")  # the built-in tasks (tasks/); or package.module:callable


def task_kind(name: str) -> str:
    """The form of ``train.task``: builtin (one of TASKS) or factory (package.module:callable); ValueError for
    anything else."""
    if name in TASKS:
        return "builtin"
    if FACTORY.match(name):
        return "factory"
    raise ValueError(f"{name!r} is none of: {' | '.join(TASKS)} | package.module:callable")


def dataset_kind(name: str) -> str:
    """The form of ``prepare.dataset``: builtin (one of DATASETS) or factory (package.module:callable);
    ValueError for anything else."""
    if name in DATASETS:
        return "builtin"
    if FACTORY.match(name):
        return "factory"
    raise ValueError(f"{name!r} is none of: {' | '.join(DATASETS)} | package.module:callable")


def size_problem(rounds: int, steps: int, window: int, warmup_steps: int,
                 seconds: float | None) -> tuple[str, str] | None:
    """(the size, what is wrong) for the first size of a speed measurement that cannot measure anything; None when
    all can. The speed params (``speed.<size>``) and the bench's options (``--<size>``) name the size their own
    way; a round's value is its fastest window after its first, so a round needs two windows."""
    for name, value, least in (("rounds", rounds, 1), ("steps", steps, 1), ("window", window, 1),
                               ("warmup_steps", warmup_steps, 0)):
        if value < least:
            return name, f"{value} is below {least}"
    if steps < 2 * window:
        return "steps", (f"{steps} is less than 2 × the window ({window}); a round's first window is not counted, "
                         "so a round needs two")
    if seconds is not None and not seconds > 0:
        return "seconds", f"{seconds} is not a positive number of seconds"
    return None


SPEED_KEYS = {"seconds": "seconds_per_arm"}  # a size's speed key, where the names differ


def speed_sizes(sp: SpeedParams) -> Problems:
    """The speed section as a measurement the speed stage can make (``size_problem``, named as speed keys)."""
    problem = size_problem(sp.rounds, sp.steps, sp.window, sp.warmup_steps, sp.seconds_per_arm)
    return [(f"speed.{SPEED_KEYS.get(problem[0], problem[0])}", problem[1])] if problem else []


def float8_needs_compile(precisions: list[str], compile_: bool, device_type: str | None) -> Problems:
    """fp8 arms on CUDA without torch.compile: torchao's float8 casts are fused by it; eager fp8 is slower than
    bf16, and comparing it with uncompiled arms would not be fair. ``device_type`` None: not known yet."""
    fp8 = [a for a in precisions if a in ARMS and ARMS[a].float8]
    if fp8 and device_type == "cuda" and not compile_:
        return [("train.compile", f"{', '.join(fp8)} on CUDA needs torch.compile (torchao's float8 recipe: eager "
                                  "float8 is slower than bf16); set -S train.compile=true, which compiles every arm "
                                  "alike")]
    return []


def _names(p: Params) -> Problems:
    problems = []
    for key, kind, value in (("prepare.dataset", dataset_kind, p.prepare.dataset),
                             ("train.task", task_kind, p.train.task), ("train.model", model_kind, p.train.model)):
        try:
            kind(value)
        except ValueError as exc:
            problems.append((key, str(exc)))
    return problems


def _model(p: Params) -> Problems:
    tp = p.train
    try:
        kind = model_kind(tp.model)
    except ValueError:
        return []  # said by _names
    problems = []
    if kind == "torchvision":
        why = _unknown_torchvision_name(tp.model.removeprefix("torchvision."))
        if why:
            problems.append(("train.model", why))
    if kind != "builtin" and tp.width is not None:
        problems.append(("train.width", f"sizes the built-in models only; set {tp.model}'s size in train.model_args"))
    return problems


def _unknown_torchvision_name(name: str) -> str | None:
    """Why torchvision.<name> is not one of torchvision's classification models (naming the closest), or None.
    Imports torchvision, so it runs only for such names."""
    import difflib

    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)  # classifiers only: no detection, video…
    if name in known:
        return None
    close = difflib.get_close_matches(name, known, n=4, cutoff=0.5)
    hint = f"closest: {', '.join(f'torchvision.{c}' for c in close)}" if close else f"{len(known)} are known"
    return f"torchvision has no classification model {name!r} ({hint})"


def _arms(p: Params) -> Problems:
    tp = p.train
    problems = conflicts(tp.precisions, tp.optimizer, tp.fp32_modules)
    if BASELINE not in tp.precisions:
        problems.append(("train.precisions", f"must include the {BASELINE} baseline: every arm is evaluated "
                                             f"against it (got {tp.precisions})"))
    for key in ("precisions", "seeds"):
        value = getattr(tp, key)
        if len(set(value)) != len(value):
            problems.append((f"train.{key}", f"entries must be unique, got {value}"))
    return problems + float8_needs_compile(tp.precisions, tp.compile, tp.device if tp.device != "auto" else None)


def _margins(p: Params) -> Problems:
    seeds = p.train.seeds
    return [(f"evaluate.margin.{key}", "auto derives the margin from fp32's seed-to-seed variation, which needs at "
                                       f"least 2 seeds in train.seeds (got {seeds})")
            for key in ("accuracy_pp", "loss") if getattr(p.evaluate.margin, key) == "auto" and len(seeds) < 2]


def _sequential(p: Params) -> Problems:
    """A sequential design's looks: train.seeds between its first and its last look; margins fixed in advance
    (an auto margin moves with every look, and the boundaries assume it does not)."""
    sq, seeds = p.evaluate.sequential, p.train.seeds
    if sq.max_seeds is None:
        return []
    if not sq.min_seeds <= len(seeds) <= sq.max_seeds:
        return [("train.seeds", f"{len(seeds)} seeds is no look of the sequential design from "
                                f"evaluate.sequential.min_seeds={sq.min_seeds} to max_seeds={sq.max_seeds}")]
    return [(f"evaluate.margin.{key}", "auto moves with every look of a sequential design; set a number")
            for key in ("accuracy_pp", "loss") if getattr(p.evaluate.margin, key) == "auto"]


def _batches(p: Params) -> Problems:
    tp, problems = p.train, []
    if tp.cudnn_benchmark and tp.deterministic:
        problems.append(("train.cudnn_benchmark", "picks kernels by timing, which is not deterministic: set "
                                                  "train.deterministic: false to use it"))
    if tp.batch_size < 2:
        problems.append(("train.batch_size", f"{tp.batch_size} trains nothing: batches of one sample are dropped "
                                             "(BatchNorm cannot train on them); use at least 2"))
    if tp.batch_size % tp.nproc_per_node:
        problems.append(("train.batch_size", f"{tp.batch_size} does not split evenly over nproc_per_node="
                                             f"{tp.nproc_per_node} processes (it is the global batch)"))
    return problems


def _task(p: Params) -> Problems:
    """Data, models and options of another task than train.task: image data or models and image-only options for
    a language model, text and token options for image classification."""
    tp, problems = p.train, []
    text, builtin_data = p.prepare.dataset == "text", p.prepare.dataset in DATASETS
    if tp.task == "language_model":
        if builtin_data and not text:
            problems.append(("prepare.dataset", f"{p.prepare.dataset!r} is image data; train.task: language_model "
                                                "trains on text (prepare.dataset: text)"))
        if tp.model in IMAGE_MODELS or tp.model.startswith("torchvision."):
            problems.append(("train.model", f"{tp.model!r} is an image classifier; a language model is gpt or your "
                                            "factory build(vocab_size, block_size, **train.model_args)"))
        for key, on in (("augment", tp.augment != "none"), ("channels_last", tp.channels_last)):
            if on:
                problems.append((f"train.{key}", "only means something for images, not for a language model's "
                                                 "token sequences; leave it at its default"))
    elif tp.task == "classification":
        if text:
            problems.append(("prepare.dataset", "text is for train.task: language_model (image classification "
                                                "needs images)"))
        if tp.model == "gpt":
            problems.append(("train.model", "gpt is a language model: set train.task: language_model"))
        if tp.block_size is not None:
            problems.append(("train.block_size", "only means something for train.task: language_model"))
    return problems


@dataclass(frozen=True)
class Rule:
    """One row of the table: what it guards (for the docs and the tests) and the check."""

    guards: str
    check: Callable[[Params], Problems]


RULES = (
    Rule("names: prepare.dataset, train.task and train.model are one of their forms", _names),
    Rule("train.model: a torchvision classifier that exists; train.width for the built-ins only", _model),
    Rule("train.task: the data, models and options of that task", _task),
    Rule("train.precisions: the fp32 baseline, unique arms and seeds, arms that can honour the optimizer, "
         "train.fp32_modules and (on CUDA) train.compile", _arms),
    Rule("evaluate.margin: auto needs two seeds", _margins),
    Rule("evaluate.sequential: train.seeds within its looks, margins set in advance", _sequential),
    Rule("train.batch_size: batches that train and split over the processes; no timing autotuner when "
         "deterministic", _batches),
    Rule("speed: sizes that measure (two windows a round)", lambda p: speed_sizes(p.speed)),
)


def problems(p: Params) -> Problems:
    """Every rule's problems, in the table's order. A rule that needs the device reads ``train.device``; for
    ``auto`` the check stage asks ``on_device`` once it has resolved it."""
    return [problem for rule in RULES for problem in rule.check(p)]


def device_dependent(p: Params) -> bool:
    """Whether a rule waits for the device ``train.device: auto`` resolves to (only then is torch worth importing
    in the check stage)."""
    return p.train.device == "auto" and any(a in ARMS and ARMS[a].float8 for a in p.train.precisions)


def on_device(p: Params, device_type: str) -> Problems:
    """The rules that depend on the device, for the device the stages will resolve ``train.device`` to."""
    return float8_needs_compile(p.train.precisions, p.train.compile, device_type)
