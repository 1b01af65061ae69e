"""The one place that turns a precision arm (from the registry in ``config/arms.py``) into torch objects.

``resolve_policy("fp16", device)`` returns a ``PrecisionPolicy``: the autocast context, the GradScaler, and the
TF32 backend flags, or raises ``ArmUnavailable`` when the device cannot run the arm as named. The training loop
uses whatever the policy hands it and never branches on the name.

What each arm means is data in ``config/arms.py``; docs/precision-arms.md says it in words.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import types
from dataclasses import dataclass

import torch

from ampbench.config import arms
from ampbench.config.params import GradScalerParams, TrainParams
from ampbench.errors import ArmUnavailable, DeviceError
from ampbench.precision.packages import package_problem


@dataclass(frozen=True)
class PrecisionPolicy:
    """What one precision arm means on one device."""

    name: str
    device_type: str  # "cuda" or "cpu": always the device that really runs, so autocast is never silently off
    autocast_dtype: torch.dtype | None  # None: no autocast, everything in float32
    use_scaler: bool
    tf32: bool  # TF32 tensor-core math for fp32 matmuls and convolutions
    param_dtype: torch.dtype = torch.float32  # float16/bfloat16 for the pure arms (no float32 master weights)
    ablation: bool = False
    fp32_modules: tuple[str, ...] = ()  # train.fp32_modules: name patterns kept in float32 (16-bit arms only)
    optimizer_impl: str = "torch"  # who implements train.optimizer (arms.OPTIMIZERS, optimizers.build)
    float8_recipe: str | None = None  # torchao float8 training of the eligible Linear layers (float8.py)

    @property
    def low_precision(self) -> bool:
        """Whether this arm computes in a 16-bit type anywhere (autocast or 16-bit weights)."""
        return self.autocast_dtype is not None or self.param_dtype != torch.float32

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model in this arm's parameter dtype (float32 except for the pure arms), with the modules
        ``fp32_modules`` names run in float32 (``keep_float32``) when the arm computes in 16 bits, and for the fp8
        arms a copy whose eligible Linear layers train in float8 (``model`` itself stays plain, so the evaluate
        stage can still run its weights in strict float32)."""
        model = model.to(self.param_dtype)
        float32 = float32_matches(model, self.fp32_modules) if self.fp32_modules and self.low_precision else []
        if float32:
            keep_float32(model, float32, self.device_type, self.param_dtype)
        if self.float8_recipe:
            from ampbench.precision import float8

            model = copy.deepcopy(model)
            float8.convert(model, self.float8_recipe, float32)
        return model

    def make_optimizer(self, tp: TrainParams, params, device: torch.device) -> torch.optim.Optimizer:
        """train.optimizer from this arm's implementation (torch.optim, torchao's stochastic rounding,
        torch-optimi's Kahan summation: ``optimizers.build``)."""
        from ampbench.precision.optimizers import build

        return build(self.optimizer_impl, tp, params, device)

    def cast_input(self, x: torch.Tensor) -> torch.Tensor:
        """Floating inputs in the parameter dtype (a no-op for every arm with float32 weights); token ids stay."""
        return x.to(self.param_dtype) if x.is_floating_point() else x

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context for forward pass and loss: autocast in this arm's dtype, or a no-op."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def grad_scaler(self, settings: GradScalerParams | None = None) -> torch.amp.GradScaler:
        """A GradScaler for this arm; disabled (a pass-through) unless the arm has a scaler (fp16 autocast).

        ``settings``: the ``train.grad_scaler`` params group (None: its defaults).
        """
        s = settings or GradScalerParams()
        return torch.amp.GradScaler(self.device_type, enabled=self.use_scaler, init_scale=s.init_scale,
                                    growth_factor=s.growth_factor, backoff_factor=s.backoff_factor,
                                    growth_interval=s.growth_interval)

    def apply_backend_flags(self) -> None:
        """Set the fp32 math mode for CUDA matmuls, cuDNN and oneDNN (CPU) kernels, explicitly, for every arm.

        Uses only the ``fp32_precision`` API: torch warns when the old ``allow_tf32`` flags are mixed with it,
        and leaves cuDNN convolutions on TF32 by default, which would make a "fp32" baseline not fp32. On the CPU,
        ``torch.set_float32_matmul_precision("medium")`` (called by user code or a library) sets oneDNN's fp32
        matmuls to bf16 on CPUs that have it; every arm puts them back to "ieee".
        """
        mode = "tf32" if self.tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
        # RNNs too: torch refuses to read the legacy flag (torch.export does) while conv and rnn differ.
        torch.backends.cudnn.rnn.fp32_precision = mode
        for kernels in (torch.backends.mkldnn.matmul, torch.backends.mkldnn.conv, torch.backends.mkldnn.rnn):
            kernels.fp32_precision = "ieee"

    def describe(self) -> dict[str, str]:
        """What actually runs, read back from torch after ``apply_backend_flags`` (for params and tags)."""
        return {
            "precision": self.name,
            "device_type": self.device_type,
            "autocast_dtype": str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else "off",
            "grad_scaler": "on" if self.use_scaler else "off",
            "param_dtype": str(self.param_dtype).removeprefix("torch."),
            "ablation": str(self.ablation).lower(),
            "fp32_modules": ",".join(self.fp32_modules) if self.fp32_modules and self.low_precision else "none",
            "optimizer_impl": self.optimizer_impl,
            "float8": self.float8_recipe or "off",
            "cuda_matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
            "cudnn_conv_fp32_precision": torch.backends.cudnn.conv.fp32_precision,
            "onednn_matmul_fp32_precision": torch.backends.mkldnn.matmul.fp32_precision,
            "onednn_conv_fp32_precision": torch.backends.mkldnn.conv.fp32_precision,
        }


def describe_line(d: dict[str, str]) -> str:
    """``PrecisionPolicy.describe()`` in one line for the log: "autocast float16, GradScaler on, TF32 off, oneDNN
    fp32 ieee, on cpu" (weights, ablation and float32 modules when they apply)."""
    tf32 = "on" if d["cuda_matmul_fp32_precision"] == d["cudnn_conv_fp32_precision"] == "tf32" else "off"
    parts = ["no autocast" if d["autocast_dtype"] == "off" else f"autocast {d['autocast_dtype']}",
             f"GradScaler {d['grad_scaler']}", f"TF32 {tf32}", f"oneDNN fp32 {d['onednn_matmul_fp32_precision']}"]
    if d.get("float8", "off") != "off":
        parts.append(f"float8 {d['float8']} Linear layers")
    if d["param_dtype"] != "float32":
        parts.append(f"weights {d['param_dtype']}")
    if d.get("optimizer_impl", "torch") != "torch":
        parts.append(f"optimizer {arms.OPTIMIZER_PACKAGES[d['optimizer_impl']]}")
    if d["fp32_modules"] != "none":
        parts.append(f"float32 modules {d['fp32_modules']}")
    if d["ablation"] == "true":
        parts.append("an ablation")
    return ", ".join(parts) + f", on {d['device_type']}"


@contextlib.contextmanager
def cudnn_legacy_flags_readable():
    """Temporarily put cuDNN's fp32 mode back to torch's default ("tf32") so legacy readers work.

    torch 2.14's legacy ``allow_tf32`` getter, which ``torch.export`` (and so MLflow's model logging) calls,
    raises whenever cuDNN conv or RNN is set to "ieee". Exporting never runs cuDNN kernels, so restoring the
    default for its duration changes no result; our flags come back afterwards.
    """
    conv, rnn = torch.backends.cudnn.conv, torch.backends.cudnn.rnn
    saved = conv.fp32_precision, rnn.fp32_precision
    conv.fp32_precision = rnn.fp32_precision = "tf32"
    try:
        yield
    finally:
        conv.fp32_precision, rnn.fp32_precision = saved


def float32_matches(model: torch.nn.Module, patterns: tuple[str, ...] | list[str]) -> list[str]:
    """The module names (``model.named_modules()``) that any of ``patterns`` matches, as a shell pattern
    (``blocks.*.attn``) or exactly; ValueError naming a pattern that matches nothing (a typo would silently keep
    everything in 16 bits)."""
    names = [n for n, _ in model.named_modules() if n]
    matched = []
    for pattern in patterns:
        hits = [n for n in names if n == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            close = ", ".join(n for n in names if pattern.split(".")[-1] in n)[:300] or ", ".join(names[:12])
            raise ValueError(f"train.fp32_modules: {pattern!r} matches no module of the model (modules: {close})")
        matched += [h for h in hits if h not in matched]
    # A match inside a matched module is already covered by it.
    return [n for n in matched if not any(n.startswith(m + ".") for m in matched)]


def keep_float32(model: torch.nn.Module, names: list[str], device_type: str, param_dtype: torch.dtype) -> None:
    """Run the modules ``names`` outside autocast, on float32 inputs, with float32 weights: the standard fix for a
    layer that overflows (or loses too much) in 16 bits. Their outputs stay float32 under autocast (the next
    autocast op casts what it needs) and, for the *_pure ablations, go back to the dtype their input came in. Each
    module's ``forward`` is wrapped on the instance (a ``with torch.autocast(enabled=False)`` block, which
    torch.compile traces; hooks entering the context by hand do not compile), so structure and state_dict keys do
    not change; ``without_float32`` takes the wrappers off again."""
    for name in names:
        module = model.get_submodule(name)
        if "_ampbench_float32" in module.__dict__:
            continue
        module.float()
        module._ampbench_float32 = (device_type, param_dtype)
        module.forward = types.MethodType(_float32_forward, module)


def _float32_forward(self: torch.nn.Module, *args, **kwargs):
    """``forward`` of a module kept in float32 (``keep_float32``)."""
    device_type, param_dtype = self._ampbench_float32
    floating = lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    with torch.autocast(device_type=device_type, enabled=False):
        out = type(self).forward(self, *[floating(a) for a in args], **{k: floating(v) for k, v in kwargs.items()})
    if param_dtype == torch.float32:
        return out
    # Back to what the model around it computes in: the dtype its floating input came in (16 bits in the arm; float32
    # once the model is .float()ed, as the evaluate stage runs the arm's weights in strict fp32), else the arm's.
    back = next((a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()),
                param_dtype)
    return torch.utils._pytree.tree_map(
        lambda t: t.to(back) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)


def without_float32(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with ``keep_float32``'s wrappers taken off (in place): the plain module, e.g. for export."""
    for module in model.modules():
        if "_ampbench_float32" in module.__dict__:
            del module.__dict__["forward"], module.__dict__["_ampbench_float32"]
    return model


def plain_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` as a user's plain float32 code would hold it (in place): ``keep_float32``'s wrappers off, float8
    layers back to ``nn.Linear`` (torchao stays a dependency of the arm, not of a logged model)."""
    without_float32(model)
    if any(type(m).__name__ == "Float8Linear" for m in model.modules()):
        from ampbench.precision.float8 import unconvert

        unconvert(model)
    return model


def _cuda_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def policy_for(arm: arms.Arm, device_type: str, fp32_modules: tuple[str, ...] = ()) -> PrecisionPolicy:
    """The registry entry as torch objects for ``device_type``, without asking whether the device can run it."""
    return PrecisionPolicy(name=arm.name, device_type=device_type,
                           autocast_dtype=getattr(torch, arm.autocast) if arm.autocast else None,
                           use_scaler=arm.scaler, tf32=arm.tf32, param_dtype=getattr(torch, arm.param_dtype),
                           ablation=arm.ablation, fp32_modules=tuple(fp32_modules), optimizer_impl=arm.optimizer,
                           float8_recipe=arm.float8)


def resolve_policy(name: str, device: torch.device, fp32_modules: tuple[str, ...] | list[str] = ()) -> PrecisionPolicy:
    """The policy for arm ``name`` on ``device`` (``fp32_modules``: train.fp32_modules); ArmUnavailable if the
    device cannot run it as named."""
    try:
        policy = policy_for(arms.get(name), device.type, tuple(fp32_modules))
    except KeyError as exc:
        raise ArmUnavailable(exc.args[0]) from None
    tf32 = policy.tf32
    low = policy.autocast_dtype or policy.param_dtype  # the 16-bit type this arm computes in, if any
    if device.type == "cuda":
        major, minor = _cuda_capability(device)
        if tf32 and major < 8:
            raise ArmUnavailable(f"tf32 needs compute capability ≥ 8.0 (Ampere); this GPU is {major}.{minor}")
        # is_bf16_supported() counts emulation by default, which would make a "bf16" arm slow fp32-ish math.
        if low is torch.bfloat16 and not torch.cuda.is_bf16_supported(including_emulation=False):
            raise ArmUnavailable(f"bf16 needs native bfloat16 (compute capability ≥ 8.0); this GPU is {major}.{minor}")
    elif device.type == "cpu":
        if tf32:
            raise ArmUnavailable("tf32 is a CUDA tensor-core mode; on CPU it would run as plain fp32")
    else:
        raise ArmUnavailable(f"device type {device.type!r} is not supported (cpu or cuda)")
    missing = package_problem(name)
    if missing:
        raise ArmUnavailable(missing)
    if policy.float8_recipe:
        from ampbench.precision import float8

        why = (float8.cuda_refusal(policy.float8_recipe, _cuda_capability(device)) if device.type == "cuda"
               else float8.cpu_can_run())
        if why:
            raise ArmUnavailable(why)
    return policy


def resolve_device(requested: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a GPU is an error, not a silent fallback."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError("train.device is 'cuda' but no CUDA device is available (use 'auto' or 'cpu')")
    return torch.device(requested)
