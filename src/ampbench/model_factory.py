"""Turn ``train.model`` into a model: a built-in, any torchvision classifier by name, or the user's own factory.

The three forms (``params.model_kind``):

- ``small_cnn`` | ``resnet18`` | ``mlp`` | ``vit_tiny``: the built-ins (models.py), sized by ``train.width``;
- ``torchvision.<name>``: a classification model of torchvision, built without pretrained weights for the data's
  class count, with ``train.model_args`` as its builder's keyword arguments. For data that is not 3-channel its
  first convolution is rebuilt with the data's channel count: every torchvision classifier starts with a plain
  3-channel ``Conv2d``; a model without one (or with a grouped one) is refused;
- ``package.module:callable``: the user's factory, imported from the project root and called as
  ``callable(input_shape, num_classes, **train.model_args)``; it must return an ``nn.Module`` that maps
  (N, C, H, W) float images to (N, num_classes) logits.

``inspect_model`` builds the model once before any work and runs a dry forward pass on real samples, so a model
that does not fit the data fails with one line (``ModelError``); it returns what every run records about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ampbench import user_code
from ampbench.errors import AmpbenchError
from ampbench.models import build_builtin
from ampbench.params import model_kind
from ampbench.user_code import first_line, import_callable

CPU = torch.device("cpu")


class ModelError(AmpbenchError):
    """train.model cannot be built, or what it builds does not fit the data."""


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
        """The form of the name: builtin, torchvision or factory (params.model_kind)."""
        return model_kind(self.name)

    def to_meta(self) -> dict[str, Any]:
        return {"name": self.name, "width": self.width, "args": dict(self.args)}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ModelSpec:
        return cls(meta["name"], meta["width"], dict(meta["args"]))


def require_tracked(spec: ModelSpec, model_code: str, root: Path) -> None:
    """A factory's code must lie in ``train.model_code`` (a path relative to the project ``root``, as in dvc.yaml,
    where it is a dependency of the train stages), so that editing it reruns them; ParamsError naming the value to
    set otherwise. Nothing to check for the built-ins and torchvision models."""
    if spec.kind == "factory":
        user_code.require_tracked(spec.name, model_code, root, "train.model", "train.model_code", "the train stages",
                                  ModelError)


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
    """The model ``spec`` names, for inputs of ``input_shape`` = (C, H, W) and ``num_classes`` classes."""
    shape = tuple(input_shape)
    try:
        if spec.kind == "builtin":
            return build_builtin(spec.name, shape, num_classes, spec.width, **spec.args)
        if spec.kind == "torchvision":
            import torchvision

            name = spec.name.removeprefix("torchvision.")
            model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **spec.args)
            if shape[0] != 3:
                _adapt_first_conv(model, name, shape[0])
            return model
        model = _factory(spec.name)(shape, num_classes, **spec.args)
    except ModelError:
        raise
    except Exception as exc:  # any constructor's error: one line naming the model
        raise ModelError(f"train.model {spec.name!r} for input {shape}, {num_classes} classes: building it failed "
                         f"({type(exc).__name__}: {first_line(exc)})") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"train.model {spec.name!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


@torch.no_grad()
def _dry_forward(spec: ModelSpec, model: nn.Module, x: torch.Tensor, num_classes: int) -> None:
    """Forward ``x`` in training and in eval mode; raise ModelError unless both give (N, num_classes) logits."""
    where = f"train.model {spec.name!r} on input {tuple(x.shape[1:])}"
    for mode in ("training", "eval"):
        model.train(mode == "training")
        try:
            out = model(x)
        except Exception as exc:  # e.g. an input too small for the architecture
            hint = "; train.model_args passes the builder's options" if spec.kind == "torchvision" else ""
            raise ModelError(f"{where}: the forward pass failed in {mode} mode ({type(exc).__name__}: "
                             f"{first_line(exc)}){hint}") from None
        if not isinstance(out, torch.Tensor):
            raise ModelError(f"{where}: returns a {type(out).__name__} in {mode} mode; a logits tensor is needed "
                             "(an auxiliary-output model such as googlenet or inception_v3 needs "
                             "train.model_args: {aux_logits: false})")
        if tuple(out.shape) != (len(x), num_classes) or not out.is_floating_point():
            raise ModelError(f"{where}: returns {out.dtype} of shape {tuple(out.shape)} in {mode} mode; expected "
                             f"logits of shape ({len(x)}, {num_classes})")


def _dry_backward(spec: ModelSpec, model: nn.Module, x: torch.Tensor) -> None:
    """One backward pass, as training will run it: catches layers whose gradient this device cannot compute, e.g.
    kernels without a deterministic version (AdaptiveAvgPool2d on CUDA) when train.deterministic is on."""
    model.train()
    try:
        model(x).float().sum().backward()
    except Exception as exc:  # the backward of any layer
        hint = ("; set train.deterministic: false to train this model on this device"
                if "deterministic" in str(exc) else "")
        raise ModelError(f"train.model {spec.name!r} on input {tuple(x.shape[1:])}: the backward pass failed "
                         f"({type(exc).__name__}: {first_line(exc)}){hint}") from None
    model.zero_grad(set_to_none=True)


def flops_per_sample(model: nn.Module, sample: torch.Tensor) -> int:
    """Forward FLOPs for one sample, counted by torch's FLOP counter (matmuls, convolutions, attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(sample[:1])
    return int(counter.get_total_flops())


def inspect_model(spec: ModelSpec, samples: torch.Tensor, num_classes: int,
                  device: torch.device = CPU) -> dict[str, Any]:
    """Build ``spec`` once for these samples (N ≥ 2) on ``device`` and check it before any work: a dry forward in
    training and eval mode, and one backward (with the caller's determinism settings). Returns its identity:
    name, kind, width, args, parameter count, FLOPs per sample. The random number generators are left as they
    were, so training afterwards is unchanged."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build(spec, tuple(samples.shape[1:]), num_classes).to(device)
        x = samples.to(device)
        _dry_forward(spec, model, x, num_classes)
        _dry_backward(spec, model, x)
        flops = flops_per_sample(model, x)
    return {"name": spec.name, "kind": spec.kind, "width": spec.width, "args": dict(spec.args),
            "parameters": sum(p.numel() for p in model.parameters()), "flops_per_sample": flops}
