"""Data sets: load raw images, split them deterministically, normalise with training statistics, save and load.

This is the one module that reads data files. Prepared data is three ``{split}.pt`` files of tensors
(x: float32 N×C×H×W, y: int64 N) plus ``meta.json`` with shapes, classes, normalisation and a content checksum.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ampbench.errors import DataError
from ampbench.fileio import atomic_torch_save, atomic_write_text

if TYPE_CHECKING:  # params needs pydantic; the bench must run where only torch is installed
    from ampbench.params import PrepareParams

SPLITS = ("train", "val", "test")

# torchvision class, the folder under data/raw it expects, and the files a user must place there.
_TORCHVISION = {
    "mnist": ("MNIST", "MNIST/raw", "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
              "t10k-labels-idx1-ubyte (or their .gz)"),
    "fashion_mnist": ("FashionMNIST", "FashionMNIST/raw", "the same four idx files as MNIST"),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", "the extracted cifar-10-python.tar.gz (data_batch_1..5, "
                "test_batch, batches.meta)"),
}


@dataclass(frozen=True)
class Split:
    """One split held as tensors: ``x`` float32 (N, C, H, W), ``y`` int64 (N,)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device) -> Split:
        return Split(self.x.to(device), self.y.to(device))


@dataclass(frozen=True)
class Prepared:
    """The three splits and the facts about them (``meta``: dataset, shape, classes, mean/std, checksum)."""

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


def _load_digits() -> tuple[torch.Tensor, torch.Tensor, list[str], None]:
    from sklearn.datasets import load_digits  # ships with scikit-learn: works offline

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8), pixels 0..16
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return x, y, [str(c) for c in bunch.target_names], None


def _load_torchvision(name: str, raw_dir: Path, download: bool):
    """Return (x_train, y_train, classes, (x_test, y_test)) keeping the data set's official test split."""
    import torchvision

    cls_name, folder, files = _TORCHVISION[name]
    cls = getattr(torchvision.datasets, cls_name)
    where = raw_dir / folder
    try:
        parts = [cls(root=str(raw_dir), train=train, download=download) for train in (True, False)]
    except Exception as exc:  # torchvision raises RuntimeError when absent, URLError/OSError when download fails
        how = "the download failed" if download else "prepare.download is false"
        raise DataError(
            f"{name}: data files not found under {where} and {how} ({type(exc).__name__}). "
            f"Put {files} there, or set prepare.download: true on a machine with network access."
        ) from None

    def tensors(ds):
        x = torch.as_tensor(ds.data)
        x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)  # → (N, C, H, W)
        return x.float() / 255.0, torch.as_tensor(ds.targets, dtype=torch.int64)

    (x_tr, y_tr), test = tensors(parts[0]), tensors(parts[1])
    return x_tr, y_tr, [str(c) for c in parts[0].classes], test


def _make_synthetic(p: PrepareParams) -> tuple[torch.Tensor, torch.Tensor, list[str], None]:
    """Learnable random images: a smooth prototype per class plus Gaussian noise, fully determined by the seed."""
    s = p.synthetic
    gen = torch.Generator().manual_seed(p.seed)
    coarse = max(2, s.image_size // 4)
    protos = torch.randn(s.classes, s.channels, coarse, coarse, generator=gen)
    protos = torch.nn.functional.interpolate(protos, size=(s.image_size, s.image_size), mode="bilinear",
                                             align_corners=False)
    y = torch.randint(0, s.classes, (s.count,), generator=gen)
    x = protos[y] + s.noise * torch.randn(s.count, s.channels, s.image_size, s.image_size, generator=gen)
    return x, y, [f"class_{i}" for i in range(s.classes)], None


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


def checksum(splits: dict[str, Split]) -> str:
    """sha256 over the bytes of every split's tensors, in a fixed order."""
    h = hashlib.sha256()
    for name in SPLITS:
        for t in (splits[name].x, splits[name].y):
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def prepare(p: PrepareParams, raw_dir: Path) -> Prepared:
    """Load the configured data set, split it with ``p.seed`` and normalise every split with training stats."""
    if p.dataset == "digits":
        x, y, classes, test = _load_digits()
    elif p.dataset == "synthetic":
        x, y, classes, test = _make_synthetic(p)
    else:
        x, y, classes, test = _load_torchvision(p.dataset, raw_dir, p.download)

    if test is None:  # no official test split: cut val and test from the whole set
        val_idx, test_idx, train_idx = split_indices(len(y), p.seed, (p.val_fraction, p.test_fraction))
        raw = {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx]),
               "test": (x[test_idx], y[test_idx])}
    else:
        val_idx, train_idx = split_indices(len(y), p.seed, (p.val_fraction,))
        raw = {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx]), "test": test}
    if p.max_train is not None:
        raw["train"] = tuple(t[: p.max_train] for t in raw["train"])

    # Per-channel statistics from the training split only, so nothing leaks from val/test.
    x_train = raw["train"][0]
    mean = x_train.mean(dim=(0, 2, 3))
    std = x_train.std(dim=(0, 2, 3)).clamp_min(1e-6)
    splits = {
        name: Split(((xs - mean[:, None, None]) / std[:, None, None]).contiguous(), ys.clone())
        for name, (xs, ys) in raw.items()
    }
    meta = {
        "dataset": p.dataset,
        "input_shape": list(x_train.shape[1:]),
        "classes": classes,
        "sizes": {name: len(s) for name, s in splits.items()},
        "mean": mean.tolist(),
        "std": std.tolist(),
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
    """Load prepared data and check it against its meta.json (shapes and checksum)."""
    meta_path = in_dir / "meta.json"
    if not meta_path.exists():
        raise DataError(f"{meta_path} not found: run the prepare stage first (dvc repro prepare)")
    try:
        meta = json.loads(meta_path.read_text())
        splits = {}
        for name in SPLITS:
            blob = torch.load(in_dir / f"{name}.pt", weights_only=True)
            splits[name] = Split(blob["x"], blob["y"])
    except Exception as exc:  # torch.load of a damaged file can raise almost anything (pickle internals)
        raise DataError(f"{in_dir}: prepared data unreadable ({type(exc).__name__}: {exc}); rerun prepare") from None
    for name, split in splits.items():
        if list(split.x.shape[1:]) != meta["input_shape"] or len(split) != meta["sizes"][name]:
            raise DataError(f"{in_dir}/{name}.pt: shape {tuple(split.x.shape)} does not match meta.json; rerun prepare")
    if checksum(splits) != meta["checksum"]:
        raise DataError(f"{in_dir}: checksum mismatch with meta.json (files changed or corrupt); rerun prepare")
    return Prepared(splits["train"], splits["val"], splits["test"], meta)
