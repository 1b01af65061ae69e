"""Raw data as its publishers ship it: the built-in sources of ``prepare.dataset``, each read into a ``Raw``.

digits (ships with scikit-learn), synthetic (seeded, learnable prototypes), the torchvision sets read from the
publishers' files in ``prepare.raw_dir`` (MNIST / Fashion-MNIST ``*-idx?-ubyte[.gz]``, the CIFAR-10 python
tarball or its extracted folder; fetched only with ``prepare.download``), and through ``user_data.py``
``imagefolder`` and a user factory ``package.module:callable``.
"""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ampbench.data.user_data import Raw, load_factory, load_imagefolder
from ampbench.errors import DataError
from ampbench.runtime.hardware import available_memory

if TYPE_CHECKING:  # params needs pydantic; the bench must run where only torch is installed
    from ampbench.config.params import PrepareParams

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# torchvision's folder names, so a torchvision download (prepare.download) is found too.
_TV_FOLDER = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "cifar10": "CIFAR10"}
CIFAR_TARBALL = "cifar-10-python.tar.gz"
CIFAR_FOLDER = "cifar-10-batches-py"



def _load_digits() -> Raw:
    from sklearn.datasets import load_digits  # ships with scikit-learn: works offline

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.uint8).unsqueeze(1)  # (1797, 1, 8, 8), pixels 0..16
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return Raw(x, y, [str(c) for c in bunch.target_names], 1 / 16, source="sklearn.datasets.load_digits")


def _make_synthetic(p: PrepareParams) -> Raw:
    """Learnable random images: a smooth prototype per class plus Gaussian noise, fully determined by the seed."""
    s = p.synthetic
    need = 3 * s.count * s.channels * s.image_size**2 * 4  # float32 images, noise and prototypes-per-image at once
    have = available_memory(torch.device("cpu"))
    if need > have:
        raise DataError(f"prepare.synthetic: {s.count} images of {s.channels}×{s.image_size}×{s.image_size} need "
                        f"about {need / 2**30:.1f} GiB while generated, this machine has {have / 2**30:.1f} GiB "
                        "available; lower count or image_size")
    gen = torch.Generator().manual_seed(p.seed)
    coarse = max(2, s.image_size // 4)
    protos = torch.randn(s.classes, s.channels, coarse, coarse, generator=gen)
    protos = torch.nn.functional.interpolate(protos, size=(s.image_size, s.image_size), mode="bilinear",
                                             align_corners=False)
    y = torch.randint(0, s.classes, (s.count,), generator=gen)
    x = protos[y] + s.noise * torch.randn(s.count, s.channels, s.image_size, s.image_size, generator=gen)
    return Raw(x, y, [f"class_{i}" for i in range(s.classes)], 1.0, source="synthetic")


def _candidate_dirs(name: str, raw_dir: Path) -> list[Path]:
    """Where a torchvision set's files may be: flat in raw_dir (Debian's dataset-fashion-mnist folder, a
    manual download) or in torchvision's own layout under it."""
    folder = _TV_FOLDER[name]
    return [raw_dir, raw_dir / folder / "raw", raw_dir / folder]


def _find(dirs: list[Path], stem: str) -> Path | None:
    for d in dirs:
        for candidate in (d / stem, d / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    return None


def read_idx(path: Path) -> np.ndarray:
    """An idx file (MNIST's format: magic, dimensions, big-endian; uint8 payload), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            blob = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
    if len(blob) < 4 or blob[0] != 0 or blob[1] != 0 or blob[2] != 0x08:
        raise DataError(f"{path}: not an unsigned-byte idx file (bad magic number)")
    ndim = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    start = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(blob) - start != expected:
        raise DataError(f"{path}: {len(blob) - start} data bytes, the header says {expected} (truncated?)")
    return np.frombuffer(blob, dtype=np.uint8, offset=start).reshape(dims)


def _load_idx_set(name: str, raw_dir: Path) -> Raw:
    dirs = _candidate_dirs(name, raw_dir)
    found = {split: [_find(dirs, stem) for stem in stems] for split, stems in IDX_FILES.items()}
    missing = [stem for split, stems in IDX_FILES.items() for stem, f in zip(stems, found[split], strict=True)
               if f is None]
    if missing:
        raise DataError(f"{name}: {', '.join(missing)} (or .gz) not found in {raw_dir} or {dirs[1]}. Point "
                        "prepare.raw_dir at the folder with the four idx files (e.g. Debian's dataset-fashion-mnist "
                        "installs them in /usr/share/datasets/fashion-mnist), or set prepare.download: true on a "
                        "machine with network access.")
    splits = {}
    for split, (images, labels) in found.items():
        x, y = read_idx(images), read_idx(labels)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise DataError(f"{images.parent}: {images.name} holds {x.shape}, {labels.name} {y.shape}; expected "
                            "N×H×W images and N labels")
        splits[split] = (torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y.astype(np.int64)))
    classes = FASHION_CLASSES if name == "fashion_mnist" else [str(i) for i in range(10)]
    return Raw(None, None, classes, 1 / 255, splits, source=str(found["train"][0].parent))


class _NumpyOnly(pickle.Unpickler):
    """CIFAR-10's batches are pickles: allow only what they contain (numpy arrays), so a crafted file cannot run
    code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(blob: bytes, where: str) -> dict:
    try:
        return _NumpyOnly(io.BytesIO(blob), encoding="latin1").load()
    except Exception as exc:
        raise DataError(f"{where}: not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None


def _load_cifar10(raw_dir: Path) -> Raw:
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    tarball = next((p for p in (raw_dir / CIFAR_TARBALL, raw_dir / "CIFAR10" / CIFAR_TARBALL) if p.is_file()), None)
    folder = next((p for p in (raw_dir / CIFAR_FOLDER, raw_dir / "CIFAR10" / CIFAR_FOLDER)
                   if (p / "batches.meta").is_file()), None)
    blobs: dict[str, bytes] = {}
    if folder is not None:
        source = folder
        for n in names:
            if not (folder / n).is_file():
                raise DataError(f"cifar10: {folder / n} missing (a partly extracted {CIFAR_TARBALL}?)")
            blobs[n] = (folder / n).read_bytes()
    elif tarball is not None:
        source = tarball
        try:
            with tarfile.open(tarball, "r:gz") as tar:
                for n in names:
                    member = tar.extractfile(f"{CIFAR_FOLDER}/{n}")
                    if member is None:
                        raise KeyError(n)
                    blobs[n] = member.read()
        except (tarfile.TarError, KeyError, OSError, EOFError) as exc:
            raise DataError(f"cifar10: {tarball} is not the CIFAR-10 python tarball ({type(exc).__name__}: "
                            f"{exc})") from None
    else:
        raise DataError(f"cifar10: neither {raw_dir / CIFAR_TARBALL} nor {raw_dir / CIFAR_FOLDER}/ found. Put "
                        f"the publisher's {CIFAR_TARBALL} (or its extracted folder) in prepare.raw_dir, or set "
                        "prepare.download: true on a machine with network access.")

    def batch(n: str) -> tuple[torch.Tensor, torch.Tensor]:
        d = _unpickle(blobs[n], f"{source}:{n}")
        x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return torch.from_numpy(x.copy()), torch.tensor(list(d["labels"]), dtype=torch.int64)

    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    train = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    classes = [str(c) for c in _unpickle(blobs["batches.meta"], f"{source}:batches.meta")["label_names"]]
    return Raw(None, None, classes, 1 / 255, {"train": train, "test": batch("test_batch")}, source=str(source))


def _download(name: str, raw_dir: Path) -> None:
    """Fetch a torchvision set into raw_dir in torchvision's layout (needs network)."""
    import torchvision

    cls = getattr(torchvision.datasets, _TV_FOLDER[name])
    try:
        for train in (True, False):
            cls(root=str(raw_dir), train=train, download=True)
    except Exception as exc:  # URLError, OSError, RuntimeError: all mean "no data"
        raise DataError(f"{name}: the download into {raw_dir} failed ({type(exc).__name__}: {exc})") from None


def load_raw(p: PrepareParams, raw_dir: Path) -> Raw:
    """Read the data set ``p`` names."""
    from ampbench.config.rules import dataset_kind

    kind = dataset_kind(p.dataset)
    if kind == "factory":
        return load_factory(p)
    if p.dataset == "digits":
        return _load_digits()
    if p.dataset == "synthetic":
        return _make_synthetic(p)
    if p.dataset == "imagefolder":
        return load_imagefolder(raw_dir, p.image_size)
    reader = _load_cifar10 if p.dataset == "cifar10" else lambda d: _load_idx_set(p.dataset, d)
    try:
        return reader(raw_dir)
    except DataError:
        if not p.download:
            raise
    _download(p.dataset, raw_dir)
    return reader(raw_dir)

