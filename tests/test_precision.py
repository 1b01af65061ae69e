"""The precision module pins what each arm means: dtype, scaler, TF32 flags, and refusals."""

import pytest
import torch

from ampbench.config import arms
from ampbench.errors import ArmUnavailable, DeviceError
from ampbench.precision.policy import (
    cudnn_legacy_flags_readable,
    describe_line,
    policy_for,
    resolve_device,
    resolve_policy,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "arm, dtype, scaler",
    [("fp32", None, False), ("fp16", torch.float16, True), ("bf16", torch.bfloat16, False)],
)
def test_cpu_arms(arm, dtype, scaler):
    p = resolve_policy(arm, CPU)
    assert (p.autocast_dtype, p.use_scaler, p.tf32, p.device_type) == (dtype, scaler, False, "cpu")
    assert p.grad_scaler().is_enabled() is scaler


@pytest.mark.parametrize("arm, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_autocast_really_changes_the_matmul_dtype(arm, dtype):
    p = resolve_policy(arm, CPU)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with p.autocast():
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32  # nothing leaks out of the context


def test_tf32_is_refused_on_cpu_not_run_as_fp32():
    with pytest.raises(ArmUnavailable, match="tf32"):
        resolve_policy("tf32", CPU)


def test_unknown_arm():
    with pytest.raises(ArmUnavailable, match="unknown precision"):
        resolve_policy("fp8", CPU)


@pytest.mark.parametrize("arm, mode", [("fp32", "ieee"), ("tf32", "tf32"), ("fp16", "ieee"), ("bf16", "ieee")])
def test_backend_flags_set_explicitly_for_every_arm(arm, mode):
    p = policy_for(arms.get(arm), "cuda")  # flags can be set without a GPU
    # Start from the opposite state so the test fails if apply_backend_flags leaves anything alone.
    other = "tf32" if mode == "ieee" else "ieee"
    torch.backends.cuda.matmul.fp32_precision = other
    torch.backends.cudnn.conv.fp32_precision = other
    p.apply_backend_flags()
    d = p.describe()
    assert d["cuda_matmul_fp32_precision"] == mode
    assert d["cudnn_conv_fp32_precision"] == mode
    assert d["grad_scaler"] == ("on" if arm == "fp16" else "off")


def test_fp32_baseline_turns_off_default_cudnn_tf32():
    # torch leaves cuDNN convolutions on TF32 by default; the baseline must not inherit that.
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    resolve_policy("fp32", CPU).apply_backend_flags()
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_a_medium_matmul_precision_set_elsewhere_does_not_leak_into_fp32():
    """torch.set_float32_matmul_precision("medium") turns oneDNN's fp32 matmuls into bf16 on CPUs that have bf16;
    every arm sets oneDNN back to strict fp32 and records it."""
    torch.set_float32_matmul_precision("medium")
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
    policy = resolve_policy("fp32", CPU)
    policy.apply_backend_flags()
    ran = policy.describe()
    assert ran["onednn_matmul_fp32_precision"] == ran["onednn_conv_fp32_precision"] == "ieee"
    assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"


def test_legacy_reader_context_restores_flags():
    resolve_policy("fp32", CPU).apply_backend_flags()
    with cudnn_legacy_flags_readable():
        assert torch._C._get_cudnn_allow_tf32() in (True, False)
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_old_gpus_refuse_tf32_and_bf16(monkeypatch):
    monkeypatch.setattr("ampbench.precision.policy._cuda_capability", lambda device: (7, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    gpu = torch.device("cuda", 0)
    with pytest.raises(ArmUnavailable, match="7.0"):
        resolve_policy("tf32", gpu)
    with pytest.raises(ArmUnavailable, match="bf16"):
        resolve_policy("bf16", gpu)
    fp16 = resolve_policy("fp16", gpu)
    assert fp16.device_type == "cuda" and fp16.use_scaler


def test_device_resolution():
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device"):
            resolve_device("cuda")


@pytest.mark.gpu
def test_gpu_arms_resolve_on_cuda():
    dev = torch.device("cuda")
    for arm in ("fp32", "fp16"):
        assert resolve_policy(arm, dev).device_type == "cuda"


@pytest.mark.parametrize("arm, line", [
    ("fp16", "autocast float16, GradScaler on, TF32 off, oneDNN fp32 ieee, on cpu"),
    ("bf16", "autocast bfloat16, GradScaler off, TF32 off, oneDNN fp32 ieee, on cpu"),
    ("fp32", "no autocast, GradScaler off, TF32 off, oneDNN fp32 ieee, on cpu"),
    ("bf16_pure", "no autocast, GradScaler off, TF32 off, oneDNN fp32 ieee, weights bfloat16, an ablation, on cpu"),
])
def test_the_train_log_says_what_runs_in_one_readable_line(arm, line):
    policy = resolve_policy(arm, CPU)
    policy.apply_backend_flags()
    assert describe_line(policy.describe()) == line


def test_the_readable_line_names_tf32_and_float32_modules():
    policy = policy_for(arms.get("tf32"), "cuda")  # flags can be set without a GPU
    policy.apply_backend_flags()
    assert describe_line(policy.describe()).startswith("no autocast, GradScaler off, TF32 on,")
    fp16 = resolve_policy("fp16", CPU, ["head"])
    fp16.apply_backend_flags()
    assert "float32 modules head" in describe_line(fp16.describe())
