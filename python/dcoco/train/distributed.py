"""The torchrun process group and the device of this rank."""

from __future__ import annotations

import atexit
import datetime
import os

import torch
import torch.distributed as dist

from .config import TrainConfig


def init_distributed(timeout_minutes: float = TrainConfig.dist_timeout) -> tuple[int, int]:
    """(rank, world): joins the torchrun group when WORLD_SIZE > 1 (nccl on GPU, gloo on CPU), with collectives
    allowed to wait timeout_minutes (NCCL's own default, 10 minutes, aborts ranks waiting on a long step)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # nccl binds each rank to its GPU
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                timeout=datetime.timedelta(minutes=timeout_minutes))
        # torn down before the interpreter's own shutdown: a gloo group left to C++ static destruction can abort
        # the rank ("terminate called without an active exception", seen in CI once in a few runs)
        atexit.register(_destroy_group)
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    return torch.device(name)
