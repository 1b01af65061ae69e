"""Gradient telemetry: how many gradient elements float16 would flush to zero or overflow, per layer.

Sampled every ``telemetry_every`` steps (not every step). Counts accumulate on the device and are read once per
epoch. The thresholds are where a float32 value x lands when rounded to float16 (round to nearest, ties to even;
tested against ``tensor.half()`` on the float32 neighbours of each): |x| ≤ 2⁻²⁵ becomes 0 (half the smallest
subnormal 2⁻²⁴; the tie rounds to the even 0), |x| < 2⁻¹⁴ − 2⁻²⁵ becomes subnormal (fewer significant bits), and
|x| ≥ 65520 becomes inf (65504, the largest finite value, takes everything below).
"""

from __future__ import annotations

import torch
from torch import nn

FP16_ZERO_AT_OR_BELOW = 2.0**-25
FP16_SUBNORMAL_BELOW = 2.0**-14 - 2.0**-25  # the midpoint between the largest subnormal and 2⁻¹⁴ rounds up
FP16_INF_AT_OR_ABOVE = 65520.0  # the midpoint between 65504 and the next step, 65536, rounds up (to inf)

# Columns of the per-parameter count table.
_COLS = ("elements", "nonzero", "underflow", "subnormal", "overflow")


class GradProbe:
    """Accumulates float16 range statistics of a model's gradients over sampled steps.

    ``sample(model, scale)`` is called twice per sampled step: with the gradients as the scaler left them
    (``kind="scaled"``) and after unscaling (``kind="true"``). For arms without a scaler both are the same.
    """

    def __init__(self, model: nn.Module, device: torch.device):
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.numel = torch.tensor([float(p.numel()) for p in model.parameters() if p.requires_grad],
                                  device=device, dtype=torch.float64)
        shape = (len(self.names), len(_COLS))
        self.counts = {kind: torch.zeros(shape, device=device, dtype=torch.float64) for kind in ("true", "scaled")}
        self.norm_sum = torch.zeros((), device=device, dtype=torch.float64)
        self.samples = 0

    @torch.no_grad()
    def sample(self, model: nn.Module, kind: str) -> None:
        rows = []
        for p in model.parameters():
            if not p.requires_grad:
                continue
            g = p.grad.detach().abs().float() if p.grad is not None else torch.zeros(1, device=self.numel.device)
            nz = g != 0
            rows.append(torch.stack([
                nz.sum(),
                (nz & (g <= FP16_ZERO_AT_OR_BELOW)).sum(),
                (nz & (g < FP16_SUBNORMAL_BELOW)).sum(),
                (~torch.isfinite(g) | (g >= FP16_INF_AT_OR_ABOVE)).sum(),
            ]).double())
        self.counts[kind] += torch.cat([self.numel[:, None], torch.stack(rows)], dim=1)
        if kind == "true":
            grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
            norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
            self.norm_sum += torch.linalg.vector_norm(norms).double()
            self.samples += 1

    def epoch_summary(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """(global fractions for the history/metrics, per-layer fractions for the artifact); then reset."""
        glob: dict[str, float] = {}
        layers: dict[str, dict[str, float]] = {n: {} for n in self.names}
        for kind, counts in self.counts.items():
            c = counts.cpu()
            prefix = "scaled_grad" if kind == "scaled" else "grad"
            total = c.sum(dim=0)
            for key, col in (("underflow_frac", 2), ("subnormal_frac", 3)):
                glob[f"{prefix}_{key}"] = float(total[col] / total[1]) if total[1] > 0 else 0.0
            glob[f"{prefix}_overflow_frac"] = float(total[4] / total[0]) if total[0] > 0 else 0.0
            glob[f"{prefix}_zero_frac"] = float(1 - total[1] / total[0]) if total[0] > 0 else 0.0
            for name, row in zip(self.names, c, strict=True):
                layers[name][f"{prefix}_underflow_frac"] = float(row[2] / row[1]) if row[1] > 0 else 0.0
                layers[name][f"{prefix}_overflow_frac"] = float(row[4] / row[0]) if row[0] > 0 else 0.0
                layers[name][f"{prefix}_zero_frac"] = float(1 - row[1] / row[0]) if row[0] > 0 else 0.0
            counts.zero_()
        glob["grad_norm"] = float(self.norm_sum / self.samples) if self.samples else 0.0
        self.norm_sum.zero_()
        self.samples = 0
        return glob, layers
