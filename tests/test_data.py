"""Data: deterministic splits, training-only normalisation, checksummed storage, clear errors."""

import json

import pytest
import torch

from ampbench.config.params import PrepareParams, SyntheticParams
from ampbench.data.prepare import load_prepared, prepare, save_prepared
from ampbench.errors import DataError


def test_digits_split_is_deterministic_and_disjoint(tmp_path):
    a = prepare(PrepareParams(dataset="digits", seed=3), tmp_path)
    b = prepare(PrepareParams(dataset="digits", seed=3), tmp_path)
    c = prepare(PrepareParams(dataset="digits", seed=4), tmp_path)
    assert a.meta["checksum"] == b.meta["checksum"] != c.meta["checksum"]
    assert sum(a.meta["sizes"].values()) == 1797  # the whole scikit-learn digits set
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    # No image appears in two splits.
    rows = {name: {tuple(x.flatten().tolist()) for x in getattr(a, name).x} for name in ("train", "val", "test")}
    assert not (rows["train"] & rows["test"]) and not (rows["train"] & rows["val"])
    assert a.train.x.dtype == torch.uint8 and a.meta["stored_dtype"] == "uint8"  # 8-bit stays 8-bit


def test_normalisation_uses_training_split_only(tmp_path):
    d = prepare(PrepareParams(dataset="digits"), tmp_path)
    train, test = d.train.inputs(), d.test.inputs()  # normalised on the fly from the stored uint8
    assert train.dtype == torch.float32
    assert train.mean().abs() < 1e-4
    assert train.std() == pytest.approx(1.0, abs=1e-3)
    assert test.mean().abs() > 1e-4  # test was shifted with train's statistics, so it is not exactly 0
    # The same as normalising float pixels by hand with the training split's statistics.
    pixels = d.train.x.double() / 16
    expected = (pixels - pixels.mean()) / pixels.std()
    assert torch.allclose(train.double(), expected, atol=1e-5)


def test_synthetic_is_configurable_and_learnable_shape(tmp_path):
    p = PrepareParams(dataset="synthetic", synthetic=SyntheticParams(image_size=12, channels=2, classes=5, count=300))
    d = prepare(p, tmp_path)
    assert d.input_shape == (2, 12, 12) and d.num_classes == 5
    assert sum(d.meta["sizes"].values()) == 300
    assert d.train.x.dtype == torch.float32 and d.train.y.dtype == torch.int64


def test_max_train_caps_training_split(tmp_path):
    d = prepare(PrepareParams(dataset="digits", max_train=100), tmp_path)
    assert len(d.train) == 100


def test_round_trip_and_corruption_detected(tmp_path):
    out = tmp_path / "prepared"
    save_prepared(prepare(PrepareParams(), tmp_path), out)
    loaded = load_prepared(out)
    assert loaded.meta["dataset"] == "digits" and len(loaded.test) == loaded.meta["sizes"]["test"]
    meta = json.loads((out / "meta.json").read_text())
    meta["checksum"] = "0" * 64
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="checksum mismatch"):
        load_prepared(out)
    (out / "test.pt").write_bytes(b"truncated")
    with pytest.raises(DataError, match="unreadable"):
        load_prepared(out)


def test_missing_prepared_data_says_what_to_run(tmp_path):
    with pytest.raises(DataError, match="run the prepare stage"):
        load_prepared(tmp_path / "nothing")


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10"])
def test_missing_publisher_files_give_one_clear_message(tmp_path, name):
    with pytest.raises(DataError) as err:
        prepare(PrepareParams(dataset=name, download=False), tmp_path / "raw")
    msg = str(err.value)
    assert str(tmp_path / "raw") in msg and "prepare.raw_dir" in msg and "prepare.download: true" in msg
    assert "\n" not in msg
