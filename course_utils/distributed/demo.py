"""Tiny workers that show what the launcher does, including when things go wrong.

They live here, not in a notebook, because each rank re-imports its worker by module and name.
"""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist


def hello_all_reduce(rank: int, world_size: int) -> dict:
    """Each rank contributes rank + 1; all-reduce (sum) gives every rank n(n+1)/2."""
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)  # default op: SUM, result written in place on every rank
    return {"rank": rank, "world_size": world_size, "sum": value.item(),
            "backend": dist.get_backend(), "pid": os.getpid()}


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` raises; the others wait in a collective that can never complete."""
    if rank == bad_rank:
        raise ValueError(f"rank {rank} found a NaN in its shard (on purpose)")
    dist.barrier()
    return rank


def die_on_rank(rank: int, world_size: int, bad_rank: int = 1, after_steps: int = 2) -> int:
    """All ranks all-reduce for a few steps, then ``bad_rank`` is killed (SIGKILL, no traceback)."""
    grad = torch.ones(4)
    for step in range(after_steps + 100):
        if rank == bad_rank and step == after_steps:
            os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer or a lost node
        dist.all_reduce(grad)
        grad /= world_size
    return rank


def hang_on_rank(rank: int, world_size: int, bad_rank: int = 1, seconds: float = 600.0) -> int:
    """``bad_rank`` sleeps while the others wait for it in a barrier: only a timeout ends this."""
    if rank == bad_rank:
        time.sleep(seconds)
    dist.barrier()
    return rank
