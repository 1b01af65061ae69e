"""The training loop: the tutorial's step order, learning, and scaler telemetry."""

import pytest
import torch

from ampbench.config.params import GradScalerParams, TrainParams
from ampbench.data.splits import Split
from ampbench.precision.policy import resolve_policy
from ampbench.training import step
from ampbench.training.loop import fit, init_state, throughput
from ampbench.training.state import LoopConfig

CPU = torch.device("cpu")


def _blobs(n=256, seed=0):
    """Two-class 1×4×4 images: class mean ±1 plus noise; learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = (y.float() * 2 - 1)[:, None, None, None] + 0.8 * torch.randn(n, 1, 4, 4, generator=g)
    return Split(x, y)


def test_step_follows_the_tutorial_order(monkeypatch):
    calls = []
    policy = resolve_policy("fp16", CPU)
    real_scaler = policy.grad_scaler()

    class SpyScaler:
        def is_enabled(self):
            return True

        def scale(self, loss):
            calls.append("scale")
            scaled = real_scaler.scale(loss)
            scaled.register_hook(lambda g: calls.append("backward"))
            return scaled

        def step(self, opt):
            calls.append("step")
            return real_scaler.step(opt)

        def update(self):
            calls.append("update")
            real_scaler.update()

    class SpyAutocast:
        def __enter__(self):
            calls.append("autocast_enter")
            self.ctx = torch.autocast("cpu", dtype=torch.float16)
            self.ctx.__enter__()

        def __exit__(self, *exc):
            calls.append("autocast_exit")
            return self.ctx.__exit__(*exc)

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    model.register_forward_hook(lambda *a: calls.append("forward"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    orig_zero = opt.zero_grad
    monkeypatch.setattr(opt, "zero_grad", lambda **kw: (calls.append("zero_grad"), orig_zero(**kw)))
    monkeypatch.setattr(type(policy), "autocast", lambda self: SpyAutocast())
    data = _blobs(8)
    loss, logits = step.train_step(model, opt, SpyScaler(), policy, data.x, data.y, TrainParams())
    assert calls == ["zero_grad", "autocast_enter", "forward", "autocast_exit", "scale", "backward", "step", "update"]
    assert loss.dtype == torch.float32  # loss computed inside autocast stays float32


@pytest.mark.parametrize("arm", ["fp32", "bf16", "fp16"])
def test_fit_learns_and_reports_each_epoch(arm):
    torch.manual_seed(0)
    policy = resolve_policy(arm, CPU)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    cfg = LoopConfig(TrainParams(epochs=3, batch_size=32, lr=0.05, scheduler="constant", progress=False))
    state = init_state(model, policy, cfg, CPU)
    seen = []
    records = fit(state, _blobs(), _blobs(64, seed=1), policy, cfg, on_epoch=lambda rec, st: seen.append(rec))
    assert seen == records and [r.epoch for r in records] == [1, 2, 3] and state.epoch == 3
    assert records[-1].train_loss < records[0].train_loss
    assert records[-1].val_accuracy > 0.85
    assert throughput(records) > 0
    assert set(records[0].row()) >= {"train_loss", "val_loss", "val_accuracy", "samples_per_s", "loss_scale",
                                     "skipped_steps", "grad_underflow_frac"}
    # 256 samples in batches of 32: 8 steps an epoch; telemetry samples every 10th step of an epoch (its first).
    assert [[s["step"] for s in r.steps] for r in records] == [[1], [9], [17]]


def test_scaler_skips_overflowing_steps_and_counts_them():
    torch.manual_seed(0)
    policy = resolve_policy("fp16", CPU)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    # A scale of 2**100 overflows fp16 (max 65504) at once: the scaler must skip and halve until it fits.
    cfg = LoopConfig(TrainParams(epochs=2, batch_size=32, lr=0.01, optimizer="sgd", scheduler="cosine",
                                 grad_scaler=GradScalerParams(init_scale=2.0**100, growth_interval=10_000),
                                 progress=False))
    state = init_state(model, policy, cfg, CPU)
    before = [p.detach().clone() for p in model.parameters()]
    first, second = fit(state, _blobs(), _blobs(64, seed=1), policy, cfg)
    # 256 samples / 32 = 8 steps an epoch, each overflows (the scale only halves per skip): all skipped,
    # the scale went down by 2**8 per epoch, and no step touched the weights.
    assert first.skipped_steps == 8 and second.skipped_steps == 8
    assert first.loss_scale == 2.0**92 and second.loss_scale == 2.0**84
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # No optimizer step happened, so the LR schedule did not advance either.
    assert first.lr == 0.01 and state.scheduler.last_epoch == 0


def test_no_skips_when_scale_fits():
    torch.manual_seed(0)
    policy = resolve_policy("fp16", CPU)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    cfg = LoopConfig(TrainParams(epochs=1, batch_size=32, lr=0.01, optimizer="sgd", scheduler="constant",
                                 grad_scaler=GradScalerParams(init_scale=2.0**8), progress=False))
    state = init_state(model, policy, cfg, CPU)
    (record,) = fit(state, _blobs(), _blobs(64, seed=1), policy, cfg)
    assert record.skipped_steps == 0
    assert record.loss_scale == 2.0**8


def test_validation_losses_between_steps_leave_training_bitwise_unchanged():
    """Issue 26: validation every 3 optimizer steps (a model with dropout and BatchNorm, which an evaluation left in
    eval mode would change) gives the same weights, bit for bit, as validation at epoch ends only; the points are
    at steps 3, 6 and each epoch's end, and the time spent validating is not counted as training time."""
    from ampbench.stages.seed_record import evaluation_points

    def run(every: int):
        torch.manual_seed(0)
        policy = resolve_policy("bf16", CPU)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16),
                                    torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
        cfg = LoopConfig(TrainParams(epochs=2, batch_size=32, lr=0.05, progress=False), eval_every=every)
        state = init_state(model, policy, cfg, CPU)
        return model, fit(state, _blobs(), _blobs(64, seed=1), policy, cfg)

    plain, plain_records = run(0)
    evaluated, records = run(3)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), evaluated.state_dict().values(),
                                                 strict=True))
    # 8 steps an epoch: every third step within an epoch (3, 6; then 9, 12, 15), and each epoch's end (8, 16).
    assert [[e["step"] for e in r.evaluations] for r in records] == [[3, 6, 8], [9, 12, 15, 16]]
    assert [[e["step"] for e in r.evaluations] for r in plain_records] == [[8], [16]]
    assert records[-1].evaluations[-1]["val_loss"] == records[-1].val_loss
    points = evaluation_points(records)
    assert [p["step"] for p in points] == [3, 6, 8, 9, 12, 15, 16]
    seconds = [p["seconds"] for p in points]
    assert seconds == sorted(seconds) and seconds[2] == pytest.approx(records[0].epoch_seconds)
