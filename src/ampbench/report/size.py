"""What a request far larger than the default is told while it trains: its plan before the first seed (200 seeds
start 400 runs without a word otherwise) and, after the first epoch, the time it will take at that pace."""

from __future__ import annotations

from ampbench.config.params import Params, TrainParams
from ampbench.training.state import EpochRecord

LARGE_REQUEST = 10  # × the default run's arms × seeds × epochs: beyond it, the plan and its estimate are printed


def _epoch_units(train: TrainParams) -> int:
    return len(train.precisions) * len(train.seeds) * train.epochs


def request_size(params: Params) -> str | None:
    """The plan line of a request far larger than the default; None for any other."""
    units, default = _epoch_units(params.train), _epoch_units(TrainParams())
    if units <= LARGE_REQUEST * default:
        return None
    tp, d = params.train, TrainParams()
    arms = len(tp.precisions)
    return (f"plan: {arms} arm{'s' * (arms != 1)} × {len(tp.seeds)} seeds × {tp.epochs} epochs = {units:,} epochs of "
            f"training, {units / default:.0f}× the default run ({len(d.precisions)} arms × {len(d.seeds)} seeds × "
            f"{d.epochs} epochs); the time it takes is estimated after the first epoch")


def estimate(record: EpochRecord, params: Params) -> str:
    """After the first epoch of a large request: this arm's time and all arms' at its pace."""
    tp = params.train
    arm_s = record.epoch_seconds * len(tp.seeds) * tp.epochs

    def hm(seconds: float) -> str:
        m = round(seconds / 60)
        return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{max(m, 1)} min"

    return (f"estimate: this arm about {hm(arm_s)} ({len(tp.seeds) * tp.epochs:,} epochs at "
            f"{record.epoch_seconds:.1f} s), every arm about {hm(arm_s * len(tp.precisions))} at this arm's pace")
