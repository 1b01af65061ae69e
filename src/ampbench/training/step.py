"""The tutorial's mixed-precision step, and the forward + loss every other part of the library reuses.

``train_step`` is exactly the seed tutorial's order: forward and loss inside ``policy.autocast()``;
``scaler.scale(loss).backward()``; ``scaler.step(optimizer)``; ``scaler.update()``. For arms without a scaler the
scaler is disabled and passes through, so there is one code path for every precision. ``forward_loss`` is the
forward half (the task says what the logits and the loss are: ``tasks/contract.py``), shared with the non-finite
replay and the FLOP count (``forward_backward`` runs it without the optimizer and without changing training). The
bench's bare loop keeps its own copy on purpose: it is the reference the pipeline's loop is timed against.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ampbench.config.params import TrainParams
from ampbench.precision.policy import PrecisionPolicy
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task
from ampbench.training.gradients import GradProbe


def forward_loss(model: nn.Module, policy: PrecisionPolicy, x: torch.Tensor, y: torch.Tensor,
                 task: Task = CLASSIFICATION) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, logits): the forward pass and the loss inside the policy's autocast, both still on the device."""
    with policy.autocast():
        logits = task.logits(model(x))
        loss = task.loss(logits, y)  # float32 for every arm (the *_pure arms' logits are 16-bit)
    return loss, logits


def train_step(model, optimizer, scaler, policy: PrecisionPolicy, x: torch.Tensor, y: torch.Tensor,
               tp: TrainParams, probe: GradProbe | None = None, task: Task = CLASSIFICATION):
    """One optimizer step, the tutorial's order. Returns (loss, logits), both still on the device.

    With clipping or a probe: scale → backward → ``unscale_`` → clip → step → update, so the clip threshold
    and the probe's "true" numbers apply to real gradients; ``step`` then skips its own unscaling.
    """
    optimizer.zero_grad(set_to_none=True)
    loss, logits = forward_loss(model, policy, x, y, task)
    scaler.scale(loss * tp.loss_multiplier).backward()  # scale up so small fp16 gradients survive
    if probe is not None:
        probe.sample(model, "scaled")  # what the scaler protects: gradients as backward left them
    if tp.clip_grad_norm is not None or probe is not None:
        scaler.unscale_(optimizer)  # true gradients from here on
        if probe is not None:
            probe.sample(model, "true")
        if tp.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tp.clip_grad_norm)
    scaler.step(optimizer)  # unscale (unless done above), then step unless inf/NaN
    scaler.update()  # adjust the scale factor
    return loss, logits


def forward_backward(model: nn.Module, policy: PrecisionPolicy, x: torch.Tensor, y: torch.Tensor, scale: float = 1.0,
                     loss_multiplier: float = 1.0, task: Task = CLASSIFICATION) -> torch.Tensor:
    """The training step's forward and backward (at loss scale ``scale``), without the optimizer: gradients are
    left in ``.grad``; returns the (unscaled) loss. Wrap it in ``side_effect_free`` to leave training as it was."""
    model.zero_grad(set_to_none=True)
    loss, _ = forward_loss(model, policy, x, y, task)
    (loss * loss_multiplier * scale).backward()
    return loss.detach()


@contextlib.contextmanager
def side_effect_free(model: nn.Module):
    """Run a forward/backward on ``model`` without changing training: random state forked (dropout), buffers
    (BatchNorm statistics) and gradients put back afterwards."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    grads = {p: p.grad for p in model.parameters()}
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(buffers[k])
        for p, g in grads.items():
            p.grad = g
