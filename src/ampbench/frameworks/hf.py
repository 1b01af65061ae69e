"""Your Hugging Face ``transformers.Trainer`` job, one arm at a time, with what ran read back.

``train.framework: hf_trainer``: ``train.model`` (and ``prepare.dataset``) name your function that builds the
Trainer (model, ``TrainingArguments``, datasets, collator, ``compute_metrics``), called with ``train.model_args``.
For each arm × seed the pipeline calls it after seeding, then trains a Trainer of the same parts whose arguments
differ only where the pipeline owns them: the arm's flags (``flags``: ``fp16``, ``bf16``, ``tf32``, from the arm's
``PrecisionPolicy``), ``seed`` and ``data_seed``, ``num_train_epochs``, the output folder, no reporting of its own
and no checkpoints of its own. One Callback (``ReadBack``) feeds ``readback.StepBook``: the epochs' records, what
every matmul computed in (the Trainer's flags are read back, never trusted), the loss scale.

The evaluation's data is the Trainer's own eval dataloader (``splits``): a causal LM's ``input_ids`` and ``labels``
(fixed-length blocks) become (tokens, next tokens); a classifier's inputs and ``labels`` stay as they are.

Imported only when the framework is chosen: ``import ampbench`` stays free of transformers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback

from ampbench.config.params import Params
from ampbench.data.datamodule import trainer_tensors
from ampbench.errors import ArmUnavailable, ModelError
from ampbench.frameworks.readback import StepBook
from ampbench.precision.policy import PrecisionPolicy

NAME = "Hugging Face Trainer"
OWN_CALLBACK_MODULES = ("transformers.trainer_callback", "transformers.integrations")  # the Trainer's defaults


def flags(policy: PrecisionPolicy) -> dict[str, bool]:
    """The TrainingArguments flags that mean ``policy``'s arm; ArmUnavailable for an arm the Trainer has none for."""
    if policy.float8_recipe or policy.optimizer_impl != "torch" or policy.param_dtype != torch.float32:
        raise ArmUnavailable(f"{policy.name}: the Hugging Face Trainer has no flag for it (its optimizer, float8 "
                             "and weight dtype are the Trainer's and your model's)")
    if policy.autocast_dtype == torch.float16 and not policy.use_scaler:
        raise ArmUnavailable(f"{policy.name}: the Trainer's fp16 always scales the loss")
    return {"fp16": policy.autocast_dtype == torch.float16, "bf16": policy.autocast_dtype == torch.bfloat16,
            "tf32": policy.tf32 if policy.device_type == "cuda" else None}


def precision_name(policy: PrecisionPolicy) -> str:
    """The arm's flags as the Trainer's arguments read."""
    on = [k for k, v in flags(policy).items() if v]
    return ", ".join(f"{k}=True" for k in on) or "fp16=False, bf16=False"


def check_arm(policy: PrecisionPolicy, params: Params) -> None:
    flags(policy)


def is_trainer(obj: Any) -> bool:
    return isinstance(obj, Trainer)


def _user_trainer(params: Params) -> Trainer:
    """``train.model(**train.model_args)``: the user's Trainer (ModelError otherwise, or when it reports to MLflow
    itself: its runs would land beside the pipeline's, outside its parent run)."""
    from ampbench.models.factory import ModelSpec, build_for

    built = build_for(ModelSpec.from_train(params.train), {}, whole=True)
    if not is_trainer(built):
        raise ModelError(f"train.model {params.train.model!r} built a {type(built).__name__}, not a "
                         "transformers.Trainer (train.framework: hf_trainer)")
    if "mlflow" in (built.args.report_to or []):
        raise ModelError(f"train.model {params.train.model!r}: TrainingArguments(report_to=[..., 'mlflow']) logs runs "
                         "of its own beside the pipeline's; set report_to='none' (the pipeline logs every arm × seed)")
    return built


def batches_per_pass(params: Params) -> int:
    """Batches in one pass over the Trainer's training dataloader."""
    return len(_user_trainer(params).get_train_dataloader())


def build(params: Params) -> tuple[torch.nn.Module, Trainer]:
    """The seed's model and the user's Trainer it came with (its datasets, collator, metrics)."""
    t = _user_trainer(params)
    return t.model, t


def test_split(t: Trainer) -> tuple[torch.Tensor, torch.Tensor]:
    return trainer_tensors(t.get_eval_dataloader(), "the Trainer", "eval")


class ReadBack(TrainerCallback):
    """The pipeline's one Callback on a Trainer's run: its events feed ``book`` (``StepBook``). The step's loss and
    examples come from the model's own output (``loss``, as Hugging Face models return it with labels), summed
    over the step's micro-batches."""

    def __init__(self, book: StepBook, validate: Any = None, on_epoch: Any = None):
        self.book, self.validate, self.on_epoch = book, validate, on_epoch
        self.trainer: Trainer | None = None  # set once the Trainer is built (its accelerator's scaler)
        self._loss, self._n, self._hook = 0.0, 0, None
        self.pending: Any = None  # the epoch's record, until the Trainer has written its checkpoint of the epoch
        self.saved: Path | None = None  # that checkpoint

    def _scaler(self) -> Any:
        return getattr(self.trainer.accelerator, "scaler", None) if self.trainer is not None else None

    def _seen(self, model: torch.nn.Module, args: Any, kwargs: dict, out: Any) -> None:
        loss = getattr(out, "loss", None) if not isinstance(out, dict) else out.get("loss")
        if model.training and isinstance(loss, torch.Tensor):
            x = kwargs.get("input_ids", kwargs.get("pixel_values", args[0] if args else None))
            n = len(x) if isinstance(x, torch.Tensor) else 1
            self._loss, self._n = self._loss + loss.detach().float() * n, self._n + n

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._hook = model.register_forward_hook(self._seen, with_kwargs=True)
        self.book.epoch_start(args.device, state.global_step)

    def on_train_end(self, args, state, control, **kw):
        if self._hook is not None:
            self._hook.remove()

    def on_epoch_begin(self, args, state, control, **kw):
        self.book.epoch_start(args.device, state.global_step)

    def on_step_begin(self, args, state, control, model=None, **kw):
        self._loss, self._n = 0.0, 0
        self.book.step_start(model, self._scaler())

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        self.book.grads(model)

    def on_step_end(self, args, state, control, **kw):
        loss = self._loss / self._n if self._n else None
        self.book.step_end(loss, self._n or 1, self._scaler(), state.global_step)

    def on_epoch_end(self, args, state, control, model=None, optimizer=None, **kw):
        if self.on_epoch is None:
            return None
        val = self.validate(model) if self.validate else (math.nan, math.nan)
        model.train()
        lr = float(optimizer.param_groups[0]["lr"]) if optimizer is not None else math.nan
        self.pending = self.book.record(round(state.epoch), state.global_step, val, self._scaler(), lr)
        control.should_save = True  # the Trainer writes its checkpoint of the epoch next, then calls on_save
        return control

    def on_save(self, args, state, control, **kw):
        if self.pending is not None:  # the epoch's record goes out with the checkpoint that ends it
            self.saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            record, self.pending = self.pending, None
            self.on_epoch(record, self)


def reseed(seed: int, epoch: int) -> None:
    """Python, NumPy and torch from (seed, epoch) alone (what the Trainer's own ``seed`` then re-seeds for its run)."""
    from transformers import set_seed

    set_seed(seed * 1_000_003 + epoch)


class Run:
    """One Trainer of the user's parts with the arm's flags (see the module docstring)."""

    def __init__(self, policy: PrecisionPolicy, params: Params, device: torch.device, epochs: int, book: StepBook,
                 module: torch.nn.Module, t: Trainer, seed: int, on_epoch: Any = None, validate: Any = None,
                 output_dir: Path | None = None, max_steps: int = -1):
        logging.getLogger("transformers.trainer").setLevel(logging.WARNING)
        # The Trainer's output_dir: where it writes its checkpoint of each epoch before ``save`` moves it (a scratch
        # folder for runs that keep none)
        self.output_dir = Path(output_dir or tempfile.mkdtemp(prefix="ampbench-hf-"))
        args = dataclasses.replace(
            t.args, output_dir=str(self.output_dir), num_train_epochs=epochs, max_steps=max_steps, seed=seed,
            data_seed=seed, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=device.type == "cpu",
            **{k: v for k, v in flags(policy).items() if v is not None})
        mine = [c for c in t.callback_handler.callbacks if not type(c).__module__.startswith(OWN_CALLBACK_MODULES)]
        self.readback = ReadBack(book, validate, on_epoch and (lambda record, _: on_epoch(record, self)))
        self.on_epoch = on_epoch
        self.trainer = Trainer(
            model=module, args=args, data_collator=t.data_collator, train_dataset=t.train_dataset,
            eval_dataset=t.eval_dataset, processing_class=t.processing_class, compute_metrics=t.compute_metrics,
            compute_loss_func=t.compute_loss_func, preprocess_logits_for_metrics=t.preprocess_logits_for_metrics,
            callbacks=[*mine, self.readback])
        # The stage prints a line per epoch of its own; the log dicts the Trainer prints without tqdm would
        # interleave with them.
        self.trainer.remove_callback(PrinterCallback)
        self.readback.trainer = self.trainer
        self.precision = precision_name(policy)

    def fit(self, checkpoint: Path | None = None) -> None:
        """Train, from the Trainer's own ``checkpoint`` of an epoch when given (its weights, optimizer, schedule,
        scaler, random states and progress)."""
        try:
            self.trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        finally:
            self.readback.book.close()
            shutil.rmtree(self.output_dir, ignore_errors=True)

    def save(self, path: Path) -> None:
        """The checkpoint the Trainer just wrote of the epoch, moved to ``path`` (a folder)."""
        shutil.rmtree(path, ignore_errors=True)
        os.replace(self.readback.saved, path)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.trainer.optimizer


class Arm:
    """One arm for the speed harness (``speed.harness.Runner``): each round a Trainer of ``steps`` steps on the same
    model (what it learns carries over, as rounds of the pipeline's loop do). The Trainer builds its optimizer again
    each round; a round's first window, which pays for that, is never counted."""

    def __init__(self, arm: str, policy: PrecisionPolicy, params: Params, device: torch.device,
                 module: torch.nn.Module, t: Trainer, float32: list[str]):
        self.arm, self.policy, self.params, self.device, self.module, self.t = arm, policy, params, device, module, t
        self.float32 = float32

    def round(self, steps: int, window: int) -> list[float]:
        self.policy.apply_backend_flags()
        book = StepBook(self.arm, self.policy, self.float32, every=10**9, window=window, warmup=0)
        Run(self.policy, self.params, self.device, 1, book, self.module, self.t, 0, max_steps=steps).fit()
        return book.all_windows
