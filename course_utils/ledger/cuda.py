"""What the CUDA caching allocator reports about a step: its peak, and a timeline of allocations.

Read only here: ``measure`` books ``peak_bytes`` through ``cuda_peak_bytes``, and lessons call it
directly. On a machine without CUDA neither function records anything.
"""
from __future__ import annotations

from pathlib import Path

import torch


def cuda_peak_bytes(step, device=None) -> int | None:
    """Run ``step()`` once; return the peak bytes the CUDA caching allocator handed out during it
    above what was allocated before (``torch.cuda.max_memory_allocated``), or None when ``device``
    is not a CUDA device. ``device`` defaults to CUDA when this machine has it, else the CPU."""
    device = torch.device(device if device is not None else
                          "cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        step()
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def record_memory_snapshot(step, path) -> Path | None:
    """Run ``step()`` with CUDA allocation history on and write a snapshot (a pickle) that
    https://pytorch.org/memory_viz opens: every allocation, its stack trace, over time.
    Returns the path, or None without CUDA (then the step does not run: nothing to record)."""
    if not torch.cuda.is_available():
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        step()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path
