"""The input pipeline: device tensors and streaming give the same batches; augmentation is paired across arms."""

from __future__ import annotations

import pytest
import torch

from ampbench.data import loader
from ampbench.data.loader import InputPipeline, index_batches, keep_on_device
from ampbench.data.splits import Norm, Split

CPU = torch.device("cpu")


def uint8_split(n=203, seed=0) -> Split:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
    return Split(x, torch.randint(0, 10, (n,), generator=g), Norm(1 / 255, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)))


def epoch_of(pipe: InputPipeline, seed=7, step=0):
    return [(b.x.clone(), b.y.clone(), b.size) for b in pipe.epoch(torch.Generator().manual_seed(seed), step)]


@pytest.mark.parametrize("augment", ["none", "crop_flip"])
@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_gives_the_device_paths_batches_bit_for_bit(augment, workers):
    split = uint8_split()
    common = {"batch_size": 32, "augment": augment, "seed": 3}
    fast = epoch_of(InputPipeline(split, CPU, on_device=True, **common))
    streamed = epoch_of(InputPipeline(split, CPU, on_device=False, workers=workers, **common))
    assert len(fast) == len(streamed) == len(index_batches(203, 32, torch.Generator())) == 7  # 6 full, one of 11
    for (xa, ya, na), (xb, yb, nb) in zip(fast, streamed, strict=True):
        assert xa.dtype == torch.float32 and torch.equal(xa, xb) and torch.equal(ya, yb) and na == nb


def test_batches_are_normalised_stored_values_in_the_epochs_order():
    split = uint8_split()
    batches = epoch_of(InputPipeline(split, CPU, on_device=True, batch_size=50, augment="none", seed=0))
    order = index_batches(203, 50, torch.Generator().manual_seed(7))
    for (x, y, _), idx in zip(batches, order, strict=True):
        assert torch.allclose(x, split.norm(split.x[idx])) and torch.equal(y, split.y[idx])


def test_augmentation_is_the_same_for_every_arm_of_a_seed_and_moves_pixels():
    split = uint8_split()

    def run(seed, augment="crop_flip", cast=lambda x: x):
        return epoch_of(InputPipeline(split, CPU, on_device=True, batch_size=64, augment=augment, seed=seed,
                                      cast=cast))

    fp32_arm, bf16_arm = run(1), run(1, cast=lambda x: x.bfloat16())  # the cast is the arm's, after augmenting
    assert all(torch.equal(a[0].bfloat16(), b[0]) for a, b in zip(fp32_arm, bf16_arm, strict=True))
    other_seed, plain = run(2), run(1, augment="none")
    assert not torch.equal(fp32_arm[0][0], other_seed[0][0]) and not torch.equal(fp32_arm[0][0], plain[0][0])
    assert all(torch.equal(a[1], b[1]) for a, b in zip(fp32_arm, plain, strict=True))  # labels untouched
    # A resumed run (step counter past the first epoch) continues with new draws, not the first epoch's.
    later = epoch_of(InputPipeline(split, CPU, on_device=True, batch_size=64, augment="crop_flip", seed=1), step=4)
    assert not torch.equal(fp32_arm[0][0], later[0][0])


def test_crop_flip_by_hand():
    x = torch.arange(2 * 1 * 5 * 6, dtype=torch.uint8).view(2, 1, 5, 6)
    out = loader.crop_flip(x, torch.tensor([[4, 4], [0, 8]]), torch.tensor([False, True]))
    assert torch.equal(out[0], x[0])  # offset (PAD, PAD), no flip: the image itself
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    assert torch.equal(out[1], padded[1, :, 0:5, 8:14].flip(-1))  # top-right crop, mirrored


def test_auto_keeps_small_sets_on_the_device_and_streams_large_ones(monkeypatch):
    split = uint8_split()
    assert keep_on_device(True, split, CPU) and not keep_on_device(False, split, CPU)
    assert keep_on_device("auto", split, CPU)
    monkeypatch.setattr(loader, "available_memory", lambda device: 1000)  # a "device" with 1 kB free
    assert not keep_on_device("auto", split, CPU)


def test_streaming_measures_the_wait_for_batches():
    pipe = InputPipeline(uint8_split(), CPU, on_device=False, workers=0, batch_size=16, augment="none", seed=0)
    epoch_of(pipe)
    assert pipe.wait_seconds > 0


def test_training_is_identical_on_both_paths():
    """Same seed, same batches: the device path and streaming train bitwise-identical weights on CPU."""
    from ampbench.config.params import TrainParams
    from ampbench.models.builtins import build_builtin
    from ampbench.precision.policy import resolve_policy
    from ampbench.training.loop import fit, init_state
    from ampbench.training.state import LoopConfig

    train, val = uint8_split(160), uint8_split(40, seed=1)
    weights = []
    for on_device in (True, False):
        torch.manual_seed(0)
        model = build_builtin("small_cnn", (3, 8, 8), 10, 8)
        policy = resolve_policy("fp32", CPU)
        cfg = LoopConfig(TrainParams(epochs=2, batch_size=32, progress=False, augment="crop_flip",
                                     loader_workers=1), seed=0, on_device=on_device)
        records = fit(init_state(model, policy, cfg, CPU), train, val, policy, cfg)
        assert records[-1].optimizer_steps == 5 and records[-1].input_wait_seconds >= 0
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
