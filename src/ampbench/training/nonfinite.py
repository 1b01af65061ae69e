"""The first module that went non-finite: which hooked step to blame, the hunt for uncaught skips, and a replay.

``NonFiniteFinder`` reads the ``ActivationProbe``'s per-step flags after each hooked step; when the sampled check
sees skips no hooked step caught, it hooks the next steps too (a hunt); at divergence with nothing caught,
``replay_first_nonfinite`` replays the batch through the unwrapped model with the probe attached (random state
forked, buffers and gradients put back, no optimizer step: ``step.side_effect_free``).

A non-finite loss whose model outputs were finite is the task's loss's doing, not a module's: it is named as such
(phase ``loss``), from a hooked step, a replay, or, for arms without a scaler (whose first bad step also ruins the
weights, so no later replay can tell), a check of every step's loss kept on the device (``watch_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ampbench.errors import Diverged
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task
from ampbench.training.activations import ROOT, ActivationProbe
from ampbench.training.step import forward_backward, side_effect_free


@dataclass(frozen=True)
class Culprit:
    """The first module whose output (forward), input gradient (backward) or weight gradient was not finite in one
    step, or whose weights already were not."""

    module: str
    module_type: str
    phase: str  # forward | backward | weight_grad | weights (already non-finite before the step) | loss | none
    step: int  # optimizer step (1-based over the run)
    loss_scale: float  # the scale the step ran with (1.0 without a scaler)
    how: str  # "sampled step" | "replayed step" | "per-step loss check"

    def __str__(self) -> str:
        if self.phase == "none":
            return f"no non-finite value in a replay of step {self.step}"
        if self.phase == "loss":
            return (f"first non-finite value in the loss at step {self.step}, the model's outputs finite: the task's "
                    f"loss ({self.module_type}) made it, not a module of the model (a log of 0, a division by 0, a "
                    "mean over nothing?)")
        what = {"forward": "output", "backward": "input gradient (its backward)", "weight_grad": "weight gradient",
                "weights": "weights"}[self.phase]
        scale = f", loss scale {self.loss_scale:g}" if self.loss_scale != 1.0 else ""
        return f"first non-finite {what} in module '{self.module}' ({self.module_type}) at step {self.step}{scale}"

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "module_type": self.module_type, "phase": self.phase, "step": self.step,
                "loss_scale": self.loss_scale, "how": self.how, "message": str(self)}


class NonFiniteFinder:
    """Which module went non-finite first, per epoch, from the steps the probe was attached to.

    Sampled steps are hooked anyway; a bad one (skipped by the scaler, or a non-finite loss) names its culprit
    from its own hooks. When the sampled check sees skips that no hooked step caught, the next ``hunt_steps``
    steps are hooked too, so a recurring overflow is caught in the act. At divergence with nothing caught, the
    current batch is replayed (``replay_first_nonfinite``).
    """

    def __init__(self, hunt_steps: int):
        self.hunt_steps = hunt_steps
        self.hunting_left = 0
        self.caught = 0  # bad hooked steps this epoch
        self.first: Culprit | None = None  # this epoch's first culprit
        self.run_first: Culprit | None = None  # the first of the whole run (this process)
        self.first_bad: torch.Tensor | None = None  # watch_loss: 2 × the first bad loss's step + outputs finite

    def watch_loss(self, loss: torch.Tensor, logits: torch.Tensor, step: int) -> None:
        """After every step of an arm without a scaler, on the device: the step of the run's first non-finite loss
        and whether the model's outputs were finite then (its first bad step ruins the weights: no replay can tell
        the loss from the model afterwards)."""
        code = ~torch.isfinite(loss.detach()) * (2 * step + torch.isfinite(logits.detach()).all())
        self.first_bad = code if self.first_bad is None else torch.where(self.first_bad == 0, code, self.first_bad)

    @property
    def hunting(self) -> bool:
        return self.hunting_left > 0

    def after_step(self, probe: ActivationProbe, bad: torch.Tensor, step: int, scale: float,
                   replay: Callable[[], Culprit] | None = None, loss: torch.Tensor | None = None,
                   task: Task = CLASSIFICATION) -> None:
        """After a hooked step (output hooks only); ``bad``: its device flag (one host read). A bad step with
        finite outputs and a non-finite ``loss`` is the task's loss's; with a finite one it overflowed in the
        backward: ``replay`` (given when the step left the weights as they were, i.e. the scaler skipped it) reruns
        it with gradient hooks; otherwise the weight gradients name it."""
        self.hunting_left = max(self.hunting_left - 1, 0)
        if not bool(bad):
            return
        self.caught += 1
        self.hunting_left = 0
        if self.first is not None:
            return
        found = probe.culprit()
        if (found is None or found[0] != "forward") and loss is not None and not bool(torch.isfinite(loss)):
            self.first = loss_culprit(task, step, scale, "sampled step")
        elif (found is None or found[0] == "weight_grad") and replay is not None:
            replayed = replay()
            if replayed.phase != "none":
                self.first = replayed
        if self.first is None and found is not None:
            phase, i = found
            self.first = Culprit(probe.names[i], probe.types[i], phase, step, scale, "sampled step")
        self.run_first = self.run_first or self.first

    def skips_seen(self, skipped_in_epoch: int) -> None:
        """At a sampled check: skips this epoch beyond those caught start a hunt (once per epoch)."""
        if skipped_in_epoch > self.caught and self.first is None and not self.hunting:
            self.hunting_left = self.hunt_steps
            self.caught = skipped_in_epoch  # a hunt per new batch of uncaught skips, not per check

    def explain(self, exc: Exception, model: nn.Module, policy, x: torch.Tensor | None, y: torch.Tensor | None,
                loss_multiplier: float, step: int, scale: float, activations: list | None = None,
                task: Task = CLASSIFICATION):
        """``exc`` (a monitor.Diverged) again, naming the culprit: the task's loss when ``watch_loss`` saw it go
        non-finite first with finite outputs, else the run's first caught, else a replay of (``x``, ``y``) at
        ``scale`` (no batch: no replay; a replay that stays finite is said as such)."""
        culprit, early = self.run_first, self._loss_first(task, scale)
        if early is not None and (culprit is None or culprit.step > early.step):
            culprit = early  # a step caught after the loss had already ruined the weights (no scaler to skip it)
        if culprit is None and x is not None:
            culprit = replay_first_nonfinite(model, policy, x, y, scale, loss_multiplier, step, task)
        if culprit is None or culprit.phase == "none":
            return Diverged(f"{exc}" + (f"; {culprit}" if culprit else ""), activations=activations)
        return Diverged(f"{exc}; {culprit}", culprit=culprit.to_dict(), activations=activations)

    def _loss_first(self, task: Task, scale: float) -> Culprit | None:
        """The loss, when ``watch_loss`` saw the run's first non-finite loss come with finite outputs (a host read,
        at divergence only)."""
        code = 0 if self.first_bad is None else int(self.first_bad)
        return loss_culprit(task, code // 2, scale, "per-step loss check") if code % 2 else None

    def take(self) -> dict[str, Any] | None:
        """This epoch's first culprit (as a dict), and a fresh epoch."""
        first, self.first, self.caught, self.hunting_left = self.first, None, 0, 0
        return first.to_dict() if first else None


LOSS = "(loss)"  # the module field of a culprit that is the task's loss


def loss_culprit(task: Task, step: int, scale: float, how: str) -> Culprit:
    """The task's loss as the culprit: non-finite while the model's outputs were finite."""
    return Culprit(LOSS, f"{type(task).__name__}.loss", "loss", step, scale, how)


@torch.no_grad()
def first_nonfinite_weights(model: nn.Module) -> str | None:
    """The first module (registration order) holding a non-finite parameter, or None."""
    for name, module in model.named_modules():
        if any(not torch.isfinite(p).all() for p in module.parameters(recurse=False)):
            return name or ROOT
    return None


def replay_first_nonfinite(model: nn.Module, policy, x: torch.Tensor, y: torch.Tensor, scale: float,
                           loss_multiplier: float, step: int, task: Task = CLASSIFICATION) -> Culprit:
    """Replay one step's forward and backward (at loss scale ``scale``) with the probe attached and name the first
    module whose output or output gradient was not finite, or the task's loss when it alone was not; weights
    already non-finite are named as such (the step that made them so was earlier and not sampled). Training is
    unaffected (``side_effect_free``)."""
    device = next(model.parameters()).device
    modules = [m for _, m in model.named_modules()]
    bad_weights = first_nonfinite_weights(model)
    if bad_weights is not None:
        module = model.get_submodule("" if bad_weights == ROOT else bad_weights)
        return Culprit(bad_weights, type(module).__name__, "weights", step, scale, "replayed step")
    probe = ActivationProbe(model, device)
    with side_effect_free(model), probe.attached():
        loss = forward_backward(model, policy, x, y, scale, loss_multiplier, task)
    found = probe.culprit()
    if (found is None or found[0] != "forward") and not bool(torch.isfinite(loss)):
        return loss_culprit(task, step, scale, "replayed step")
    if found is None:
        return Culprit("(none: the replay stayed finite)", "-", "none", step, scale, "replayed step")
    phase, i = found
    return Culprit(probe.names[i], type(modules[i]).__name__, phase, step, scale, "replayed step")


