"""The loop's side concerns on their own: timing windows after warm-up, and the scaler's health."""

import pytest
import torch

from ampbench.config.params import DivergenceParams
from ampbench.errors import Diverged
from ampbench.training.instruments import ScalerHealth, WindowTimer

CPU = torch.device("cpu")


def test_windows_skip_warm_up_and_never_span_an_epoch():
    timer = WindowTimer(CPU, window=3, warmup_steps=4)
    timer.start()
    for step in range(1, 11):  # windows of steps 1–3, 4–6, 7–9: only the last lies wholly after the 4 warm-up steps
        timer.tick(8, step)
    assert len(timer.take()) == 1 and timer.take() == []
    timer.start()  # a new epoch: step 10's open window is dropped, counting starts again
    for step in range(11, 14):
        timer.tick(8, step)
    (rate,) = timer.take()
    assert rate > 0


def test_a_resumed_run_is_already_past_its_warm_up():
    timer = WindowTimer(CPU, window=2, warmup_steps=100)
    timer.start()
    timer.tick(4, 501)  # the run's step count, not the process's: 500 steps were done before the interruption
    timer.tick(4, 502)
    assert len(timer.windows) == 1


def _scaler(init_scale: float) -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=init_scale)


def test_health_counts_skips_and_runs_of_skips():
    scaler = _scaler(2.0**20)
    health = ScalerHealth("fp16", scaler, DivergenceParams(max_consecutive_skips=3), CPU)
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for grad in (float("inf"), float("inf"), 1.0, float("inf")):  # skip, skip, step, skip
        with health.watch():
            w.grad = torch.tensor([grad])
            scaler.step(opt)
            scaler.update()
    assert health.skipped_steps() == 3 and int(health.longest) == 2
    health.check(torch.tensor(1.0), "here")  # 2 in a row < 3: healthy
    with health.watch():
        w.grad = torch.tensor([float("inf")])
        scaler.step(opt)
        scaler.update()
    with health.watch():
        w.grad = torch.tensor([float("inf")])
        scaler.step(opt)
        scaler.update()
    with pytest.raises(Diverged, match="fp16: here: 3 optimizer steps in a row skipped"):
        health.check(torch.tensor(1.0), "here")


def test_without_a_scaler_a_non_finite_loss_is_divergence():
    health = ScalerHealth("bf16", torch.amp.GradScaler("cpu", enabled=False), DivergenceParams(), CPU)
    assert health.loss_scale == 1.0 and health.skipped_steps() == 0
    health.check(torch.tensor(3.0), "epoch 1")
    with pytest.raises(Diverged, match="loss became nan"):
        health.check(torch.tensor(float("nan")), "epoch 1")


def test_epoch_line_says_where_how_well_how_fast_and_how_long():
    from types import SimpleNamespace

    from ampbench.training.instruments import epoch_line

    record = SimpleNamespace(epoch=3, train_loss=0.41234, val_accuracy=0.9631, samples_per_s=12345.6,
                             epoch_seconds=20.0)
    assert epoch_line("seed 1", record, 8, 13) == (
        "seed 1 epoch 3/8: train_loss 0.4123, val_accuracy 0.9631, 12,346 samples/s, 4m20s left for this arm")
    assert epoch_line("seed 0", record, 8, 200).endswith("1h06m left for this arm")
