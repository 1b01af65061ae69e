"""The arm registry: every precision arm the pipeline knows, what it means, which one is the baseline.

Torch-free, so params validation, the CLI and the report read it without importing torch; ``precision.py`` turns
an entry into torch objects (autocast context, GradScaler, backend flags). To add an arm, add one ``Arm`` here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arm:
    """One precision setting, as data: the dtypes are torch attribute names ("float16"), None for "off"."""

    name: str
    autocast: str | None  # autocast dtype for forward pass and loss; None: no autocast
    scaler: bool  # torch.amp.GradScaler on (only meaningful with fp16 autocast and fp32 weights)
    tf32: bool  # TF32 tensor-core math for fp32 matmuls and convolutions (CUDA only)
    param_dtype: str = "float32"  # weights and inputs; 16-bit only for the *_pure ablations
    ablation: bool = False  # opt-in arms that show what the tutorial warns about
    summary: str = ""  # one line for help texts and the params.yaml comment


_ALL = (
    Arm("fp32", None, False, False, summary="strict float32, TF32 off everywhere: the baseline"),
    Arm("tf32", None, False, True, summary="float32 with TF32 tensor-core matmuls and convolutions (CUDA ≥ 8.0)"),
    Arm("fp16", "float16", True, False, summary="float16 autocast + GradScaler"),
    Arm("bf16", "bfloat16", False, False, summary="bfloat16 autocast"),
    Arm("fp16_noscaler", "float16", False, False, ablation=True,
        summary="float16 autocast without a GradScaler: small gradients underflow"),
    Arm("fp16_pure", None, False, False, "float16", ablation=True,
        summary="model and inputs .half(), no autocast, no float32 master weights"),
    Arm("bf16_pure", None, False, False, "bfloat16", ablation=True,
        summary="model and inputs .to(bfloat16), no autocast, no float32 master weights"),
)

ARMS: dict[str, Arm] = {arm.name: arm for arm in _ALL}
NAMES: tuple[str, ...] = tuple(ARMS)
BASELINE = "fp32"  # every other arm is compared with this one, seed by seed
MAIN: tuple[str, ...] = tuple(a.name for a in _ALL if not a.ablation)  # the default train.precisions
ABLATIONS: tuple[str, ...] = tuple(a.name for a in _ALL if a.ablation)
TF32_REFERENCE = "tf32"  # speed and memory are also given relative to this arm when it ran


def adoption_code(arm: Arm, device_type: str = "cuda") -> str:
    """The lines that switch a user's own float32 training step to ``arm`` (the tutorial's recipe)."""
    if arm.tf32:
        return ('torch.backends.cuda.matmul.fp32_precision = "tf32"  # once, before training\n'
                'torch.backends.cudnn.conv.fp32_precision = "tf32"')
    if arm.autocast is None or arm.ablation:
        return ""
    lines = [f'scaler = torch.amp.GradScaler("{device_type}")  # once, before training'] if arm.scaler else []
    lines += [f'with torch.autocast("{device_type}", dtype=torch.{arm.autocast}):  # forward pass and loss only',
              "    loss = loss_fn(model(x), y)"]
    lines += (["scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"] if arm.scaler
              else ["loss.backward()", "optimizer.step()"])
    return "\n".join(lines)


def get(name: str) -> Arm:
    """The arm called ``name``; KeyError names the known ones."""
    try:
        return ARMS[name]
    except KeyError:
        raise KeyError(f"unknown precision {name!r}; known: {', '.join(NAMES)}") from None
