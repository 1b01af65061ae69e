"""The tutorial's numerical claims, measured: fp16 gradients underflow, the scaler prevents it, and guards."""

import math

import pytest
import torch

from ampbench.config.params import DivergenceParams, GradScalerParams, TrainParams
from ampbench.data.splits import Split
from ampbench.errors import Diverged
from ampbench.precision.policy import resolve_policy
from ampbench.tasks.classification import predict
from ampbench.training.loop import fit, init_state
from ampbench.training.state import LoopConfig

CPU = torch.device("cpu")


def _blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = (y.float() * 2 - 1)[:, None, None, None] + 0.8 * torch.randn(n, 1, 4, 4, generator=g)
    return Split(x, y)


def _run(arm, **train):
    """Train a small MLP on blobs under ``arm`` with these train params; returns (last epoch's record, val
    accuracy, model)."""
    torch.manual_seed(0)
    policy = resolve_policy(arm, CPU)
    model = policy.prepare_model(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                                     torch.nn.Linear(16, 2)))
    # No weight decay: with Adam its L2 term would give every parameter a gradient even when backward gave none.
    cfg = LoopConfig(TrainParams(**{"epochs": 3, "batch_size": 32, "lr": 0.01, "optimizer": "adam",
                                    "weight_decay": 0.0, "scheduler": "constant", "telemetry_every": 1,
                                    "progress": False, **train}))
    state = init_state(model, policy, cfg, CPU)
    train_split, val = _blobs(256, 0), _blobs(128, 1)
    records = fit(state, train_split, val, policy, cfg)
    acc = (predict(model, val.x, policy, 512).argmax(1) == val.y).float().mean().item()
    return records[-1], acc, model


# Loss × 2**-20: the gradient reaching the logits is ~1e-8, below 2**-25 ≈ 3e-8, which fp16 rounds to zero.
TINY_LOSS = {"loss_multiplier": 2.0**-20}


def test_fp16_without_scaler_underflows_and_the_scaler_fixes_it():
    h32, acc32, _ = _run("fp32", **TINY_LOSS)
    hn, acc_noscaler, _ = _run("fp16_noscaler", **TINY_LOSS)
    hs, acc_scaled, _ = _run("fp16", **TINY_LOSS)
    h32, hn, hs = h32.row(), hn.row(), hs.row()

    # The true gradients are tiny: fp16 would flush a large share of them to zero.
    assert h32["grad_underflow_frac"] > 0.2
    # Without a scaler they did flush: the backward pass in fp16 produced (almost) only zeros, nothing learned.
    assert hn["grad_zero_frac"] > 0.95
    assert acc_noscaler < acc32 - 0.2
    # With the scaler, the gradients as stored during backward are inside fp16's range...
    assert hs["scaled_grad_underflow_frac"] < 0.01 and hs["grad_zero_frac"] < 0.5
    # ...the true ones (after unscaling) are as tiny as fp32's, and the model learns like fp32.
    assert hs["grad_underflow_frac"] > 0.2
    assert acc32 > 0.85 and abs(acc_scaled - acc32) <= 0.05


def _neighbours(x: float) -> list[float]:
    """x and the float32 values just below and above it."""
    t = torch.tensor(x, dtype=torch.float32)
    return [torch.nextafter(t, torch.tensor(-math.inf)).item(), x, torch.nextafter(t, torch.tensor(math.inf)).item()]


def test_fp16_limits_are_where_half_rounds():
    """The probe's thresholds against torch's own float32 → float16 rounding, at the float32 neighbours of each."""
    from ampbench.training import gradients

    values = [v for limit in (gradients.FP16_ZERO_AT_OR_BELOW, 2.0**-24, gradients.FP16_SUBNORMAL_BELOW, 2.0**-14,
                              65504.0, gradients.FP16_INF_AT_OR_ABOVE) for v in _neighbours(limit)]
    for v in values:
        h = torch.tensor(v, dtype=torch.float32).half()
        assert (h == 0).item() == (v <= gradients.FP16_ZERO_AT_OR_BELOW), v
        assert torch.isinf(h).item() == (v >= gradients.FP16_INF_AT_OR_ABOVE), v
        assert (0 < h.item() < 2.0**-14) == (gradients.FP16_ZERO_AT_OR_BELOW < v < gradients.FP16_SUBNORMAL_BELOW), v
    # The probe counts exactly these: gradients placed on every neighbour, counted as fp16 would treat them.
    p = torch.nn.Parameter(torch.zeros(len(values)))
    p.grad = torch.tensor(values)
    model = torch.nn.Module()
    model.p = p
    probe = gradients.GradProbe(model, CPU)
    probe.sample(model, "true")
    _, layers = probe.epoch_summary()
    half = p.grad.half()
    assert layers["p"]["grad_underflow_frac"] == (half == 0).sum().item() / len(values)
    assert layers["p"]["grad_overflow_frac"] == torch.isinf(half).sum().item() / len(values)


def test_normal_loss_has_no_fp16_underflow_worth_mentioning():
    record, _, _ = _run("fp16")
    assert record.grads["scaled_grad_underflow_frac"] < 0.01
    assert record.grads["scaled_grad_overflow_frac"] == 0.0


def test_reported_losses_are_unscaled():
    """train.loss_multiplier shrinks the gradients, not the reported losses: train and val loss stay comparable."""
    plain, _, _ = _run("fp32", epochs=1)
    shrunk, _, _ = _run("fp32", epochs=1, loss_multiplier=2.0**-20)
    # Same initial weights and data: the first step's loss (before any update) is the same number, not 2**-20 of it.
    assert shrunk.steps[0]["loss"] == plain.steps[0]["loss"] > 0.1
    assert 0.1 < shrunk.train_loss < 10 and 0.1 < shrunk.val_loss < 10


@pytest.mark.parametrize("arm", ["fp16_pure", "bf16_pure"])
def test_pure_ablations_train_in_16_bit_weights(arm):
    record, acc, model = _run(arm)
    # An easy task they do learn (what they lose is small updates, which round away: test_tutorial_claims), and
    # the epoch's validation accuracy is the one predict() gives for the final weights.
    assert record.epoch == 3 and acc == record.val_accuracy > 0.9
    expected = torch.float16 if arm == "fp16_pure" else torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {expected}  # no fp32 master weights


def test_collapsing_loss_scale_stops_the_arm():
    with pytest.raises(Diverged, match="loss scale collapsed"):
        _run("fp16", grad_scaler=GradScalerParams(init_scale=2.0**100),
             divergence=DivergenceParams(min_loss_scale=2.0**97))


def test_long_run_of_skips_stops_the_arm():
    with pytest.raises(Diverged, match="in a row skipped"):
        _run("fp16", grad_scaler=GradScalerParams(init_scale=2.0**100),
             divergence=DivergenceParams(max_consecutive_skips=4))


def test_non_finite_loss_without_scaler_stops_the_arm():
    with pytest.raises(Diverged, match="loss became"):
        _run("bf16_pure", lr=1e30)  # no validation here: TrainParams would refuse lr > 10


def test_clipping_applies_to_true_gradients():
    # A scaled gradient is 2**16 × the true one: clipping before unscale_ would shrink steps to nothing.
    clipped, acc, _ = _run("fp16", clip_grad_norm=1.0)
    assert acc > 0.85
    assert clipped.grads["grad_norm"] < 1e3  # the probe reads true norms, not 2**16-scaled ones
