"""The user's data: a folder of class sub-folders (``imagefolder``) or a factory returning torch Datasets.

Both become a ``Raw`` (defined here, the form every source takes, built-in ones too: uint8 images where the
source is 8-bit), so the rest of the pipeline cannot tell them from the built-in sets.

imagefolder (``prepare.raw_dir``): either ``train/<class>/*`` with optional ``val/<class>/*`` and
``test/<class>/*`` (missing splits are cut from train with ``prepare.seed``), or ``<class>/*`` directly (all three
splits cut from it). Every split must have the same class folders. Images are read with Pillow; when every
image is greyscale the data is 1-channel, otherwise every image is converted to RGB. ``prepare.image_size``
resizes to a square; without it, every image must already have one size. A file Pillow cannot read is refused,
naming it (a data set that silently loses files would bias the comparison with nobody noticing); hidden files
(``.DS_Store``, …) are ignored.

Factory (``prepare.dataset: package.module:callable``): called as ``callable(**prepare.dataset_args)``; returns
one Dataset (split with ``prepare.seed``) or a mapping with ``train`` and optionally ``val`` and ``test``. Each
item is ``(image, label)``: the image a uint8 or float tensor (C×H×W or H×W) or a PIL image, the label an int.
Class names come from the train Dataset's ``classes`` attribute when it has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ampbench.config.user_code import first_line, import_callable
from ampbench.data.datamodule import SPLITS, datamodule_splits, is_datamodule, is_hf_trainer, trainer_splits
from ampbench.errors import DataError

if TYPE_CHECKING:
    from ampbench.config.params import PrepareParams

GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


def load_datamodule(dm: Any, name: str) -> Raw:
    """A LightningDataModule's splits (``datamodule_splits``) as a ``Raw`` that is already normalised (the module
    trains on what the loaders give, so the evaluation must see the same values): a classifier's (inputs, class
    labels), or a language model's (token sequences, next tokens), each of one length (its vocabulary then at least
    the largest token + 1)."""
    return raw_of_splits(datamodule_splits(dm, f"prepare.dataset {name!r}"), name)


def raw_of_splits(tensors: dict[str, tuple[torch.Tensor, torch.Tensor]], name: str) -> Raw:
    """A framework's splits as its loaders give them (a datamodule's, a Trainer's) as a ``Raw``."""
    x0, y0 = tensors["train"]
    if y0.ndim == 2 and not x0.is_floating_point() and x0.shape == y0.shape:  # (sequences, next tokens)
        vocab = int(max(max(x.max(), y.max()) for x, y in tensors.values())) + 1
        return Raw(None, None, [], 1.0, tensors, source=name, normalised=True, vocab_size=vocab)
    if y0.ndim != 1:
        raise DataError(f"prepare.dataset {name!r}: batches of inputs {tuple(x0.shape[1:])} and targets "
                        f"{tuple(y0.shape[1:])} per example; a LightningDataModule is measured as a classifier (one "
                        "class label per example) or a language model (token ids and next tokens, same shape)")
    labels = torch.cat([y for _, y in tensors.values()])
    classes = [str(i) for i in range(int(labels.max()) + 1)]
    return Raw(None, None, classes, 1.0, {k: (x.float(), y) for k, (x, y) in tensors.items()}, source=name,
               normalised=True)


@dataclass
class Raw:
    """A data set as read: images (uint8 with ``scale`` 1/255 or 1/16, or float32 with scale 1), labels, class
    names, and the publisher's own splits when it has them (``splits``: name → (x, y))."""

    x: torch.Tensor | None
    y: torch.Tensor | None
    classes: list[str]
    scale: float
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    source: str = ""  # where it was read from, for meta.json
    normalised: bool = False  # the values a model sees as they are (a LightningDataModule's batches): no Norm
    vocab_size: int | None = None  # token sequences (a language model's datamodule): at least the largest id + 1


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _class_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and _visible(p))


def _scan(root: Path) -> dict[str, dict[str, list[Path]]]:
    """split → class → image files, checked: at least two classes, the same classes in every split, no empty
    class folder."""
    if not root.is_dir():
        raise DataError(f"imagefolder: {root} is not a folder (set prepare.raw_dir to your data set's folder)")
    split_dirs = {s: root / s for s in SPLITS if (root / s).is_dir()}
    if split_dirs and "train" not in split_dirs:
        raise DataError(f"imagefolder: {root} has {', '.join(sorted(split_dirs))}/ but no train/ folder")
    layout = split_dirs or {"all": root}
    scanned: dict[str, dict[str, list[Path]]] = {}
    for split, folder in layout.items():
        classes = _class_dirs(folder)
        if not classes:
            raise DataError(f"imagefolder: {folder} has no class sub-folders (expected {folder}/<class>/<image>)")
        scanned[split] = {}
        for c in classes:
            files = sorted(p for p in c.rglob("*") if p.is_file() and _visible(p)
                           and all(_visible(part) for part in p.relative_to(c).parents if part.name))
            if not files:
                raise DataError(f"imagefolder: {c} is empty")
            scanned[split][c.name] = files
    first = next(iter(scanned))
    names = list(scanned[first])
    if len(names) < 2:
        raise DataError(f"imagefolder: {layout[first]} has one class only ({names[0]}); a classifier needs two")
    for split, classes in scanned.items():
        if list(classes) != names:
            extra = sorted(set(classes) - set(names))
            missing = sorted(set(names) - set(classes))
            raise DataError(f"imagefolder: {layout[split]} has different class folders than {layout[first]} "
                            f"(extra: {extra or 'none'}, missing: {missing or 'none'})")
    return scanned


def _open(path: Path):
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(path)
        img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"imagefolder: {path} is not a readable image ({type(exc).__name__}: {first_line(exc)}); "
                        "remove it or replace it") from None
    return img


def _to_array(img, mode: str, size: int | None) -> np.ndarray:
    from PIL import Image

    img = img.convert(mode)
    if size is not None and img.size != (size, size):
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


# Bytes held per stored byte of an image while preparing, an estimate from the code rather than a measurement: the
# decoded arrays, their stacked copy and a float32 pass (4 bytes per value) that computes the normalisation.
_PREPARE_BYTES_PER_BYTE = 6


def check_memory(count: int, shape: tuple[int, ...], bytes_per_value: int, what: str) -> None:
    """Refuse, before decoding or resizing anything, a data set that would not fit in this machine's memory while
    it is prepared (the synthetic data's check, for every source): one line with the sizes and the key to lower."""
    from ampbench.runtime.hardware import available_memory

    per_image = bytes_per_value
    for d in shape:
        per_image *= d
    need = count * per_image * _PREPARE_BYTES_PER_BYTE
    have = available_memory(torch.device("cpu"))
    if need > have:
        size = "×".join(str(d) for d in shape)
        raise DataError(f"{what}: {count:,} images of {size} need about {need / 2**30:.1f} GiB while prepared, "
                        f"this machine has {have / 2**30:.1f} GiB available; lower prepare.image_size (or "
                        "prepare.max_train)")


def load_imagefolder(root: Path, image_size: int | None) -> Raw:
    """Read an image folder (layout in the module docstring) into uint8 tensors."""
    scanned = _scan(root)
    names = list(next(iter(scanned.values())))
    # First pass: headers only (mode and size), so a size mismatch is reported before anything is decoded.
    from PIL import Image, UnidentifiedImageError

    modes, sizes = set(), {}
    for classes in scanned.values():
        for files in classes.values():
            for f in files:
                try:
                    with Image.open(f) as img:
                        modes.add(img.mode)
                        sizes.setdefault(img.size, f)
                except (UnidentifiedImageError, OSError) as exc:
                    raise DataError(f"imagefolder: {f} is not a readable image ({type(exc).__name__}); remove "
                                    "it or replace it") from None
    if image_size is None and len(sizes) > 1:
        (s1, f1), (s2, f2) = list(sizes.items())[:2]
        raise DataError(f"imagefolder: images differ in size ({f1}: {s1[0]}×{s1[1]}, {f2}: {s2[0]}×{s2[1]}); set "
                        "prepare.image_size to resize them to one square size")
    mode = "L" if modes <= set(GREY_MODES) else "RGB"
    side = (image_size, image_size) if image_size is not None else next(iter(sizes))[::-1]
    count = sum(len(files) for classes in scanned.values() for files in classes.values())
    check_memory(count, (1 if mode == "L" else 3, *side), 1, f"imagefolder {root}")
    splits = {}
    for split, classes in scanned.items():
        xs, ys = [], []
        for label, files in enumerate(classes.values()):
            for f in files:
                with _open(f) as img:
                    xs.append(_to_array(img, mode, image_size))
                ys.append(label)
        splits[split] = (torch.from_numpy(np.stack(xs)), torch.tensor(ys, dtype=torch.int64))
    if "all" in splits:
        x, y = splits.pop("all")
        return Raw(x, y, names, 1 / 255, source=str(root))
    return Raw(None, None, names, 1 / 255, splits, source=str(root))


# ------------------------------------------------------------------------------------------------ factory


def _item_image(image: Any, where: str) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        t = image
    elif hasattr(image, "convert") and hasattr(image, "mode"):  # a PIL image
        t = torch.from_numpy(np.asarray(image.convert("L" if image.mode in GREY_MODES else "RGB"), dtype=np.uint8))
        t = t.permute(2, 0, 1) if t.ndim == 3 else t
    else:
        raise DataError(f"{where}: the image is a {type(image).__name__}; return a tensor (C×H×W or H×W) or a PIL "
                        "image")
    if t.ndim == 2:
        t = t.unsqueeze(0)
    if t.ndim != 3:
        raise DataError(f"{where}: the image has shape {tuple(t.shape)}; expected C×H×W or H×W")
    return t


def _materialise(ds: Any, where: str, image_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every item of a Dataset as stacked tensors (uint8 stays uint8)."""
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise DataError(f"{where}: a {type(ds).__name__} is not a map-style torch Dataset (__len__, __getitem__)")
    n = len(ds)
    if n == 0:
        raise DataError(f"{where}: the Dataset is empty")
    xs, ys = [], []
    for i in range(n):
        try:
            item = ds[i]
            image, label = item
        except DataError:
            raise
        except Exception as exc:
            raise DataError(f"{where}[{i}]: {type(exc).__name__}: {first_line(exc)} (items must be (image, label))"
                            ) from None
        t = _item_image(image, f"{where}[{i}]")
        if i == 0:  # item 0 stands for all of them (they must match it, below)
            shape = (t.shape[0], image_size, image_size) if image_size is not None else tuple(t.shape)
            check_memory(n, shape, 1 if t.dtype == torch.uint8 else 4, where)
        if image_size is not None and tuple(t.shape[-2:]) != (image_size, image_size):
            resized = torch.nn.functional.interpolate(t[None].float(), size=(image_size, image_size),
                                                      mode="bilinear", align_corners=False, antialias=True)[0]
            t = resized.round().clamp(0, 255).to(torch.uint8) if t.dtype == torch.uint8 else resized
        if xs and (t.shape != xs[0].shape or t.dtype != xs[0].dtype):
            raise DataError(f"{where}[{i}]: image {tuple(t.shape)} {t.dtype} differs from item 0's "
                            f"{tuple(xs[0].shape)} {xs[0].dtype}; set prepare.image_size to resize")
        xs.append(t)
        ys.append(int(label))
    return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)


def load_factory(p: PrepareParams) -> Raw:
    """Call the user's dataset factory and read its Datasets (layout in the module docstring)."""
    fn = import_callable(p.dataset, "prepare.dataset", DataError)
    try:
        out = fn(**p.dataset_args)
    except Exception as exc:
        raise DataError(f"prepare.dataset {p.dataset!r}: calling it failed ({type(exc).__name__}: "
                        f"{first_line(exc)})") from None
    if is_datamodule(out):
        return load_datamodule(out, p.dataset)
    if is_hf_trainer(out):  # train.framework: hf_trainer
        return raw_of_splits(trainer_splits(out, f"prepare.dataset {p.dataset!r}"), p.dataset)
    parts = dict(out) if isinstance(out, Mapping) else {"all": out}
    unknown = sorted(set(parts) - set(SPLITS) - {"all"})
    if unknown or ("all" not in parts and "train" not in parts):
        raise DataError(f"prepare.dataset {p.dataset!r} returned the keys {sorted(parts)}; expected one Dataset or "
                        "a mapping with train and optionally val and test")
    tensors = {k: _materialise(ds, f"{p.dataset} {k}", p.image_size) for k, ds in parts.items()}
    dtypes = {x.dtype for x, _ in tensors.values()}
    if len(dtypes) > 1:
        raise DataError(f"prepare.dataset {p.dataset!r}: the splits' images have different dtypes "
                        f"{sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    if dtype != torch.uint8:
        tensors = {k: (x.float(), y) for k, (x, y) in tensors.items()}
    labels = torch.cat([y for _, y in tensors.values()])
    first = parts.get("train", parts.get("all"))
    classes = [str(c) for c in getattr(first, "classes", [])] or [str(i) for i in range(int(labels.max()) + 1)]
    if labels.min() < 0 or labels.max() >= len(classes):
        raise DataError(f"prepare.dataset {p.dataset!r}: labels run from {int(labels.min())} to "
                        f"{int(labels.max())}, but there are {len(classes)} classes")
    if len(classes) < 2:
        raise DataError(f"prepare.dataset {p.dataset!r}: one class only; a classifier needs two")
    scale = 1 / 255 if dtype == torch.uint8 else 1.0
    if "all" in tensors:
        x, y = tensors["all"]
        return Raw(x, y, classes, scale, source=p.dataset)
    return Raw(None, None, classes, scale, tensors, source=p.dataset)
