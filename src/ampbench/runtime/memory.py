"""Whether an arm's peak memory can be measured apart from the others' on a device: the one rule the harness's
memory pass, ``ampbench bench``'s table and the report's memory column follow. Torch-free.
"""

from __future__ import annotations


def per_arm(device_type: str) -> bool:
    """CUDA counts the process's own allocations and its peak counter can be reset, so an arm alone can be measured
    (``harness.isolated_memory``). Elsewhere the only figure is the process's peak RSS: a high-water mark that never
    goes down, and in a forked process (the preload server's stages) it counts only the pages that process
    touched, so it says nothing comparable about one arm."""
    return device_type == "cuda"


def why_not(device_type: str) -> str:
    """Why a device has no per-arm peak memory, in words (for a table's note)."""
    return (f"{device_type.upper()}: peak RSS is the process's high-water mark, never goes down and, in a forked "
            "process, counts only the pages it touched, so it cannot be attributed to one arm; peak memory and its "
            "ratios are given on CUDA only")
