"""Workers that exist only to test the launcher: a rank killed without a traceback, a rank that
hangs. They live here, not in ``course_utils.experiments`` (whose workers the lessons launch and
``tools/gpu_check.py`` runs on a GPU); ``launch`` re-imports them in each rank by this module's
name, which the ranks find on the test process's ``sys.path``."""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from course_utils.distributed import worker_device


def die_on_rank(rank: int, world_size: int, bad_rank: int = 1, after_steps: int = 2) -> int:
    """All ranks all-reduce for a few steps, then ``bad_rank`` is killed (SIGKILL, no traceback)."""
    grad = torch.ones(4, device=worker_device())
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
