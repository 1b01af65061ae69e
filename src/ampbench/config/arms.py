"""The arm registry: every precision arm the pipeline knows, what it means, which one is the baseline.

Torch-free, so params validation, the CLI and the report read it without importing torch; ``precision/policy.py`` turns
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
    param_dtype: str = "float32"  # weights and inputs; 16-bit for the pure arms (no float32 master weights)
    ablation: bool = False  # opt-in arms that show what the tutorial warns about
    summary: str = ""  # one line for help texts and the params.yaml comment
    # Who implements train.optimizer: "torch" (torch.optim, round to nearest), "torchao_sr" (torchao's AdamW,
    # fp32 maths, the bf16 weight write stochastically rounded), "optimi_kahan" (torch-optimi, Kahan-compensated
    # updates of the low-precision weights). optimizers.py builds them.
    optimizer: str = "torch"
    float8: str | None = None  # torchao float8 training recipe for the eligible Linear layers (float8.py)
    default: bool = False  # in the default train.precisions

    @property
    def low_precision(self) -> bool:
        """Computes in 16 or 8 bits somewhere (autocast, 16-bit weights, float8 layers); fp32 and tf32 do not."""
        return self.autocast is not None or self.pure or self.float8 is not None

    @property
    def pure(self) -> bool:
        """Weights (and optimizer state) in 16 bits: no float32 copy of any parameter."""
        return self.param_dtype != "float32"


_ALL = (
    Arm("fp32", None, False, False, default=True, summary="strict float32, TF32 off everywhere: the baseline"),
    Arm("tf32", None, False, True, default=True,
        summary="float32 with TF32 tensor-core matmuls and convolutions (CUDA ≥ 8.0)"),
    Arm("fp16", "float16", True, False, default=True, summary="float16 autocast + GradScaler"),
    Arm("bf16", "bfloat16", False, False, default=True, summary="bfloat16 autocast"),
    Arm("bf16_sr", None, False, False, "bfloat16", optimizer="torchao_sr",
        summary="pure bfloat16 weights and AdamW state, the weight write stochastically rounded (torchao)"),
    Arm("bf16_kahan", None, False, False, "bfloat16", optimizer="optimi_kahan",
        summary="pure bfloat16 weights and optimizer state, Kahan-compensated updates (torch-optimi)"),
    Arm("fp8_tensorwise", "bfloat16", False, False, float8="tensorwise",
        summary="float8 Linear layers, one scale per tensor (torchao), the rest under bfloat16 autocast"),
    Arm("fp8_rowwise", "bfloat16", False, False, float8="rowwise",
        summary="float8 Linear layers, one scale per row (torchao), the rest under bfloat16 autocast"),
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
MAIN: tuple[str, ...] = tuple(a.name for a in _ALL if a.default)  # the default train.precisions
OPT_IN: tuple[str, ...] = tuple(a.name for a in _ALL if not a.default and not a.ablation)  # settings one may adopt
ABLATIONS: tuple[str, ...] = tuple(a.name for a in _ALL if a.ablation)
# train.optimizer values each optimizer implementation has (Arm.optimizer): the rest is refused before any work.
OPTIMIZERS: dict[str, tuple[str, ...]] = {"torch": ("sgd", "adam", "adamw"), "torchao_sr": ("adamw",),
                                          "optimi_kahan": ("sgd", "adam", "adamw")}
OPTIMIZER_PACKAGES = {"torchao_sr": "torchao's _AdamW (stochastic rounding)",
                      "optimi_kahan": "torch-optimi (Kahan summation)"}
TF32_REFERENCE = "tf32"  # speed and memory are also given relative to this arm when it ran
# The packages beyond torch an arm imports, by what needs them: (the module it imports, the distribution pip
# installs). Optional: an arm whose package is missing is skipped (``precision.packages`` probes them).
PACKAGES = {"torchao_sr": ("torchao.optim", "torchao"), "optimi_kahan": ("optimi", "torch-optimi"),
            "float8": ("torchao.float8", "torchao")}


def packages(arm: Arm) -> list[tuple[str, str]]:
    """(module, distribution) of every package beyond torch that ``arm`` imports: its optimizer's, its float8's."""
    needs = [PACKAGES[arm.optimizer]] if arm.optimizer in PACKAGES else []
    return needs + ([PACKAGES["float8"]] if arm.float8 else [])


_PURE_OPTIMIZER = {
    "torchao_sr": ["from torchao.optim import _AdamW",
                   "optimizer = _AdamW(model.parameters(), lr=lr, bf16_stochastic_round=True)"],
    "optimi_kahan": ["import optimi  # torch-optimi",
                     "optimizer = optimi.AdamW(model.parameters(), lr=lr, kahan_sum=True)  # or SGD, Adam"],
}


# The precision setting that means each main arm in a framework's trainer (frameworks/): what to adopt there.
LIGHTNING_PRECISION = {"float16": "16-mixed", "bfloat16": "bf16-mixed"}


def framework_adoption(arm: Arm, device_type: str, framework: str) -> str:
    """The setting that switches a framework's trainer (train.framework) to ``arm``."""
    if arm.ablation or arm.pure or arm.float8 or arm.optimizer != "torch":
        return ""
    if framework == "hf_trainer":
        flag = "tf32" if arm.tf32 else {"float16": "fp16", "bfloat16": "bf16"}.get(arm.autocast or "")
        return f"args = TrainingArguments(..., {flag}=True)" if flag else ""
    if arm.tf32:
        return 'torch.set_float32_matmul_precision("high")  # once, before training: TF32 matmuls'
    if arm.autocast == "float16" and device_type == "cpu":  # the precision string would run bf16 on the CPU
        return ("from lightning.pytorch.plugins.precision import MixedPrecision\n"
                'trainer = L.Trainer(..., plugins=[MixedPrecision("16-mixed", "cpu", '
                'scaler=torch.amp.GradScaler("cpu"))])')
    precision = LIGHTNING_PRECISION.get(arm.autocast or "")
    return f'trainer = L.Trainer(..., precision="{precision}")' if precision else ""


def adoption_code(arm: Arm, device_type: str = "cuda", framework: str | None = None) -> str:
    """The lines that switch a user's own float32 training step to ``arm`` (the tutorial's recipe), or a
    framework's trainer (``framework``: train.framework, lightning or hf_trainer)."""
    if framework in ("lightning", "hf_trainer"):
        return framework_adoption(arm, device_type, framework)
    if arm.tf32:
        return ('torch.backends.cuda.matmul.fp32_precision = "tf32"  # once, before training\n'
                'torch.backends.cudnn.conv.fp32_precision = "tf32"')
    if arm.ablation:
        return ""
    if arm.pure:
        return "\n".join([f"model = model.to(torch.{arm.param_dtype})  # once: weights and optimizer state",
                          *_PURE_OPTIMIZER[arm.optimizer],
                          f"loss = loss_fn(model(x.to(torch.{arm.param_dtype})).float(), y)",
                          "loss.backward()", "optimizer.step()"])
    if arm.autocast is None:
        return ""
    lines = [f'scaler = torch.amp.GradScaler("{device_type}")  # once, before training'] if arm.scaler else []
    if arm.float8:
        lines += ["from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # once",
                  f'convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("{arm.float8}"),',
                  "    module_filter_fn=lambda m, name: m.in_features % 16 == 0 and m.out_features % 16 == 0)",
                  "model = torch.compile(model)"]
    lines += [f'with torch.autocast("{device_type}", dtype=torch.{arm.autocast}):  # forward pass and loss only',
              "    loss = loss_fn(model(x), y)"]
    lines += (["scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"] if arm.scaler
              else ["loss.backward()", "optimizer.step()"])
    return "\n".join(lines)


def conflicts(precisions: list[str], optimizer: str, fp32_modules: list[str]) -> list[tuple[str, str]]:
    """(key, reason) for arms combined with a setting they cannot honour: an optimizer the arm's implementation
    lacks, float32 modules in an arm that keeps no float32 weights (params validation reports them)."""
    problems = []
    for arm in (ARMS[name] for name in precisions if name in ARMS):
        have = OPTIMIZERS[arm.optimizer]
        if optimizer not in have:
            problems.append(("train.optimizer", f"{optimizer!r} with {arm.name}: {OPTIMIZER_PACKAGES[arm.optimizer]} "
                                                f"has only {', '.join(have)}; set -S train.optimizer={have[0]} or "
                                                f"drop {arm.name} from train.precisions"))
        if no_islands(arm) and fp32_modules:
            problems.append(("train.fp32_modules", f"{list(fp32_modules)} with {arm.name}: {no_islands(arm)}; drop "
                                                   f"{arm.name} from train.precisions or empty train.fp32_modules"))
    return problems


def no_islands(arm: Arm) -> str | None:
    """Why ``arm`` can keep no module in float32 (train.fp32_modules), or None when it can."""
    if arm.pure and not arm.ablation:
        return "a pure-bf16 arm keeps no float32 weights for any module (its optimizer updates bfloat16 weights)"
    return None


def get(name: str) -> Arm:
    """The arm called ``name``; KeyError names the known ones."""
    try:
        return ARMS[name]
    except KeyError:
        raise KeyError(f"unknown precision {name!r}; known: {', '.join(NAMES)}") from None
