"""The training loop: the tutorial's mixed-precision step (``step.train_step``) over epochs, reporting by callback.

``fit`` is the recipe: for each epoch, for each batch, one step between the calls of two watchers
(``watchers.py``: numerics and speed); then the LR schedule, validation and one ``EpochRecord`` (``state.py``). It
never branches on precision: the ``PrecisionPolicy`` hands it the autocast context and the scaler. Its settings are
the validated ``train`` params, passed whole (``LoopConfig.train``). Batches come from ``data.loader.InputPipeline``
(device-resident tensors or a streaming DataLoader, the same batches either way); running sums stay on the device
and are read once per epoch (no per-step host sync).
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch
from torch import nn

from ampbench.config.params import TrainParams
from ampbench.data.loader import InputPipeline, keep_on_device
from ampbench.data.splits import Split
from ampbench.models.builtins import unwrap
from ampbench.precision.policy import PrecisionPolicy
from ampbench.runtime import distributed, signals
from ampbench.runtime.distributed import SINGLE, World
from ampbench.tasks.contract import Task
from ampbench.training.state import EpochRecord, LoopConfig, TrainState
from ampbench.training.step import train_step
from ampbench.training.watchers import NumericsWatch, SpeedWatch


def throughput(records: list[EpochRecord]) -> float:
    """Median samples/s over the timing windows after warm-up; per-epoch rates (first epoch excluded) when the
    run was too short for a single window."""
    windows = [w for r in records for w in r.windows]
    if windows:
        return statistics.median(windows)
    rates = [r.samples_per_s for r in records]
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def make_scheduler(name: str, optimizer: torch.optim.Optimizer, epochs: int):
    """Per-epoch LR schedule: ``constant`` or ``cosine`` (to zero over ``epochs``)."""
    if name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    if name == "constant":
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    raise ValueError(f"unknown scheduler {name!r}")


def init_state(model: nn.Module, policy: PrecisionPolicy, cfg: LoopConfig, device: torch.device) -> TrainState:
    """Fresh optimizer, scheduler, scaler and data-order generator for ``model`` (already on ``device``)."""
    tp = cfg.train
    optimizer = policy.make_optimizer(tp, model.parameters(), device)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=make_scheduler(tp.scheduler, optimizer, cfg.end_epoch),
        scaler=policy.grad_scaler(tp.grad_scaler),
        generator=torch.Generator().manual_seed(cfg.seed),
    )


def memory_format(tp: TrainParams) -> torch.memory_format:
    """train.channels_last as a torch memory format (for the model and its inputs)."""
    return torch.channels_last if tp.channels_last else torch.contiguous_format


def build_run(tp: TrainParams, policy: PrecisionPolicy, contract: dict, device: torch.device, seed: int,
              train: Split, task: Task, **measure) -> tuple[nn.Module, TrainState, LoopConfig]:
    """Seeded, deterministic (if asked) model and fresh training state: what the train stage trains once per seed
    and the speed stage times. ``measure``: LoopConfig's fields for measuring (warm-up, window, epochs, bar)."""
    from ampbench.models.factory import ModelSpec, build_for
    from ampbench.runtime.determinism import seed_everything, set_deterministic

    seed_everything(seed)
    set_deterministic(tp.deterministic, tp.cudnn_benchmark, tp.compile)
    policy.apply_backend_flags()
    model = policy.prepare_model(build_for(ModelSpec.from_train(tp), contract).to(device).to(
        memory_format=memory_format(tp)))
    cfg = LoopConfig(train=tp, seed=seed, on_device=keep_on_device(tp.data_on_device, train, device), task=task,
                     **measure)
    return model, init_state(model, policy, cfg, device), cfg


class EpochSums:
    """One epoch's running loss and accuracy sums, kept on the device (summed over ranks at the end)."""

    def __init__(self, device: torch.device, task: Task):
        self.task = task
        self.loss = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device, dtype=torch.int64)
        self.seen = 0  # global samples
        self.units_per_sample = 1  # what accuracy counts: 1 per image, block_size per token sequence

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, global_batch: int) -> None:
        self.loss += loss.detach().float() * len(y)
        right, units = self.task.correct(logits, y)
        self.correct += right
        self.seen += global_batch
        self.units_per_sample = units // len(y)

    def reduce(self, world: World) -> tuple[float, float]:
        """(mean loss, accuracy) over every rank's share of the epoch."""
        distributed.sum_(self.loss, world)
        distributed.sum_(self.correct, world)
        n = max(self.seen, 1)
        return (self.loss / n).item(), self.correct.item() / (n * self.units_per_sample)


def input_pipeline(train: Split, policy: PrecisionPolicy, cfg: LoopConfig, device: torch.device,
                   world: World) -> InputPipeline:
    """The run's batches: on the device or streamed (``cfg.on_device``, else ``train.data_on_device``)."""
    tp = cfg.train
    on_device = cfg.on_device if cfg.on_device is not None else keep_on_device(tp.data_on_device, train, device)
    return InputPipeline(train, device, on_device=on_device, batch_size=tp.batch_size, augment=tp.augment,
                         seed=cfg.seed, cast=policy.cast_input,
                         memory_format=torch.channels_last if tp.channels_last else torch.contiguous_format,
                         workers=tp.loader_workers, world=world)


def fit(state: TrainState, train: Split, val: Split, policy: PrecisionPolicy, cfg: LoopConfig,
        on_epoch: Callable[[EpochRecord, TrainState], None] | None = None,
        world: World = SINGLE) -> list[EpochRecord]:
    """Train ``state.model`` from ``state.epoch`` (> 0: resumed from a checkpoint, continuing exactly where it
    stopped) to ``cfg.end_epoch`` (``train.epochs``); call ``on_epoch(record, state)`` after each epoch; return the
    records. Under DDP (``world``) every rank walks the same global batches and trains on its slice of each."""
    tp, model = cfg.train, state.model
    device = next(unwrap(model).parameters()).device
    inputs = input_pipeline(train, policy, cfg, device, world)
    numerics = NumericsWatch(unwrap(model), policy, state.scaler, cfg, device)
    speed = SpeedWatch(device, cfg, len(train))
    records = []
    for epoch in range(state.epoch, cfg.end_epoch):
        model.train()
        sums = EpochSums(device, cfg.task)
        numerics.epoch_start(epoch, state.step)
        speed.epoch_start(f"{policy.name} seed{cfg.seed} epoch {epoch + 1}/{cfg.end_epoch}")
        evaluations, first = [], state.step
        for batch in inputs.epoch(state.generator, state.step):
            signals.checkpoint()  # a signal whose KeyboardInterrupt a finalizer swallowed stops the loop here
            if cfg.eval_every and state.step > first and state.step % cfg.eval_every == 0:  # not at the epoch's end
                with speed.paused() as seconds:
                    val_loss = cfg.task.validate(model, val, policy, cfg.eval_batch_size)[0]
                    model.train()  # whatever a task's validate left it in, training goes on in training mode
                evaluations.append({"step": state.step, "seconds": seconds, "val_loss": val_loss})
            with numerics.step(state.step) as probe:  # skip counting; on sampled steps hooks and probes
                loss, logits = train_step(model, state.optimizer, state.scaler, policy, batch.x, batch.y, tp, probe,
                                          cfg.task)
                sums.add(loss, logits, batch.y, batch.size)
            state.step += 1
            speed.after_step(batch.size, loss, state.step)
            numerics.after_step(state.step, batch, loss, sums.loss, logits)  # blame bad steps; check divergence
        seconds = speed.epoch_end()
        if numerics.stepped(state.step):  # the LR schedule advances only when the optimizer really stepped
            state.scheduler.step()
        state.epoch = epoch + 1
        numerics.check(state.step, sums.loss)
        val_scores = cfg.task.validate(model, val, policy, cfg.eval_batch_size)
        evaluations.append({"step": state.step, "seconds": seconds, "val_loss": val_scores[0]})
        records.append(_record(state, sums, val_scores, seconds, world, numerics, speed, inputs, evaluations))
        if on_epoch is not None:
            on_epoch(records[-1], state)
    return records


def _record(state: TrainState, sums: EpochSums, val: tuple[float, float], seconds: float, world: World,
            numerics: NumericsWatch, speed: SpeedWatch, inputs: InputPipeline,
            evaluations: list[dict[str, float]]) -> EpochRecord:
    """The epoch just trained as one record; the watchers start a fresh epoch."""
    train_loss, train_accuracy = sums.reduce(world)
    n = numerics.take()
    return EpochRecord(epoch=state.epoch, train_loss=train_loss, train_accuracy=train_accuracy, val_loss=val[0],
                       val_accuracy=val[1], samples_per_s=sums.seen / seconds, epoch_seconds=seconds,
                       optimizer_steps=state.step - numerics.first_step, input_wait_seconds=inputs.wait_seconds,
                       lr=float(state.optimizer.param_groups[0]["lr"]),  # a tensor in torchao's optimizer
                       windows=speed.take(), evaluations=evaluations, **n)
