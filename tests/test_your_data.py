"""Your data: publisher files read as published (idx .gz, the CIFAR-10 tarball), image folders, dataset
factories, and one-line refusals of bad input. Every input here is made by the test (or ships with Debian)."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ampbench.config.params import PrepareParams
from ampbench.data.prepare import prepare
from ampbench.data.readers import FASHION_CLASSES, read_idx
from ampbench.errors import DataError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(blob)


def fake_mnist(folder: Path, n_train=60, n_test=20, compress=True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
              "train-labels-idx1-ubyte": np.arange(n_train) % 10,
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
              "t10k-labels-idx1-ubyte": np.arange(n_test) % 10}
    for name, a in arrays.items():
        write_idx(folder / (name + (".gz" if compress else "")), a, compress)
    return arrays


@pytest.mark.parametrize("where, compress", [("", True), ("", False), ("FashionMNIST/raw", True)])
def test_idx_files_are_read_as_published(tmp_path, where, compress):
    arrays = fake_mnist(tmp_path / where, compress=compress)
    d = prepare(PrepareParams(dataset="fashion_mnist", val_fraction=0.2), tmp_path)
    assert d.meta["classes"] == FASHION_CLASSES and d.input_shape == (1, 28, 28)
    assert d.meta["sizes"] == {"train": 48, "val": 12, "test": 20}  # the official test split is kept
    assert torch.equal(d.test.x[:, 0], torch.from_numpy(arrays["t10k-images-idx3-ubyte"].astype(np.uint8)))
    assert d.train.x.dtype == torch.uint8


def test_a_truncated_idx_file_is_refused_by_name(tmp_path):
    fake_mnist(tmp_path)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    blob = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(blob[:-100]))
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz: .*truncated"):
        read_idx(path)


@pytest.mark.skipif(not DEBIAN_FASHION.is_dir() and not os.environ.get("AMPBENCH_REQUIRE_FASHION_MNIST"),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_debians_fashion_mnist_folder_works_as_raw_dir(tmp_path):
    d = prepare(PrepareParams(dataset="fashion_mnist", raw_dir=str(DEBIAN_FASHION)), DEBIAN_FASHION)
    assert d.meta["sizes"] == {"train": 54000, "val": 6000, "test": 10000}  # val: 10% of the publisher's train
    assert (d.meta["test_from"], d.meta["test_available"]) == ("publisher", 10000)
    assert d.meta["source"] == str(DEBIAN_FASHION)
    size = sum(s.x.numel() * s.x.element_size() for s in (d.train, d.val, d.test))
    assert size == 70000 * 28 * 28  # one byte per pixel: 4× smaller than float32


def fake_cifar(folder: Path, per_batch: int = 10, tarball: bool = True) -> None:
    rng = np.random.default_rng(1)

    def batch(n):
        return pickle.dumps({"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
                             "labels": list(np.arange(n) % 10)})

    files = {f"data_batch_{i}": batch(per_batch) for i in range(1, 6)}
    files["test_batch"] = batch(per_batch)
    files["batches.meta"] = pickle.dumps({"label_names": [f"c{i}" for i in range(10)]})
    folder.mkdir(parents=True, exist_ok=True)
    if tarball:
        with tarfile.open(folder / "cifar-10-python.tar.gz", "w:gz") as tar:
            for name, blob in files.items():
                info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    else:
        (folder / "cifar-10-batches-py").mkdir()
        for name, blob in files.items():
            (folder / "cifar-10-batches-py" / name).write_bytes(blob)


@pytest.mark.parametrize("tarball", [True, False])
def test_the_cifar10_tarball_or_its_folder(tmp_path, tarball):
    fake_cifar(tmp_path, tarball=tarball)
    d = prepare(PrepareParams(dataset="cifar10", val_fraction=0.2), tmp_path)
    assert d.input_shape == (3, 32, 32) and d.meta["classes"][0] == "c0"
    assert d.meta["sizes"] == {"train": 40, "val": 10, "test": 10}


def test_a_cifar_pickle_that_would_run_code_is_refused(tmp_path):
    fake_cifar(tmp_path, tarball=False)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(DataError, match="test_batch: not a CIFAR-10 python batch.*refusing to load"):
        prepare(PrepareParams(dataset="cifar10"), tmp_path)
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------------------------- imagefolder


def write_image(path: Path, size=(10, 12), mode="RGB", value=0) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    channels = {"RGB": 3, "L": 1}[mode]
    rng = np.random.default_rng(value)
    arr = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(arr[..., 0] if channels == 1 else arr, mode).save(path)


def image_folder(root: Path, splits=("train",), classes=("cat", "dog"), per_class=6, mode="RGB", size=(10, 12)):
    for split in splits:
        for c in classes:
            for i in range(per_class):
                write_image(root / split / c / f"{i}.png", size, mode, value=hash((split, c, i)) % 1000)
    return root


def test_imagefolder_with_split_folders(tmp_path):
    root = image_folder(tmp_path / "pets", splits=("train", "test"))
    (root / "train" / "cat" / ".DS_Store").write_bytes(b"junk")  # hidden files are ignored
    d = prepare(PrepareParams(dataset="imagefolder", raw_dir=str(root), val_fraction=0.25), root)
    assert d.meta["classes"] == ["cat", "dog"] and d.input_shape == (3, 12, 10)
    assert d.meta["sizes"] == {"train": 9, "val": 3, "test": 12}
    assert d.train.x.dtype == torch.uint8


def test_imagefolder_without_split_folders_grey_and_resized(tmp_path):
    root = tmp_path / "shapes"
    for c in ("a", "b", "c"):
        for i in range(10):
            write_image(root / c / f"{i}.png", size=(8 + i, 9), mode="L", value=i)
    d = prepare(PrepareParams(dataset="imagefolder", raw_dir=str(root), image_size=16), root)
    assert d.input_shape == (1, 16, 16) and sum(d.meta["sizes"].values()) == 30


@pytest.mark.parametrize("break_it, message", [
    (lambda r: shutil.rmtree(r), "is not a folder"),
    (lambda r: [shutil.rmtree(r / "train" / "dog"), shutil.rmtree(r / "test" / "dog")], "one class only"),
    (lambda r: shutil.rmtree(r / "test" / "dog"), "different class folders"),
    (lambda r: (r / "train" / "cat" / "3.png").write_bytes(b"not an image"), "3.png is not a readable image"),
    (lambda r: write_image(r / "train" / "cat" / "big.png", size=(30, 30)), "images differ in size"),
    (lambda r: [p.unlink() for p in (r / "train" / "dog").iterdir()], "dog is empty"),
])
def test_bad_image_folders_are_refused_in_one_line(tmp_path, break_it, message):
    root = image_folder(tmp_path / "data", splits=("train", "test"))
    break_it(root)
    with pytest.raises(DataError, match=message) as err:
        prepare(PrepareParams(dataset="imagefolder", raw_dir=str(root)), root)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ factory


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """A user's module defining dataset factories, importable like one in the project root."""
    (tmp_path / "my_data.py").write_text('''
import torch
from torch.utils.data import Dataset, TensorDataset


class Squares(Dataset):
    classes = ["dark", "light"]

    def __init__(self, n, size=8):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        label = i % 2
        return torch.full((1, self.size, self.size), 40 + 150 * label + i % 7, dtype=torch.uint8), label


def splits(n=40, size=8):
    return {"train": Squares(n, size), "test": Squares(n // 2, size)}


def one(n=50):
    return TensorDataset(torch.rand(n, 3, 6, 6), torch.arange(n) % 3)


def not_datasets():
    return {"train": 42}


def bad_items():
    return [1, 2, 3]


def broken():
    raise RuntimeError("the bucket is gone")
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_data"
    sys.modules.pop("my_data", None)


def test_a_factory_of_datasets(factory_module):
    d = prepare(PrepareParams(dataset=f"{factory_module}:splits", dataset_args={"n": 40, "size": 8},
                              val_fraction=0.25), Path("."))
    assert d.meta["classes"] == ["dark", "light"] and d.input_shape == (1, 8, 8)
    assert d.meta["sizes"] == {"train": 30, "val": 10, "test": 20} and d.train.x.dtype == torch.uint8
    one = prepare(PrepareParams(dataset=f"{factory_module}:one", image_size=12), Path("."))
    assert one.input_shape == (3, 12, 12) and one.train.x.dtype == torch.float32 and one.num_classes == 3


@pytest.mark.parametrize("name, message", [
    ("my_data:not_datasets", "train: a int is not a map-style torch Dataset"),
    ("my_data:bad_items", "all\\[0\\]: TypeError: .* \\(items must be \\(image, label\\)\\)"),
    ("my_data:broken", "calling it failed \\(RuntimeError: the bucket is gone\\)"),
    ("my_data:nothing", "has no attribute 'nothing'"),
    ("no_such_module:f", "cannot import no_such_module"),
])
def test_bad_factories_are_refused_in_one_line(factory_module, name, message):
    with pytest.raises(DataError, match=message) as err:
        prepare(PrepareParams(dataset=name), Path("."))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("source", ["imagefolder", "factory"])
def test_a_resize_beyond_memory_is_refused_before_any_decoding(source, tmp_path, factory_module, monkeypatch):
    """prepare.image_size at its maximum on a small folder tried to allocate 5.6 GB and died with a traceback; the
    synthetic data's memory estimate now covers every source. (Available memory pinned to 1 GiB: the same on every
    machine.)"""
    import ampbench.runtime.hardware

    monkeypatch.setattr(ampbench.runtime.hardware, "available_memory", lambda device: 2**30)
    decoded = []
    monkeypatch.setattr("ampbench.data.user_data._to_array", lambda *a: decoded.append(a) or None)
    root = image_folder(tmp_path / "pets")  # 12 RGB images of 10×12
    if source == "imagefolder":
        params = PrepareParams(dataset="imagefolder", raw_dir=str(root), image_size=4096)
        expected = f"imagefolder {root}: 12 images of 3×4096×4096 need about 3.4 GiB while prepared, this machine " \
                   "has 1.0 GiB available; lower prepare.image_size"
    else:
        params = PrepareParams(dataset=f"{factory_module}:one", image_size=4096)
        expected = "all: 50 images of 3×4096×4096 need about 56."  # float32 items: 4 bytes a value
    with pytest.raises(DataError) as err:
        prepare(params, root if source == "imagefolder" else tmp_path)
    assert expected in str(err.value) and "\n" not in str(err.value) and not decoded
    monkeypatch.undo()
    if source == "imagefolder":  # the same folder at its own size fits
        assert prepare(PrepareParams(dataset="imagefolder", raw_dir=str(root)), root).input_shape == (3, 12, 10)
