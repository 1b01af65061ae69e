"""What ``ampbench bench`` measures, as one dataclass the command line fills and the loop (``loop.py``) reads.

Torch-free, so the command line can show its defaults without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ampbench.config.arms import BASELINE, MAIN
from ampbench.speed.budget import Sizes

OVERHEAD_GOAL = 1.03  # pipeline step time / bare loop step time
LOGGING_GOAL = 0.02  # logging time / training time
# The overhead check adds rounds while its verdict (or the logging share's) is undecided: up to this many times
# --rounds in all, or until a loop's budget ends (without a budget, this bounds it).
OVERHEAD_MOST_ROUNDS = 4


@dataclass
class BenchConfig:
    device: str = "auto"
    task: str = "classification"  # or language_model: random token sequences of block_size, model gpt
    block_size: int = 64  # language_model: tokens per sequence
    model: str = "small_cnn"
    width: int = 32
    image_size: int = 16
    channels: int = 3
    classes: int = 10
    batch_size: int = 128
    steps: int = 30  # optimizer steps per round (one "epoch" of the pipeline loop)
    rounds: int = 5  # A/B rounds, interleaved
    window: int = 10  # steps per timing window
    warmup_steps: int = 10
    arms: list[str] = field(default_factory=lambda: list(MAIN))
    overhead_arms: list[str] = field(default_factory=lambda: [BASELINE])
    channels_last: bool = False
    compile: bool = False
    sync_debug: bool = False  # CUDA only: steady-state steps under torch.cuda.set_sync_debug_mode("error")
    mlflow: bool = True  # time real MLflow logging (SQLite in a temp dir) when mlflow is installed
    # Wall seconds each arm may spend on everything it runs (building, its first two steps, warm-up, rounds, FLOP
    # count, memory; each loop of the overhead check has its own): speed/budget.py's rule. None: every phase in
    # full. On CPU fp16 autocast can run at 1% of fp32 (AVX512-FP16 machines): without a budget it takes the bench.
    arm_budget: float | None = 20.0

    def sizes(self) -> Sizes:
        """What the speed harness runs: ``rounds`` measured rounds after a warm-up round (``ParamsError`` naming
        the first size that cannot measure)."""
        return Sizes(self.rounds, self.steps, self.window, self.warmup_steps, self.arm_budget)
