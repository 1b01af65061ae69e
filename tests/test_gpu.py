"""GPU tests (marker ``gpu``; skipped without CUDA): what only a GPU can show — 16-bit training equivalent to fp32,
TF32 really on in the tf32 arm and really off in fp32 (matmuls and convolutions), 16-bit arms using less memory,
channels_last and torch.compile arms training."""

from __future__ import annotations

import pytest
import torch

from ampbench.config.params import TrainParams
from ampbench.data.splits import Norm, Split
from ampbench.models.builtins import build_builtin
from ampbench.precision.policy import resolve_policy
from ampbench.runtime.determinism import seed_everything
from ampbench.tasks.classification import predict
from ampbench.training.loop import fit, init_state
from ampbench.training.state import LoopConfig
from ampbench.verdict.metrics import arm_seed_metrics

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _learnable(n: int, seed: int) -> Split:
    """Images whose class is a bright quadrant (plus noise): a small CNN learns it in a few epochs."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randint(0, 80, (n, 3, 16, 16), generator=g, dtype=torch.uint8)
    for q in range(4):
        r, c = divmod(q, 2)
        x[y == q, :, 8 * r:8 * r + 8, 8 * c:8 * c + 8] += 150
    return Split(x, y, Norm(1 / 255, (0.4,) * 3, (0.3,) * 3))


def _train(arm: str, train: Split, val: Split, **train_args):
    seed_everything(0)
    policy = resolve_policy(arm, CUDA)
    policy.apply_backend_flags()
    model = policy.prepare_model(build_builtin("small_cnn", (3, 16, 16), 4, 16).to(CUDA))
    if train_args.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    tp = TrainParams(epochs=3, batch_size=64, lr=0.01, progress=False, **train_args)
    cfg = LoopConfig(tp, seed=0)
    state = init_state(model, policy, cfg, CUDA)
    if tp.compile:
        state.model = torch.compile(model)
    records = fit(state, train, val, policy, cfg)
    return model, policy, records


@pytest.fixture(scope="module")
def data():
    return _learnable(2048, 0), _learnable(512, 1), _learnable(1024, 2)


@pytest.mark.parametrize("arm", ["fp16", "bf16"])
def test_16bit_training_on_cuda_ends_equivalent_to_fp32(data, arm):
    train, val, test = data
    ref_model, ref_policy, _ = _train("fp32", train, val)
    ref = predict(ref_model, test, ref_policy, 512)
    model, policy, records = _train(arm, train, val)
    own = predict(model, test, policy, 512)
    f32 = predict(model, test, resolve_policy("fp32", CUDA), 512)
    m = arm_seed_metrics(own, f32, ref, test.y.to(CUDA))
    assert (ref.argmax(1) == test.y.to(CUDA)).float().mean() > 0.9, "the fp32 reference must learn the task"
    assert abs(m["delta_accuracy_vs_fp32"]) <= 0.03 and m["agreement_vs_fp32"] >= 0.95
    assert sum(r.skipped_steps for r in records) <= 3  # a healthy scaler: at most the first steps skipped


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((2048, 2048), (2048, 2048), (16, 64, 32, 32), (64, 64, 3, 3))
    return tuple(torch.randn(*s, device=CUDA, generator=g).to(dtype) for s in shapes)


def _products(arm: str | None) -> list[torch.Tensor]:
    """A large matmul and a convolution: in float32 under ``arm``'s backend flags, or in float64 (None)."""
    if arm is not None:
        resolve_policy(arm, CUDA).apply_backend_flags()
    a, b, x, w = _operands(torch.float32 if arm else torch.float64)
    return [(a @ b).double(), torch.nn.functional.conv2d(x, w, padding=1).double()]


def test_tf32_is_really_on_in_tf32_and_really_off_in_fp32():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability ≥ 8.0")
    truth, fp32, tf32 = _products(None), _products("fp32"), _products("tf32")
    for name, ref, e, t in zip(("matmul", "conv"), truth, fp32, tf32, strict=True):
        err_fp32 = ((e - ref).abs().max() / ref.abs().max()).item()
        err_tf32 = ((t - ref).abs().max() / ref.abs().max()).item()
        assert err_fp32 < 1e-5, f"{name}: the fp32 arm computed with reduced precision ({err_fp32:.1e})"
        assert err_tf32 > 1e-4, f"{name}: the tf32 arm did not use TF32 ({err_tf32:.1e})"


def test_16bit_arms_need_less_memory_than_fp32_for_resnet18_at_batch_512():
    from ampbench.bench.config import BenchConfig
    from ampbench.bench.loop import measure

    cfg = BenchConfig(device="cuda", model="resnet18", image_size=32, channels=3, batch_size=512, steps=6,
                      rounds=1, window=2, warmup_steps=2, arms=["fp32", "fp16", "bf16"], overhead_arms=[],
                      mlflow=False)
    arms = measure(cfg)["arms"]
    for arm in ("fp16", "bf16"):
        assert arms[arm]["memory_vs_fp32"] < 1.0, f"{arm}: {arms[arm]['memory_vs_fp32']:.2f}× fp32's peak memory"


@pytest.mark.parametrize("options", [{"channels_last": True}, {"compile": True}])
def test_channels_last_and_compiled_arms_train(data, options):
    train, val, _ = data
    _, _, records = _train("bf16", train, val, **options)
    assert records[-1].val_accuracy > 0.9 and records[-1].train_loss < records[0].train_loss


@pytest.mark.parametrize("arm, dtype", [("fp32", "float32"), ("tf32", "tf32"), ("fp16", "float16"),
                                        ("bf16", "bfloat16")])
def test_flops_are_counted_in_the_dtype_the_gpu_computed_in(arm, dtype):
    """Proof of what ran on CUDA: every matmul/conv FLOP of small_cnn in the arm's dtype, TF32 only in tf32."""
    from ampbench.training.flops import count_step_flops

    policy = resolve_policy(arm, CUDA)
    policy.apply_backend_flags()
    model = policy.prepare_model(build_builtin("small_cnn", (3, 16, 16), 4, 16).to(CUDA))
    counted = count_step_flops(model, policy, torch.randn(8, 3, 16, 16, device=CUDA),
                               torch.randint(0, 4, (8,), device=CUDA))
    assert counted["total"] > 0 and counted["by_dtype"] == {dtype: counted["total"]}
