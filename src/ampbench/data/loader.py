"""The training loop's input: batches of model inputs, from device-resident tensors or streamed, and augmented.

Two paths (``train.data_on_device``), one batch order. Every epoch draws one permutation from the run's data
generator (CPU, seeded) and cuts it into global batches; then either

- **device tensors** (small sets, the fast path): the stored split (uint8 stays uint8) lives on the device and a
  batch is an index into it, or
- **streaming** (sets too large for that): a ``DataLoader`` whose workers slice the stored (memory-mapped) split
  on the host, into pinned memory, copied with ``non_blocking=True``; workers persist across epochs.

Both then normalise on the device (``splits.Norm``), apply the augmentation and the policy's input cast, so for the
same seed both paths give the same batches, bit for bit. The augmentation (``train.augment: crop_flip``, the CIFAR
recipe: zero padding of 4, random 32×32-style crop back to size, horizontal flip with p 0.5) draws its randomness
from a generator seeded by (seed, step), independent of the arm: every arm of a seed sees the same augmented
batches, so the comparison stays paired, and a resumed run continues the same sequence.

``wait_seconds`` is the time the loop spent waiting for its next batch (host side): when it is a large share of
the step time the run is input-bound, and precision cannot show its speed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ampbench.data.splits import Split
from ampbench.runtime import distributed
from ampbench.runtime.distributed import World
from ampbench.runtime.hardware import available_memory

DEVICE_SHARE = 0.25  # auto: keep a split on the device when it takes at most this share of free device memory
PAD = 4  # crop_flip: zero padding on each side before the random crop (the CIFAR recipe)


@dataclass(frozen=True)
class Batch:
    """One step's input on the device: this rank's model inputs and labels, and the global batch size."""

    x: torch.Tensor
    y: torch.Tensor
    size: int


def index_batches(n: int, batch_size: int, generator: torch.Generator, ranks: int = 1) -> list[torch.Tensor]:
    """One epoch's shuffled global index batches (CPU; the same on every rank: one generator, one seed). A
    trailing batch of one sample is dropped (BatchNorm cannot train on it), and with several ranks one that does
    not split evenly."""
    perm = torch.randperm(n, generator=generator)
    batches = [perm[s:s + batch_size] for s in range(0, n, batch_size)]
    return [b for b in batches if len(b) > 1 and len(b) % ranks == 0]


def batches_per_epoch(n: int, batch_size: int, ranks: int = 1) -> int:
    """How many batches ``index_batches`` yields per epoch (the same drop rules, without shuffling)."""
    full, rest = divmod(n, batch_size)
    return sum(1 for size in [batch_size] * full + [rest] if size > 1 and size % ranks == 0)


def keep_on_device(setting: bool | str, split: Split, device: torch.device) -> bool:
    """``train.data_on_device``: true / false as set; auto when the stored split fits in DEVICE_SHARE of the
    free memory of the device that trains."""
    if setting != "auto":
        return bool(setting)
    size = split.x.element_size() * split.x.numel() + split.y.element_size() * split.y.numel()
    return size <= DEVICE_SHARE * available_memory(device)


def crop_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Random crop after zero padding, and horizontal flip, of a batch (N, C, H, W) of any dtype on any device:
    ``offsets`` (N, 2) row and column of the crop in [0, 2·PAD], ``flips`` (N,) bool. Two gathers, no loop."""
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (PAD, PAD, PAD, PAD))
    rows = offsets[:, 0].view(n, 1, 1, 1) + torch.arange(h, device=x.device).view(1, 1, h, 1)
    out = padded.gather(2, rows.expand(n, c, h, w + 2 * PAD))
    cols = offsets[:, 1].view(n, 1, 1, 1) + torch.arange(w, device=x.device).view(1, 1, 1, w)
    cols = torch.where(flips.view(n, 1, 1, 1), cols.flip(-1), cols)
    return out.gather(3, cols.expand(n, c, h, w))


def augment_params(seed: int, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, flips) for the global batch of ``step``: from a generator seeded by (seed, step) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    offsets = torch.randint(0, 2 * PAD + 1, (n, 2), generator=g)
    flips = torch.rand(n, generator=g) < 0.5
    return offsets, flips


class _Rows(torch.utils.data.Dataset):
    """A stored split sliced a whole batch at a time (one fancy index per batch, no per-sample Python)."""

    def __init__(self, split: Split):
        self.x, self.y = split.x, split.y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


class _EpochSampler(torch.utils.data.Sampler):
    """Yields the current epoch's index batches (this rank's slice of each), set before every epoch."""

    def __init__(self):
        self.batches: list[torch.Tensor] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class InputPipeline:
    """The batches of one training run (see the module docstring)."""

    def __init__(self, split: Split, device: torch.device, *, on_device: bool, batch_size: int, augment: str,
                 seed: int, cast=lambda x: x, memory_format: torch.memory_format = torch.contiguous_format,
                 workers: int = 2, world: World = distributed.SINGLE):
        self.split, self.device, self.on_device = split, device, on_device
        self.batch_size, self.augment, self.seed, self.cast = batch_size, augment, seed, cast
        self.memory_format, self.world = memory_format, world
        self.wait_seconds = 0.0
        if on_device:
            self.x, self.y = split.x.to(device), split.y.to(device)
        else:
            self.sampler = _EpochSampler()
            pin = device.type == "cuda"
            self.loader = torch.utils.data.DataLoader(
                _Rows(split), sampler=self.sampler, batch_size=None, num_workers=workers, pin_memory=pin,
                persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None)

    def __len__(self) -> int:
        return len(self.split)

    def _augment_params(self, batches: list[torch.Tensor], first_step: int) -> list[tuple[torch.Tensor, ...]]:
        """This rank's (offsets, flips) per step of the epoch, on the device: drawn per (seed, step), copied to
        the device once per epoch (a copy from pageable host memory per step would stall the GPU stream)."""
        drawn = [augment_params(self.seed, first_step + k, len(b)) for k, b in enumerate(batches)]
        mine = [tuple(distributed.shard(t, self.world) for t in pair) for pair in drawn]
        sizes = [len(o) for o, _ in mine]
        offsets = torch.cat([o for o, _ in mine]).to(self.device).split(sizes)
        flips = torch.cat([f for _, f in mine]).to(self.device).split(sizes)
        return list(zip(offsets, flips, strict=True))

    def epoch(self, generator: torch.Generator, first_step: int) -> Iterator[Batch]:
        """This epoch's batches; ``first_step`` is the run's step count before it (seeds the augmentation)."""
        batches = index_batches(len(self.split), self.batch_size, generator, self.world.size)
        mine = [distributed.shard(b, self.world) for b in batches]
        augment = self._augment_params(batches, first_step) if self.augment == "crop_flip" and batches else None
        self.wait_seconds = 0.0
        if self.on_device:  # the epoch's indices go to the device in one copy, then each batch is a view
            on_dev = torch.cat(mine).to(self.device).split([len(m) for m in mine]) if mine else []
            source = ((self.x[i], self.y[i]) for i in on_dev)
        else:
            self.sampler.batches = mine
            source = ((x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
                      for x, y in self.loader)
        for k, b in enumerate(batches):
            start = time.perf_counter()
            x, y = next(source)
            self.wait_seconds += time.perf_counter() - start
            if augment is not None:
                x = crop_flip(x, *augment[k])
            x = self.cast(self.split.inputs(x)).contiguous(memory_format=self.memory_format)
            yield Batch(x, y, len(b))
