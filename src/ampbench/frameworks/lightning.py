"""Your LightningModule trained by Lightning's own Trainer, one arm at a time, with what ran read back.

``train.framework: lightning``: ``train.model`` is the module's class (built with ``train.model_args``),
``prepare.dataset`` the LightningDataModule's (built with ``prepare.dataset_args``). Every seed trains through the
module's ``training_step`` and ``configure_optimizers`` on the datamodule's loaders, under the Lightning precision
plugin that means the arm (``plugin``: derived from the arm's ``PrecisionPolicy``, so the precision decision stays
in one place). What the pipeline adds is one Callback, ``ReadBack``, which feeds ``readback.StepBook``: the epochs'
records, what every matmul computed in, and a one-line refusal of an arm that ran as something else.
``LightningArm`` steps an arm for the speed stage's harness.

Imported only when the framework is chosen: ``import ampbench`` stays free of Lightning.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision

from ampbench.config.params import GradScalerParams, Params
from ampbench.errors import AmpbenchError, ArmUnavailable, DataError, ModelError, ParamsError
from ampbench.frameworks.readback import StepBook, batch_size
from ampbench.precision.policy import PrecisionPolicy

# Lightning 2.6 calls a torch.utils._pytree API that torch 2.14 deprecates, on every fit: not the user's to fix.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=DeprecationWarning)

NAMES = {"32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}


def plugin(policy: PrecisionPolicy, scaler: GradScalerParams) -> Precision:
    """The Lightning precision plugin that means ``policy``'s arm; ArmUnavailable for an arm Lightning has no
    plugin for. Built by hand, not from a ``precision=`` string: Lightning replaces ``16-mixed`` by ``bf16-mixed``
    on the CPU with only a warning, and the fp16 arm would run as bf16."""
    if policy.float8_recipe:
        raise ArmUnavailable(f"{policy.name}: float8 under Lightning needs its Transformer Engine plugin, which "
                             "does not run torchao's float8 recipes")
    if policy.optimizer_impl != "torch":
        raise ArmUnavailable(f"{policy.name} replaces the optimizer ({policy.optimizer_impl}), which your "
                             "module's configure_optimizers owns under Lightning")
    if policy.param_dtype != torch.float32:
        return HalfPrecision("bf16-true" if policy.param_dtype == torch.bfloat16 else "16-true")
    if policy.autocast_dtype is None:
        return Precision()  # 32-true; tf32 is the backend flags the policy sets for every arm
    if policy.autocast_dtype == torch.bfloat16:
        return MixedPrecision("bf16-mixed", policy.device_type)
    if not policy.use_scaler:
        raise ArmUnavailable(f"{policy.name}: Lightning's 16-mixed always scales the loss")
    return MixedPrecision("16-mixed", policy.device_type, scaler=policy.grad_scaler(scaler))


def plugin_name(p: Precision) -> str:
    """The Trainer ``precision`` string the plugin stands for."""
    return getattr(p, "precision", "32-true")


class ReadBack(L.Callback):
    """The pipeline's one Callback on a Lightning run: its hooks feed ``book`` (a ``StepBook``). ``validate(module)``
    gives (val_loss, val_accuracy); ``on_epoch(record, trainer)`` receives each epoch."""

    def __init__(self, book: StepBook, seed: int, validate: Any = None, on_epoch: Any = None):
        self.book, self.seed, self.validate, self.on_epoch = book, seed, validate, on_epoch
        self.interrupt: KeyboardInterrupt | None = None  # what Lightning turned into an exit, given back by ``fit``

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.book.epoch_start(trainer.strategy.root_device, trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.book.epoch_start(trainer.strategy.root_device, trainer.global_step)

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, i: int) -> None:
        self.book.step_start(module, getattr(trainer.precision_plugin, "scaler", None))

    def on_before_optimizer_step(self, trainer: L.Trainer, module: L.LightningModule, optimizer: Any) -> None:
        self.book.grads(module)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any,
                           i: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            # Lightning hands a None return on as an empty dict, skipping the batch with only a warning
            got = "None" if outputs is None or outputs == {} else f"a {type(outputs).__name__} without 'loss'"
            raise AmpbenchError(f"train.model: training_step returned {got}; it must return the loss (a tensor, or "
                                "a dict with 'loss') for every batch, or that batch trains nothing")
        self.book.step_end(loss, batch_size(batch), getattr(trainer.precision_plugin, "scaler", None),
                           trainer.global_step)

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException) -> None:
        self.interrupt = exception if isinstance(exception, KeyboardInterrupt) else None

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.on_epoch is None:
            return
        val = self.validate(module) if self.validate else (math.nan, math.nan)
        module.train()
        optimizers = trainer.optimizers
        lr = float(optimizers[0].param_groups[0]["lr"]) if optimizers else math.nan
        self.on_epoch(self.book.record(trainer.current_epoch + 1, trainer.global_step, val,
                                       getattr(trainer.precision_plugin, "scaler", None), lr), trainer)
        reseed(self.seed, trainer.current_epoch + 1)


def reseed(seed: int, epoch: int) -> None:
    """Every random draw of epoch ``epoch`` (the loaders' shuffle, their workers, dropout) from (seed, epoch) alone:
    what makes a run resumed from an epoch's checkpoint train exactly as one that never stopped (Lightning's
    checkpoints hold no random state)."""
    L.seed_everything(seed * 1_000_003 + epoch, workers=True, verbose=False)


def trainer(policy: PrecisionPolicy, scaler: GradScalerParams, device: torch.device, epochs: int,
            deterministic: bool, callback: ReadBack, **limits: Any) -> L.Trainer:
    """A Trainer for one run of one arm: the arm's plugin, no logger or checkpointing of its own (the pipeline
    logs to MLflow and checkpoints into .resume/), no progress bar (the stage prints a line per epoch)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # the accelerator banner on every run
    return L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu",
                     devices=[device.index or 0] if device.type == "cuda" else 1,
                     plugins=[plugin(policy, scaler)], max_epochs=epochs, deterministic=deterministic,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[callback], **limits)


def fit(trainer_: L.Trainer, module: L.LightningModule, datamodule: Any, ckpt_path: Path | None = None) -> None:
    """``trainer.fit``, with an interruption kept an interruption (Lightning answers a KeyboardInterrupt by
    ignoring SIGINT and exiting 1, which would skip the stage's line and its exit status 130) and Lightning's
    refusals of the user's code as one line (ModelError)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from ampbench.config.user_code import first_line
    from ampbench.errors import ModelError

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    readback = next((c for c in trainer_.callbacks if isinstance(c, ReadBack)), None)
    try:
        trainer_.fit(module, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path else None)
    except SystemExit:
        if readback is None or readback.interrupt is None:
            raise
        raise readback.interrupt from None
    except MisconfigurationException as exc:
        raise ModelError(f"Lightning refused train.model {type(module).__name__}: {first_line(exc)}") from None
    finally:
        if readback is not None:
            readback.book.close()
        for s, h in handlers.items():
            if h is not None:
                signal.signal(s, h)


NAME = "Lightning"


def check_arm(policy: PrecisionPolicy, params: Params) -> None:
    """ArmUnavailable (the arm is recorded as skipped, with why) when Lightning has no plugin for the arm."""
    plugin(policy, params.train.grad_scaler)


def precision_name(policy: PrecisionPolicy) -> str:
    return plugin_name(plugin(policy, GradScalerParams()))


def build(params: Params) -> tuple[L.LightningModule, Any]:
    """``train.model(**train.model_args)``, a LightningModule, and ``prepare.dataset(**prepare.dataset_args)``, the
    LightningDataModule prepare read the splits from (ModelError, DataError, ParamsError otherwise)."""
    from ampbench.config.user_code import first_line, import_callable
    from ampbench.data.datamodule import is_datamodule
    from ampbench.models.factory import ModelSpec, build_for

    module = build_for(ModelSpec.from_train(params.train), {})
    if not isinstance(module, L.LightningModule):
        raise ModelError(f"train.model {params.train.model!r} built a {type(module).__name__}, not a "
                         "LightningModule (train.framework: lightning)")
    p = params.prepare
    try:
        dm = import_callable(p.dataset, "prepare.dataset", DataError)(**p.dataset_args)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"prepare.dataset {p.dataset!r}: calling it failed ({type(exc).__name__}: "
                        f"{first_line(exc)})") from None
    if not is_datamodule(dm):
        raise ParamsError(f"train.framework: lightning trains on a LightningDataModule; prepare.dataset "
                          f"{p.dataset!r} gives a {type(dm).__name__}")
    return module, dm


def test_split(dm: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The datamodule's test split as its loader gives it now."""
    from ampbench.data.datamodule import loader_tensors

    if callable(getattr(dm, "prepare_data", None)):
        dm.prepare_data()
    dm.setup("test")
    return loader_tensors(dm.test_dataloader, "the datamodule's test_dataloader")


def batches_per_pass(params: Params) -> int:
    """Batches in one pass over the datamodule's training loader."""
    dm = build(params)[1]
    if callable(getattr(dm, "prepare_data", None)):
        dm.prepare_data()
    dm.setup("fit")
    return len(dm.train_dataloader())


class Run:
    """One Trainer of an arm on the user's module and datamodule, read back into ``book``; ``on_epoch(record,
    run)`` receives each epoch (``run.save`` writes Lightning's checkpoint of it)."""

    def __init__(self, policy: PrecisionPolicy, params: Params, device: torch.device, epochs: int, book: StepBook,
                 module: L.LightningModule, dm: Any, seed: int, on_epoch: Any = None, validate: Any = None,
                 output_dir: Path | None = None, **limits: Any):
        self.readback = ReadBack(book, seed, validate, on_epoch and (lambda record, _: on_epoch(record, self)))
        self.trainer = trainer(policy, params.train.grad_scaler, device, epochs, params.train.deterministic,
                               self.readback, **limits)
        self.module, self.dm = module, dm
        self.precision = precision_name(policy)

    def fit(self, checkpoint: Path | None = None) -> None:
        fit(self.trainer, self.module, self.dm, checkpoint)

    def save(self, path: Path) -> None:
        save(self.trainer, path)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.trainer.optimizers[0] if self.trainer.optimizers else None


class Arm:
    """One arm for the speed harness (``speed.harness.Runner``): each round a Trainer of ``steps`` steps over the
    datamodule's training loader, on the same module (what it learns carries over, as rounds of the pipeline's
    loop do), read back as training is. Lightning builds the optimizer again each round (its
    ``configure_optimizers``); a round's first window, which pays for that, is never counted."""

    def __init__(self, arm: str, policy: PrecisionPolicy, params: Params, device: torch.device,
                 module: L.LightningModule, dm: Any, float32: list[str]):
        self.arm, self.policy, self.params, self.device, self.module, self.dm = arm, policy, params, device, module, dm
        self.float32 = float32

    def round(self, steps: int, window: int) -> list[float]:
        """Samples/s of each window of ``window`` steps in ``steps`` steps."""
        self.policy.apply_backend_flags()
        book = StepBook(self.arm, self.policy, self.float32, every=10**9, window=window, warmup=0)
        Run(self.policy, self.params, self.device, -1, book, self.module, self.dm, 0, max_steps=steps,
            limit_val_batches=0, num_sanity_val_steps=0).fit()
        return book.all_windows


def save(trainer_: L.Trainer, path: Path) -> None:
    """Lightning's own checkpoint of the run (weights, optimizers, schedulers, scaler, loops), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    trainer_.save_checkpoint(tmp)
    os.replace(tmp, path)
