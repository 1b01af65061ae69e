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


CAP_FACTORY = """import torch

class Images:
    def __init__(self, n, offset):
        self.n, self.offset = n, offset
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.full((1, 4, 4), (self.offset + i) % 256, dtype=torch.uint8), i % 2

def build():
    return {"train": Images(200, 0), "val": Images(400, 1), "test": Images(300, 2)}
"""


def _capped(kind: str, tmp_path, monkeypatch, **caps) -> dict:
    """meta.json of ``kind`` (cut from the data, text tokens, a factory's own splits) prepared with ``caps``."""
    if kind == "text":
        (tmp_path / "t.txt").write_text("the cat sees a ball. " * 1000)  # 21,000 tokens
        return prepare(PrepareParams(dataset="text", **caps), tmp_path / "t.txt").meta
    if kind == "factory":
        (tmp_path / "capfactory.py").write_text(CAP_FACTORY)
        monkeypatch.syspath_prepend(str(tmp_path))
        return prepare(PrepareParams(dataset="capfactory:build", **caps), tmp_path).meta
    return prepare(PrepareParams(dataset="digits", **caps), tmp_path).meta


@pytest.mark.parametrize("kind, unit", [("digits", "samples"), ("text", "tokens"), ("factory", "samples")])
def test_every_split_has_a_cap_for_every_kind_of_data_and_its_uncut_size_is_recorded(tmp_path, monkeypatch, kind,
                                                                                     unit):
    from ampbench.data.prepare import cut_notes

    uncut = _capped(kind, tmp_path, monkeypatch)["sizes"]
    meta = _capped(kind, tmp_path, monkeypatch, max_train=100, max_val=50, max_test=60)
    assert meta["sizes"] == {"train": 100, "val": 50, "test": 60}
    assert [meta[f"{s}_available"] for s in ("train", "val", "test")] == [uncut[s] for s in ("train", "val", "test")]
    notes = " ".join(cut_notes(meta))
    assert (f"train to 100 of {uncut['train']:,} {unit} (prepare.max_train)" in notes
            and f"validation to 50 of {uncut['val']:,} {unit} (prepare.max_val)" in notes
            and f"test to 60 of {uncut['test']:,} {unit} (prepare.max_test)" in notes), notes
    # A cap at or above a split's size cuts nothing and says nothing; the default run's meta gains no key.
    loose = _capped(kind, tmp_path, monkeypatch, max_val=uncut["val"])
    assert loose["sizes"] == uncut and "val_available" not in loose and "train_available" not in loose


def test_a_capped_split_file_holds_only_what_it_keeps(tmp_path):
    (tmp_path / "t.txt").write_text("the cat sees a ball. " * 20000)  # 420,000 tokens
    p = PrepareParams(dataset="text", max_train=1000, max_val=1000, max_test=1000)
    save_prepared(prepare(p, tmp_path / "t.txt"), tmp_path / "prepared")
    for name in ("train", "val", "test"):  # a view of the uncut text would write all of it into the file
        assert (tmp_path / "prepared" / f"{name}.pt").stat().st_size < 10_000, name
    assert len(load_prepared(tmp_path / "prepared").train) == 1000


def test_validation_far_larger_than_training_is_said_at_prepare(tmp_path):
    import yaml
    from click.testing import CliRunner

    from conftest import TINY
    from test_cli import _stage

    (tmp_path / "t.txt").write_text("the cat sees a ball. " * 2000)  # 42,000 tokens: val 6,300 (15%)
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["prepare"].update({"dataset": "text", "raw_dir": str(tmp_path / "t.txt"), "max_train": 300})
    params["train"].update({"task": "language_model", "model": "gpt"})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "prepared")]
    out = CliRunner().invoke(_stage("prepare"), args).output
    assert "Validation holds 21× the training tokens (6,300 against 300)" in out and "prepare.max_val" in out, out
    assert "train to 300 of 29,400 tokens (prepare.max_train)" in out, out
    params["prepare"]["max_val"] = 600  # capped: said as a cut, no longer as a warning
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = CliRunner().invoke(_stage("prepare"), args).output
    assert "validation to 600 of 6,300 tokens (prepare.max_val)" in out and "Validation holds" not in out, out
