"""Data sets: read raw data as its publishers ship it, split deterministically, store compactly, load.

This is the one module that reads data files. Prepared data is three ``{split}.pt`` files (x: N×C×H×W as stored —
uint8 for 8-bit images, float32 otherwise; y: int64 N) plus ``meta.json`` with shapes, classes, the
normalisation (scale, per-channel mean and std from the training split) and a content checksum. Images stay
8-bit on disk and are normalised on the fly (``Norm``), a batch at a time, on the device that trains.

Sources (``prepare.dataset``): digits (ships with scikit-learn), synthetic, the torchvision sets read from the
publishers' files in ``prepare.raw_dir`` (MNIST / Fashion-MNIST ``*-idx?-ubyte[.gz]``, the CIFAR-10 python
tarball or its extracted folder), ``imagefolder`` (class sub-folders under ``prepare.raw_dir``) and a user
factory ``package.module:callable`` returning torch Datasets (``datasets.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ampbench.datasets import SPLITS, Raw, load_factory, load_imagefolder
from ampbench.errors import DataError
from ampbench.fileio import atomic_torch_save, atomic_write_text
from ampbench.hardware import available_memory

if TYPE_CHECKING:  # params needs pydantic; the bench must run where only torch is installed
    from ampbench.params import PrepareParams

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# torchvision's folder names, so a torchvision download (prepare.download) is found too.
_TV_FOLDER = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "cifar10": "CIFAR10"}
CIFAR_TARBALL = "cifar-10-python.tar.gz"
CIFAR_FOLDER = "cifar-10-batches-py"


# ------------------------------------------------------------------------------------------------ splits


@dataclass(frozen=True)
class Norm:
    """How stored values become model inputs: ``(x · scale − mean) / std`` per channel."""

    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        a, b = _affine(self, x.device)
        return torch.addcmul(b, x.float(), a)  # x·a + b in one pass, float32


@lru_cache(maxsize=32)
def _affine(norm: Norm, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached per device: building the two small tensors each batch would copy host→device every step.
    std = torch.tensor(norm.std, dtype=torch.float64)
    a = (norm.scale / std).float().view(1, -1, 1, 1).to(device)
    b = (-torch.tensor(norm.mean, dtype=torch.float64) / std).float().view(1, -1, 1, 1).to(device)
    return a, b


@dataclass(frozen=True)
class Split:
    """One split: ``x`` as stored (uint8 or float32, N×C×H×W), ``y`` int64 (N,), and the ``norm`` that turns x
    into model inputs (None: x already is the model's input, e.g. tensors a test or the bench built)."""

    x: torch.Tensor
    y: torch.Tensor
    norm: Norm | None = None

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device, **kwargs: Any) -> Split:
        return Split(self.x.to(device, **kwargs), self.y.to(device), self.norm)

    def inputs(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """Model inputs (float32) of ``x`` (default: the whole split), stored values normalised."""
        x = self.x if x is None else x
        return x if self.norm is None else self.norm(x)


@dataclass(frozen=True)
class Prepared:
    """The three splits and the facts about them (``meta``: dataset, shape, classes, normalisation, checksum)."""

    train: Split
    val: Split
    test: Split
    meta: dict[str, Any]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.meta["input_shape"])

    @property
    def num_classes(self) -> int:
        return len(self.meta["classes"])


# ---------------------------------------------------------------------------------------------- raw loading


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
    from ampbench.params import dataset_kind

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


# ------------------------------------------------------------------------------------------- split + norm


def split_indices(n: int, seed: int, fractions: tuple[float, ...]) -> list[torch.Tensor]:
    """Seeded permutation of ``range(n)`` cut into len(fractions)+1 parts; the last part takes the rest."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sizes = [int(round(f * n)) for f in fractions]
    if any(size < 1 for size in sizes) or sum(sizes) >= n:
        raise DataError(f"{n} samples are too few for split fractions {fractions}")
    cuts, start = [], 0
    for size in sizes:
        cuts.append(perm[start:start + size])
        start += size
    return [*cuts, perm[start:]]


def channel_stats(x: torch.Tensor, scale: float, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of ``x · scale``, a chunk at a time (float64 sums; no float copy of the set)."""
    c = x.shape[1]
    total = torch.zeros(c, dtype=torch.float64)
    squares = torch.zeros(c, dtype=torch.float64)
    for part in x.split(chunk):
        v = part.double() * scale
        total += v.sum(dim=(0, 2, 3))
        squares += (v * v).sum(dim=(0, 2, 3))
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / n
    var = (squares - n * mean * mean) / max(n - 1, 1)
    return mean.tolist(), var.clamp_min(1e-12).sqrt().tolist()


def checksum(splits: dict[str, Split]) -> str:
    """sha256 over the bytes of every split's tensors, in a fixed order."""
    h = hashlib.sha256()
    for name in SPLITS:
        for t in (splits[name].x, splits[name].y):
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _split(raw: Raw, p: PrepareParams) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The publisher's splits where it has them; val (and test, when missing) cut deterministically from the
    training data with ``p.seed``."""
    if raw.splits:
        x, y = raw.splits["train"]
        parts = dict(raw.splits)
    else:
        x, y, parts = raw.x, raw.y, {}
    if "val" in parts and "test" in parts:
        return {"train": (x, y), "val": parts["val"], "test": parts["test"]}
    if "test" in parts:
        val_idx, train_idx = split_indices(len(y), p.seed, (p.val_fraction,))
        return {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx]), "test": parts["test"]}
    if "val" in parts:
        test_idx, train_idx = split_indices(len(y), p.seed, (p.test_fraction,))
        return {"train": (x[train_idx], y[train_idx]), "val": parts["val"], "test": (x[test_idx], y[test_idx])}
    val_idx, test_idx, train_idx = split_indices(len(y), p.seed, (p.val_fraction, p.test_fraction))
    return {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx]),
            "test": (x[test_idx], y[test_idx])}


def prepare(p: PrepareParams, raw_dir: Path) -> Prepared:
    """Load the configured data set, split it with ``p.seed``, compute the normalisation from the training split
    only (nothing leaks from val/test). Images keep their stored dtype (uint8 stays uint8)."""
    raw = load_raw(p, raw_dir)
    raw_splits = _split(raw, p)
    if p.max_train is not None:
        raw_splits["train"] = tuple(t[: p.max_train] for t in raw_splits["train"])
    if p.max_test is not None and p.max_test < len(raw_splits["test"][1]):
        keep = torch.randperm(len(raw_splits["test"][1]), generator=torch.Generator().manual_seed(p.seed))
        keep = keep[: p.max_test].sort().values  # a seeded subset, in the data set's order
        raw_splits["test"] = tuple(t[keep] for t in raw_splits["test"])
    x_train = raw_splits["train"][0]
    shapes = {name: tuple(xs.shape[1:]) for name, (xs, _) in raw_splits.items()}
    if len(set(shapes.values())) != 1:
        raise DataError(f"{p.dataset}: the splits' images differ in shape ({shapes}); set prepare.image_size")
    mean, std = channel_stats(x_train, raw.scale)
    norm = Norm(raw.scale, tuple(mean), tuple(std))
    splits = {name: Split(xs.contiguous(), ys.clone(), norm) for name, (xs, ys) in raw_splits.items()}
    meta = {
        "dataset": p.dataset,
        "source": raw.source,
        "input_shape": list(x_train.shape[1:]),
        "stored_dtype": str(x_train.dtype).removeprefix("torch."),
        "classes": raw.classes,
        "sizes": {name: len(s) for name, s in splits.items()},
        "scale": raw.scale,
        "mean": mean,
        "std": std,
        "seed": p.seed,
        "checksum": checksum(splits),
    }
    return Prepared(splits["train"], splits["val"], splits["test"], meta)


# ------------------------------------------------------------------------------------------------ storage


def save_prepared(data: Prepared, out_dir: Path) -> None:
    """Write ``{split}.pt`` and ``meta.json`` under out_dir, each atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        split = getattr(data, name)
        atomic_torch_save({"x": split.x, "y": split.y}, out_dir / f"{name}.pt")
    atomic_write_text(out_dir / "meta.json", json.dumps(data.meta, indent=2) + "\n")


def load_prepared(in_dir: Path) -> Prepared:
    """Load prepared data (memory-mapped: a set larger than memory pages in as batches need it) and check it
    against its meta.json (shapes and checksum)."""
    meta_path = in_dir / "meta.json"
    if not meta_path.exists():
        raise DataError(f"{meta_path} not found: run the prepare stage first (dvc repro prepare)")
    try:
        meta = json.loads(meta_path.read_text())
        norm = Norm(meta["scale"], tuple(meta["mean"]), tuple(meta["std"]))
        splits = {}
        for name in SPLITS:
            blob = torch.load(in_dir / f"{name}.pt", weights_only=True, mmap=True)
            splits[name] = Split(blob["x"], blob["y"], norm)
    except Exception as exc:  # torch.load of a damaged file can raise almost anything (pickle internals)
        raise DataError(f"{in_dir}: prepared data unreadable ({type(exc).__name__}: {exc}); rerun prepare") from None
    for name, split in splits.items():
        if list(split.x.shape[1:]) != meta["input_shape"] or len(split) != meta["sizes"][name]:
            raise DataError(f"{in_dir}/{name}.pt: shape {tuple(split.x.shape)} does not match meta.json; rerun prepare")
    if checksum(splits) != meta["checksum"]:
        raise DataError(f"{in_dir}: checksum mismatch with meta.json (files changed or corrupt); rerun prepare")
    return Prepared(splits["train"], splits["val"], splits["test"], meta)
