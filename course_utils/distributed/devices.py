"""Which backend a group uses and which device a rank computes on: the two facts every worker,
the launcher and the placement check share."""
from __future__ import annotations

import torch
import torch.distributed as dist


def default_backend(world_size: int) -> str:
    """NCCL when CUDA can give every rank its own GPU, else gloo (CPU)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


# One object, so that device_check can tell "moved to the rank's device" from "sent to the host"
# on a CPU rank, where both are the CPU.
GLOO_DEVICE = torch.device("cpu")


def worker_device() -> torch.device:
    """The device this rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return GLOO_DEVICE
