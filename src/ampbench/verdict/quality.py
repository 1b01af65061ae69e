"""Time to fp32's quality: what a user gains is not speed per step but time to the same model. For each arm and
seed, the optimizer steps at which its validation loss first reaches fp32's final validation loss of the same seed
(within the loss margin, ``evaluate.margin.loss``: a difference the verdicts count as none, so an arm as good as
fp32 gets there instead of missing it by noise half the time), or never; fp32 itself is measured the same way.

Time is steps × the arm's time per step from the speed stage (every arm timed interleaved in one process), so it
inherits that measurement's robustness to other load; the ratio to fp32 is (steps ratio) / (speed × fp32). The
training processes' own wall time at those steps is kept as the secondary figure. Torch-free; no files.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any


def first_reaching(points: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """The first evaluation point whose validation loss is at most ``target`` (None: never)."""
    return next((p for p in points if p["val_loss"] <= target), None)


def seed_quality(arm: list[dict[str, float]], fp32: list[dict[str, float]], margin: float,
                 speedup: float | None) -> dict[str, Any]:
    """One seed: the target, the steps and training seconds at which the arm and fp32 first reach it, and the
    ratios to fp32 (``speedup``: the arm's speed × fp32, for the time ratio)."""
    target = fp32[-1]["val_loss"] + margin
    mine, ref = first_reaching(arm, target), first_reaching(fp32, target)
    out: dict[str, Any] = {"target_val_loss": target, "steps": mine and mine["step"],
                           "train_seconds": mine and mine["seconds"], "fp32_steps": ref["step"],
                           "fp32_train_seconds": ref["seconds"]}
    if mine:
        out["steps_vs_fp32"] = mine["step"] / ref["step"]
        out["time_vs_fp32"] = out["steps_vs_fp32"] / speedup if speedup else None
        out["train_time_vs_fp32"] = mine["seconds"] / ref["seconds"] if ref["seconds"] > 0 else None
    return out


@dataclass(frozen=True)
class ArmQuality:
    """Every seed of one arm (seed → ``seed_quality``), and the medians over seeds when every seed reached the
    target (else None, with how many did)."""

    per_seed: dict[str, dict[str, Any]]
    seeds_reached: int
    seeds: int
    steps_vs_fp32: float | None
    time_vs_fp32: float | None
    train_time_vs_fp32: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arm_quality(arm: dict[str, list], fp32: dict[str, list], margin: float, speedup: float | None) -> ArmQuality:
    """One arm's time to fp32's quality (``arm``/``fp32``: seed → evaluation points)."""
    per_seed = {seed: seed_quality(arm[seed], fp32[seed], margin, speedup)
                for seed in sorted(arm, key=int) if arm[seed] and fp32.get(seed)}
    reached = [q for q in per_seed.values() if q["steps"] is not None]
    every = bool(per_seed) and len(reached) == len(per_seed)

    def median(key: str) -> float | None:
        values = [q.get(key) for q in reached]
        return statistics.median(values) if every and None not in values else None

    return ArmQuality(per_seed, len(reached), len(per_seed), median("steps_vs_fp32"), median("time_vs_fp32"),
                      median("train_time_vs_fp32"))


def text(q: ArmQuality | None) -> str:
    """The report's cell: the time ratio, or never in how many seeds."""
    if not q or not q.seeds:
        return "n/a"
    if q.seeds_reached < q.seeds:
        return f"never in {q.seeds - q.seeds_reached} of {q.seeds} seed{'s' * (q.seeds != 1)}"
    return "n/a" if q.time_vs_fp32 is None else f"{q.time_vs_fp32:.2f}×"


def curve_rows(arm: str, points: dict[str, list], seconds_per_step: float | None) -> list[dict[str, Any]]:
    """Validation loss against time for the DVC plot and the figure: one row per evaluation point, time as steps ×
    the arm's interleaved time per step (the training processes' own seconds when there is none)."""
    rows = []
    for seed in sorted(points, key=int):
        for p in points[seed]:
            seconds = p["step"] * seconds_per_step if seconds_per_step else p["seconds"]
            rows.append({"run": f"{arm}-seed{seed}", "arm": arm, "seed": int(seed), "step": p["step"],
                         "seconds": round(seconds, 6), "val_loss": p["val_loss"]})
    return rows


def quality_metrics(q: ArmQuality | None, seed: int) -> dict[str, float]:
    """One seed's time to fp32's quality as MLflow metrics: the steps, and the ratio to fp32's time."""
    mine = (q.per_seed.get(str(seed)) if q else None) or {}
    out = {}
    if mine.get("steps") is not None:
        out["steps_to_fp32_quality"] = mine["steps"]
        if mine.get("time_vs_fp32") is not None:
            out["time_to_fp32_quality_x"] = round(mine["time_vs_fp32"], 4)
    return out
