"""From FLOPs to time: achieved FLOP/s and model FLOPs utilisation (MFU) of a timed real step.

    achieved = FLOPs of the step / seconds          MFU = achieved / peak

``peak_flops(device)`` measures this machine's peak once per process (cached): the best of a few
timed n×n fp32 matmuls, 2n³ FLOPs each. It is a practical ceiling (what torch's matmul reaches
here), not the vendor's datasheet number. The ledger's FLOPs count matmul-like ops only, so MFU
here is the fraction of the matmul peak the step's matmuls would need to reach to take this long.
"""
from __future__ import annotations

import functools
import time

import torch

from .. import checks
from .measured import measure


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.lru_cache(maxsize=None)
def _peak(device: str, size: int, repeats: int) -> float:
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev, generator=None)
    b = torch.randn(size, size, device=dev)
    a @ b   # warm-up
    best = float("inf")
    for _ in range(repeats):
        _synchronize(dev)
        start = time.perf_counter()
        a @ b
        _synchronize(dev)
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def peak_flops(device="cpu", *, size: int | None = None, repeats: int = 5) -> float:
    """This machine's measured fp32 matmul peak in FLOP/s (cached per device, size, repeats).
    ``size`` defaults to 1024 on the CPU and 8192 on a GPU."""
    device = torch.device(device)
    size = checks.positive_int(size if size is not None else (8192 if device.type == "cuda" else 1024), "size")
    return _peak(str(device), size, checks.positive_int(repeats, "repeats"))


def utilisation(flops: int, seconds: float, device="cpu") -> dict:
    """{"flops_per_second", "peak_flops", "mfu"} of a step of ``flops`` that took ``seconds``."""
    checks.positive_float(seconds, "seconds", hint="the measured wall time of the step")
    achieved = flops / seconds
    peak = peak_flops(device)
    return {"flops_per_second": achieved, "peak_flops": peak, "mfu": achieved / peak}


def step_utilisation(step, seconds: float, device="cpu") -> dict:
    """Run ``step()`` once more under the ledger (for its FLOPs) and turn them and ``seconds``,
    the measured time of one such step, into {"flops", "flops_per_second", "peak_flops", "mfu"}.
    Call it after timing: the extra step must not be one of the timed ones."""
    flops = measure(step).flops
    return {"flops": flops, **utilisation(flops, seconds, device)}
