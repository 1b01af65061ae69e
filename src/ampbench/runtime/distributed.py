"""Data-parallel training through torchrun: process group set-up from torchrun's environment, sums across ranks.

The train stage relaunches itself under ``torchrun`` when ``train.nproc_per_node`` > 1. Every rank trains on
its slice of each global batch; DistributedDataParallel averages gradients, so autocast and GradScaler work as
on one device. Only rank 0 writes files and talks to MLflow. gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place in the job (a single process is rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1


SINGLE = World()  # a process on its own


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device_type: str) -> World:
    """Join the process group torchrun set up (no-op for a single process)."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return SINGLE
    world = World(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group(backend=backend)
    return world


def device_for(world: World, device: torch.device) -> torch.device:
    """One GPU per rank; CPU ranks share the CPU."""
    return torch.device("cuda", world.local_rank) if device.type == "cuda" else device


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel around ``model`` when the job has several ranks; the model itself otherwise."""
    if not world.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def shard(idx: torch.Tensor, world: World) -> torch.Tensor:
    """This rank's contiguous slice of a global batch of indices."""
    return idx.chunk(world.size)[world.rank] if world.active else idx


def sum_(t: torch.Tensor, world: World) -> torch.Tensor:
    """Sum of ``t`` over ranks (in place; returns it)."""
    if world.active:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(world: World) -> None:
    if world.active:
        dist.barrier()


def shutdown(world: World) -> None:
    if world.active and dist.is_initialized():
        dist.destroy_process_group()
