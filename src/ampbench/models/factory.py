"""Turn ``train.model`` into a model: a built-in, any torchvision classifier by name, or the user's own factory.

The three forms (``config.rules.model_kind``):

- ``small_cnn`` | ``resnet18`` | ``mlp`` | ``vit_tiny``: the built-ins (``builtins.py``), sized by ``train.width``;
- ``torchvision.<name>``: a classification model of torchvision, built without pretrained weights for the data's
  class count, with ``train.model_args`` as its builder's keyword arguments. For data that is not 3-channel its
  first convolution is rebuilt with the data's channel count: every torchvision classifier starts with a plain
  3-channel ``Conv2d``; a model without one (or with a grouped one) is refused;
- ``package.module:callable``: the user's factory, imported from the project root and called as
  ``callable(input_shape, num_classes, **train.model_args)``; it must return an ``nn.Module`` that maps
  (N, C, H, W) float images to (N, num_classes) logits.

``inspect_model`` (``check_built`` on a model the caller built) builds the model once before any work and runs a
dry forward pass on real samples, so a model that does not fit the data fails with one line (``ModelError``), and
a backward through the task's loss and a probe of its evaluation, so a task that breaks its contract does too
(``tasks.probe``: ``ParamsError``); it returns what every run records about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ampbench.config.rules import model_kind
from ampbench.config.user_code import first_line, import_callable
from ampbench.data.splits import Split
from ampbench.errors import ModelError
from ampbench.models import gpt
from ampbench.models.builtins import build_builtin
from ampbench.tasks import probe
from ampbench.tasks.classification import CLASSIFICATION
from ampbench.tasks.contract import Task

CPU = torch.device("cpu")


@dataclass(frozen=True)
class ModelSpec:
    """What to build: ``train.model`` (name, torchvision.<name> or package.module:callable), width, arguments."""

    name: str
    width: int | None = None  # built-ins only
    args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_train(cls, train) -> ModelSpec:
        return cls(train.model, train.width, dict(train.model_args))

    @property
    def kind(self) -> str:
        """The form of the name: builtin, torchvision or factory (rules.model_kind)."""
        return model_kind(self.name)

    def to_meta(self) -> dict[str, Any]:
        return {"name": self.name, "width": self.width, "args": dict(self.args)}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ModelSpec:
        return cls(meta["name"], meta["width"], dict(meta["args"]))


def _factory(name: str) -> Callable[..., Any]:
    return import_callable(name, "train.model", ModelError)


def _adapt_first_conv(model: nn.Module, name: str, channels: int) -> None:
    """Rebuild the first convolution of a torchvision model (in registration order, which is forward order for
    torchvision's classifiers) for ``channels`` input channels."""
    first = next(((path, m) for path, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if first is None or first[1].in_channels != 3 or first[1].groups != 1:
        raise ModelError(f"train.model 'torchvision.{name}': its first layer is not a plain 3-channel Conv2d, so "
                         f"it cannot be adapted to {channels}-channel data")
    path, conv = first
    parent_path, _, attr = path.rpartition(".")
    setattr(model.get_submodule(parent_path), attr, nn.Conv2d(
        channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
        bias=conv.bias is not None, padding_mode=conv.padding_mode))


def build(spec: ModelSpec, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The model ``spec`` names for image classification: inputs of ``input_shape`` = (C, H, W), ``num_classes``."""
    return build_for(spec, {"input_shape": tuple(input_shape), "num_classes": num_classes})


def build_for(spec: ModelSpec, contract: dict[str, Any], whole: bool = False) -> nn.Module:
    """The model ``spec`` names, for the task's ``contract`` (``Task.model_args``: the data's input shape and class
    count, …): a built-in or torchvision builder gets it by name, a factory positionally, in this order. A factory
    may return a Hugging Face Trainer (train.framework: hf_trainer): its model, or the Trainer itself with
    ``whole``."""
    try:
        if spec.kind == "builtin" and spec.name == "gpt":
            return gpt.build(*contract.values(), spec.width, **spec.args)
        if spec.kind == "builtin":
            return build_builtin(spec.name, *contract.values(), spec.width, **spec.args)
        if spec.kind == "torchvision":
            return _torchvision(spec, tuple(contract["input_shape"]), contract["num_classes"])
        model = _factory(spec.name)(*contract.values(), **spec.args)
    except ModelError:
        raise
    except Exception as exc:  # any constructor's error: one line naming the model
        given = ", ".join(f"{k} {tuple(v) if isinstance(v, list) else v}" for k, v in contract.items())
        raise ModelError(f"train.model {spec.name!r} for {given}: building it failed ({type(exc).__name__}: "
                         f"{first_line(exc)})") from None
    if whole:
        return model
    if not isinstance(model, nn.Module) and isinstance(getattr(model, "model", None), nn.Module):
        model = model.model  # a transformers.Trainer's
    if not isinstance(model, nn.Module):
        raise ModelError(f"train.model {spec.name!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _torchvision(spec: ModelSpec, shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    import torchvision

    name = spec.name.removeprefix("torchvision.")
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **spec.args)
    if shape[0] != 3:
        _adapt_first_conv(model, name, shape[0])
    return model


@torch.no_grad()
def _dry_forward(spec: ModelSpec, model: nn.Module, x: torch.Tensor, contract: dict[str, Any], task: Task) -> None:
    """Forward ``x`` in training and in eval mode; raise ModelError unless both give what ``task`` trains on."""
    where = f"train.model {spec.name!r} on input {tuple(x.shape[1:])}"
    for mode in ("training", "eval"):
        model.train(mode == "training")
        try:
            out = model(x)
        except Exception as exc:  # e.g. an input too small for the architecture
            hint = "; train.model_args passes the builder's options" if spec.kind == "torchvision" else ""
            raise ModelError(f"{where}: the forward pass failed in {mode} mode ({type(exc).__name__}: "
                             f"{first_line(exc)}){hint}") from None
        wrong = task.output_error(out, x, contract)
        if wrong:
            raise ModelError(f"{where}: returns {wrong[0]} in {mode} mode; {wrong[1]}")


def _dry_backward(spec: ModelSpec, model: nn.Module, x: torch.Tensor, task: Task,
                  y: torch.Tensor | None = None) -> None:
    """One backward pass, as training will run it: catches layers whose gradient this device cannot compute, e.g.
    kernels without a deterministic version (AdaptiveAvgPool2d on CUDA) when train.deterministic is on. With the
    targets ``y``, through the task's loss, held to the contract (``tasks.probe``: a 0-dim tensor with a grad path
    to the parameters): a loss that returns a float would otherwise end training in a traceback."""
    model.train()
    logits = task.logits(model(x))
    loss = logits.float().sum() if y is None else probe.check_loss(task, task.loss(logits, y))
    try:
        loss.backward()
    except Exception as exc:  # the backward of any layer
        hint = ("; set train.deterministic: false to train this model on this device"
                if "deterministic" in str(exc) else "")
        raise ModelError(f"train.model {spec.name!r} on input {tuple(x.shape[1:])}: the backward pass failed "
                         f"({type(exc).__name__}: {first_line(exc)}){hint}") from None
    if y is not None:
        probe.check_grad_path(task, model)
    model.zero_grad(set_to_none=True)


def flops_per_sample(model: nn.Module, sample: torch.Tensor) -> int:
    """Forward FLOPs for one sample, counted by torch's FLOP counter (matmuls, convolutions, attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(sample[:1])
    return int(counter.get_total_flops())


def inspect_model(spec: ModelSpec, samples: torch.Tensor, contract: dict[str, Any] | int,
                  device: torch.device = CPU, task: Task = CLASSIFICATION, targets: torch.Tensor | None = None,
                  test: Split | None = None) -> dict[str, Any]:
    """Build ``spec`` once for these samples (N ≥ 2) on ``device`` and check it before any work (``check_built``).
    ``contract``: what the factory gets (``Task.model_args``; a class count stands for image classification on
    these samples). Returns its identity. The random number generators are left as they were."""
    if isinstance(contract, int):
        contract = {"input_shape": tuple(samples.shape[1:]), "num_classes": contract}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_for(spec, contract).to(device)
        return check_built(spec, model, samples.to(device), contract, task, targets, test)


def check_built(spec: ModelSpec, model: nn.Module, x: torch.Tensor, contract: dict[str, Any], task: Task,
                targets: torch.Tensor | None = None, test: Split | None = None) -> dict[str, Any]:
    """Check a model just built from ``spec`` on samples ``x`` (N ≥ 2, on its device): a dry forward in training
    and eval mode, and one backward (with the caller's determinism settings) through the task's loss on
    ``targets`` (their labels) when given; with ``test`` (the test split) the task's evaluation probed on its first
    examples (``tasks.probe.probe_outcomes``). ModelError or ParamsError (one line) otherwise. Returns its identity:
    name, kind, width, args, parameter count, FLOPs per sample. It draws random numbers (dropout): callers that
    train afterwards fork the generators around it."""
    _dry_forward(spec, model, x, contract, task)
    _dry_backward(spec, model, x, task, None if targets is None else targets.to(x.device))
    if test is not None:
        probe.probe_outcomes(task, model, test, probe.PROBE_EXAMPLES, probe.DRY_RUN_BINS)
    flops = flops_per_sample(model, x)
    return {"name": spec.name, "kind": spec.kind, "width": spec.width, "args": dict(spec.args),
            "parameters": sum(p.numel() for p in model.parameters()), "flops_per_sample": flops}
