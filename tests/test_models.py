"""The built-in models: shapes, and what train.width means for each (its default when null)."""

import pytest
import torch

from ampbench.models.builtins import DEFAULT_WIDTH
from ampbench.models.builtins import build_builtin as build_model


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(DEFAULT_WIDTH))
def test_every_model_maps_images_to_logits(name):
    model = build_model(name, (3, 16, 16), 7, 8).eval()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 7)


@pytest.mark.parametrize("name", sorted(DEFAULT_WIDTH))
def test_null_width_is_the_models_default(name):
    default, explicit = build_model(name, (1, 8, 8), 10, None), build_model(name, (1, 8, 8), 10, DEFAULT_WIDTH[name])
    assert [p.shape for p in default.parameters()] == [p.shape for p in explicit.parameters()]


def test_width_sets_each_models_first_layer():
    assert build_model("small_cnn", (1, 8, 8), 10, 12)[0].out_channels == 12
    assert build_model("mlp", (1, 8, 8), 10, 40)[1].out_features == 40  # hidden units, not a multiple of them
    stem = build_model("resnet18", (3, 32, 32), 10, 32)[0]
    assert stem.out_channels == 32 and stem.kernel_size == (3, 3) and stem.stride == (1, 1)


def test_resnet18_at_width_64_has_the_standard_resnet18_body():
    """Widths 64, 128, 256, 512 in four stages of two basic blocks: besides the stem (3×3 here, 7×7 in torchvision's
    ImageNet ResNet-18) and the head, the same parameters as torchvision's."""
    import torchvision

    ours = build_model("resnet18", (3, 32, 32), 10, 64)
    reference = torchvision.models.resnet18(num_classes=10)
    body = _params(ours) - _params(ours[0]) - _params(ours[-1])
    assert body == _params(reference) - _params(reference.conv1) - _params(reference.fc)
    assert _params(build_model("resnet18", (3, 32, 32), 10, 32)) < _params(ours) / 3  # width really changes it


def test_vit_tiny_learns_the_digits():
    """The built-in transformer trains on the default data on CPU in seconds (chance is 10%)."""
    from ampbench.config.params import PrepareParams, TrainParams
    from ampbench.data.prepare import prepare
    from ampbench.precision.policy import resolve_policy
    from ampbench.runtime.determinism import seed_everything
    from ampbench.training.loop import fit, init_state
    from ampbench.training.state import LoopConfig

    digits = prepare(PrepareParams(dataset="digits", max_train=480), None)
    seed_everything(0)
    policy = resolve_policy("fp32", torch.device("cpu"))
    model = build_model("vit_tiny", digits.input_shape, digits.num_classes, None, depth=2)
    cfg = LoopConfig(TrainParams(epochs=4, batch_size=32, progress=False))
    records = fit(init_state(model, policy, cfg, torch.device("cpu")), digits.train, digits.val, policy, cfg)
    assert records[-1].val_accuracy > 0.3 and records[-1].val_loss < records[0].val_loss


def test_vit_tiny_refuses_patches_that_do_not_tile_the_image():
    with pytest.raises(ValueError, match="does not split into 3×3 patches"):
        build_model("vit_tiny", (1, 8, 8), 10, None, patch_size=3)
    model = build_model("vit_tiny", (1, 9, 9), 10, 48, patch_size=3, depth=1, heads=3)
    assert model(torch.randn(2, 1, 9, 9)).shape == (2, 10)
