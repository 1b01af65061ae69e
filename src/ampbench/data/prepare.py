"""Prepared data: the raw data split deterministically and normalised from its training split, stored compactly,
loaded and checked. The one module that writes and reads ``data/prepared/``.

Prepared data is three ``{split}.pt`` files (x: N×C×H×W as stored — uint8 for 8-bit images, float32 otherwise;
y: int64 N) plus ``meta.json`` with shapes, classes, the normalisation (scale, per-channel mean and std from the
training split) and a content checksum. The raw sources are ``readers.py``; the types are ``splits.py``. Each
split's cap (``CAPS``: ``prepare.max_train``, ``max_val``, ``max_test``) cuts every kind of data alike, and what it
cut is recorded and said (``cut_notes``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ampbench.data.readers import load_raw
from ampbench.data.splits import Norm, Prepared, Split
from ampbench.data.text import VOCAB_SIZE, read_tokens, split_by_position
from ampbench.data.user_data import SPLITS, Raw
from ampbench.errors import DataError
from ampbench.runtime.files import atomic_torch_save, atomic_write_text

if TYPE_CHECKING:  # params needs pydantic; the bench must run where only torch is installed
    from ampbench.config.params import PrepareParams

CAPS = {"train": "max_train", "val": "max_val", "test": "max_test"}  # each split's cap among prepare's params
OVERSIZED_VAL = 10  # an uncapped validation split this many times training's size is said, at prepare and in the report


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


def tensors_digest(*tensors: torch.Tensor) -> str:
    """sha256 of the tensors' shapes, dtypes and values."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def cap_splits(parts: dict[str, Any], p: PrepareParams, size: Callable[[Any], int],
               cut: Callable[[str, Any, int, int], Any]) -> dict[str, int]:
    """Each split of ``parts`` longer than its cap (``CAPS``) replaced by ``cut(name, part, cap, p.seed)``, in
    place, for every kind of data alike; ``{name}_available`` (its size before the cut) of each split cut."""
    before = {}
    for name, key in CAPS.items():
        cap = getattr(p, key)
        if cap is not None and cap < size(parts[name]):
            before[f"{name}_available"] = size(parts[name])
            parts[name] = cut(name, parts[name], cap, p.seed)
    return before


def _cut_samples(name: str, pair: tuple[torch.Tensor, ...], cap: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Train's first ``cap`` samples (already shuffled where the split was cut from the data); val's and test's a
    seeded random subset, in the data set's order. Copies: a view would carry the uncut split into its file."""
    if name == "train":
        return tuple(t[:cap].clone() for t in pair)
    keep = torch.randperm(len(pair[1]), generator=torch.Generator().manual_seed(seed))[:cap].sort().values
    return tuple(t[keep] for t in pair)


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
    only (nothing leaks from val/test). Images keep their stored dtype (uint8 stays uint8). Text
    (``prepare.dataset: text``) becomes byte tokens split by position (``prepare_text``)."""
    if p.dataset == "text":
        return prepare_text(p, raw_dir)
    raw = load_raw(p, raw_dir)
    raw_splits = _split(raw, p)
    # Where the test split came from and how large it was before max_test: what a sample-size plan can change.
    test_from = "publisher" if raw.splits and "test" in raw.splits else "test_fraction"
    test_available = len(raw_splits["test"][1])
    # A datamodule's own test split, before max_test: what its every training run must find again (evaluate pairs
    # the arms on it, so a seed that drew another split may have trained on the test examples).
    own_test = {"datamodule_test": tensors_digest(*raw_splits["test"])} if raw.normalised else {}
    cut = cap_splits(raw_splits, p, lambda pair: len(pair[1]), _cut_samples)
    x_train = raw_splits["train"][0]
    shapes = {name: tuple(xs.shape[1:]) for name, (xs, _) in raw_splits.items()}
    if len(set(shapes.values())) != 1:
        raise DataError(f"{p.dataset}: the splits' images differ in shape ({shapes}); set prepare.image_size")
    # A LightningDataModule's batches (kind "inputs") are what the module trains on: no normalisation of ours.
    mean, std = ([0.0], [1.0]) if raw.normalised else channel_stats(x_train, raw.scale)
    norm = Norm(raw.scale, tuple(mean), tuple(std))
    splits = {name: Split(xs.contiguous(), ys.clone(), norm) for name, (xs, ys) in raw_splits.items()}
    meta = {
        "dataset": p.dataset,
        **({"kind": "inputs"} if raw.normalised else {}),
        **({"vocab_size": raw.vocab_size} if raw.vocab_size else {}),
        "source": raw.source,
        "input_shape": list(x_train.shape[1:]),
        "stored_dtype": str(x_train.dtype).removeprefix("torch."),
        "classes": raw.classes,
        "sizes": {name: len(s) for name, s in splits.items()},
        "scale": raw.scale,
        "mean": mean,
        "std": std,
        "seed": p.seed,
        "test_from": test_from,
        "test_available": test_available,
        **cut,
        **own_test,
        "checksum": checksum(splits),
    }
    return Prepared(splits["train"], splits["val"], splits["test"], meta)




def prepare_text(p: PrepareParams, raw_dir: Path) -> Prepared:
    """UTF-8 text under ``raw_dir`` as byte tokens (``text.py``), cut by position into train, val and test. Each
    split holds its token stream twice, as x and as y: one storage (the file holds it once); the language-model
    task cuts it into sequences of ``train.block_size`` when it trains."""
    tokens, read = read_tokens(Path(raw_dir))
    parts = split_by_position(tokens, p.val_fraction, p.test_fraction)
    test_available = len(parts["test"])
    # A copy of the first tokens: a view would carry the whole uncut text into the split's file.
    cut = cap_splits(parts, p, len, lambda name, tokens, cap, seed: tokens[:cap].clone())
    splits = {name: Split(t, t) for name, t in parts.items()}
    meta = {"dataset": p.dataset, "source": str(raw_dir), "kind": "tokens", "tokenizer": "utf-8 bytes",
            "vocab_size": VOCAB_SIZE, "input_shape": [], "stored_dtype": "uint8", **read,
            "sizes": {name: len(s) for name, s in splits.items()}, "seed": p.seed, "test_from": "test_fraction",
            "test_available": test_available, **cut, "checksum": checksum(splits)}
    return Prepared(splits["train"], splits["val"], splits["test"], meta)


def describe(meta: dict) -> str:
    """The prepared data in one line: what, from where, its form and its split sizes."""
    if meta.get("kind") == "tokens":
        skipped = meta.get("binary_files_skipped")
        form = (f"{meta['files']} text file(s) as {meta['tokenizer']} ({meta['vocab_size']} symbols)"
                + (f", {skipped} binary file(s) skipped" if skipped else "") + ", split by position, tokens")
    else:
        form = f"input {tuple(meta['input_shape'])} {meta['stored_dtype']}, {len(meta['classes'])} classes, splits"
    return f"{meta['dataset']} from {meta['source']}: {form} {meta['sizes']}"


def cut_notes(meta: dict) -> list[str]:
    """What prepare's caps did, in the data's unit (samples, or tokens): each split they cut with its size before
    the cut; and an uncut validation split over ``OVERSIZED_VAL``× training's, which every epoch evaluates (a
    ``max_train`` on a large text). Said by the prepare stage and in the report; nothing when neither holds."""
    unit = "tokens" if meta.get("kind") == "tokens" else "samples"
    sizes, label = meta["sizes"], {"train": "train", "val": "validation", "test": "test"}
    cut = [f"{label[name]} to {sizes[name]:,} of {meta[f'{name}_available']:,} {unit} (prepare.{key})"
           for name, key in CAPS.items() if (meta.get(f"{name}_available") or 0) > sizes[name]]
    notes = [f"Cut by prepare's caps: {', '.join(cut)}."] if cut else []
    if "val_available" not in meta and 0 < OVERSIZED_VAL * sizes["train"] < sizes["val"]:
        notes.append(f"Validation holds {sizes['val'] / sizes['train']:,.0f}× the training {unit} ({sizes['val']:,} "
                     f"against {sizes['train']:,}) and every epoch evaluates it; prepare.max_val caps it.")
    return notes


def save_prepared(data: Prepared, out_dir: Path) -> None:
    """Write ``{split}.pt`` and ``meta.json`` under out_dir, each atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        split = getattr(data, name)
        atomic_torch_save({"x": split.x, "y": split.y}, out_dir / f"{name}.pt")
    atomic_write_text(out_dir / "meta.json", json.dumps(data.meta, indent=2) + "\n")


def load_prepared(in_dir: Path) -> Prepared:
    """Load prepared data (memory-mapped: a set larger than memory pages in as batches need it) and check it
    against its meta.json (its fields' types, ``records``; then shapes and checksum)."""
    from ampbench.config.records import check_meta  # pydantic: only where prepared data is read, not in the bench

    meta_path = in_dir / "meta.json"
    if not meta_path.exists():
        raise DataError(f"{meta_path} not found: run the prepare stage first (dvc repro prepare)")
    try:
        meta = check_meta(json.loads(meta_path.read_text()), meta_path)
        norm = (None if meta.get("kind") in ("tokens", "inputs")  # token ids; a datamodule's batches as they are
                else Norm(meta["scale"], tuple(meta["mean"]), tuple(meta["std"])))
        splits = {}
        for name in SPLITS:
            blob = torch.load(in_dir / f"{name}.pt", weights_only=True, mmap=True)
            splits[name] = Split(blob["x"], blob["y"], norm)
    except DataError:
        raise
    except Exception as exc:  # torch.load of a damaged file can raise almost anything (pickle internals)
        raise DataError(f"{in_dir}: prepared data unreadable ({type(exc).__name__}: {exc}); rerun prepare") from None
    for name, split in splits.items():
        if list(split.x.shape[1:]) != meta["input_shape"] or len(split) != meta["sizes"][name]:
            raise DataError(f"{in_dir}/{name}.pt: shape {tuple(split.x.shape)} does not match meta.json; rerun prepare")
    if checksum(splits) != meta["checksum"]:
        raise DataError(f"{in_dir}: checksum mismatch with meta.json (files changed or corrupt); rerun prepare")
    return Prepared(splits["train"], splits["val"], splits["test"], meta)
