"""Facts about the machine a run uses: device name, CPU model and its 16-bit instructions, library versions.

Recorded with every run so results from different hardware are never mistaken for each other.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

import torch

# CPU flags that decide whether bf16/fp16 autocast on CPU is native or emulated (slow).
_CPU_16BIT_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "f16c")


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """CPU model name and which 16-bit instruction sets /proc/cpuinfo reports (Linux; 'unknown' elsewhere)."""
    model, flags = platform.processor() or platform.machine() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break  # "model name" comes before "flags" in each processor block
    except OSError:
        pass
    present = [f for f in _CPU_16BIT_FLAGS if f in flags]
    return {"cpu_model": model, "cpu_16bit_flags": ",".join(present) or "none",
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def fingerprint(device: torch.device) -> dict[str, str]:
    """Hardware and software facts for ``device``: GPU name and capability, CUDA, cuDNN, torch, CPU."""
    info = {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device_type": device.type,
        **cpu_info(),
    }
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        info.update({
            "device_name": torch.cuda.get_device_name(device),
            "compute_capability": f"{major}.{minor}",
            "cuda_version": str(torch.version.cuda),
            "cudnn_version": str(torch.backends.cudnn.version()),
        })
    else:
        info["device_name"] = f"CPU: {info['cpu_model']}"
    return info


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak-memory measurement (CUDA only; CPU peak RSS cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """Peak memory since ``reset_peak_memory``: CUDA allocated and reserved; on CPU the process's peak RSS
    (since start, imports included, so it separates arms only when they differ by more than the baseline)."""
    if device.type == "cuda":
        return {"peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20,
                "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}
    import resource

    return {"peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB on Linux


def available_memory(device: torch.device) -> int:
    """Bytes free for data on ``device``: CUDA's free memory, or the host's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


# Dense (no sparsity) peak tensor/FMA throughput in TFLOP/s by dtype, from NVIDIA's datasheets. A name matches when
# every word of the key is in the device name (torch.cuda.get_device_name), first match wins: specific keys first.
# float16 is the tensor-core rate with float32 accumulation, which is what autocast's matmuls use.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
    "H100 PCIe": {"float16": 756.0, "bfloat16": 756.0, "tf32": 378.0, "float32": 51.2},
    "H100 HBM3": {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},  # SXM: "H100 80GB HBM3"
    "A100": {"float16": 312.0, "bfloat16": 312.0, "tf32": 156.0, "float32": 19.5},
    "A10": {"float16": 125.0, "bfloat16": 125.0, "tf32": 62.5, "float32": 31.2},
    "L40S": {"float16": 362.1, "bfloat16": 362.1, "tf32": 183.0, "float32": 91.6},
    "L4": {"float16": 121.0, "bfloat16": 121.0, "tf32": 60.0, "float32": 30.3},
    "V100": {"float16": 125.0, "float32": 15.7},
    "T4": {"float16": 65.0, "float32": 8.1},
}


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """The dense peak TFLOP/s of this GPU for ``dtype`` (float16 | bfloat16 | tf32 | float32); None for CPUs,
    unknown GPUs and dtypes the GPU has no rate for."""
    if device_name.startswith("CPU"):
        return None
    words = device_name.replace("-", " ").split()
    for key, peaks in GPU_PEAK_TFLOPS.items():
        if all(w in words for w in key.split()):
            return peaks.get(dtype)
    return None
