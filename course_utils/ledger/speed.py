"""From FLOPs to time: achieved FLOP/s and model FLOPs utilisation (MFU) of a timed real step.

    achieved = FLOPs of the step / seconds          MFU = achieved / peak

``peak_flops(device)`` measures this machine's peak once per process, device and CPU thread
count (cached): the best of a few timed n×n fp32 matmuls, 2n³ FLOPs each. It is a practical
ceiling (what torch's matmul reaches here), not the vendor's datasheet number. The ledger's FLOPs
count matmul-like ops only, so MFU here is the fraction of the matmul peak the step's matmuls
would need to reach to take this long.

A peak timed while the machine was busy reads low, and a step timed later on an idle machine
would then show an MFU above 1, which no step can have. ``utilisation`` therefore re-measures the
peak when a step beats it, keeps the higher reading, and warns if the step still beats it.
"""
from __future__ import annotations

import time
import warnings

import torch

from .. import checks
from .measured import measure

_PEAKS: dict[tuple, float] = {}   # (device, size, repeats, CPU threads) -> best FLOP/s measured


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_peak(device: str, size: int, repeats: int) -> float:
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev)
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


def peak_flops(device="cpu", *, size: int | None = None, repeats: int = 5, again: bool = False) -> float:
    """This machine's measured fp32 matmul peak in FLOP/s (cached per device, size, repeats and,
    on the CPU, torch's thread count). ``size`` defaults to 1024 on the CPU and 8192 on a GPU.
    ``again``: time it once more and keep the higher of the two readings."""
    device = torch.device(device)
    size = checks.positive_int(size if size is not None else (8192 if device.type == "cuda" else 1024), "size")
    repeats = checks.positive_int(repeats, "repeats")
    key = (str(device), size, repeats, torch.get_num_threads() if device.type == "cpu" else None)
    if again or key not in _PEAKS:
        _PEAKS[key] = max(_PEAKS.get(key, 0.0), _time_peak(str(device), size, repeats))
    return _PEAKS[key]


def utilisation(flops: int, seconds: float, device="cpu") -> dict:
    """{"flops_per_second", "peak_flops", "mfu"} of a step of ``flops`` that took ``seconds``."""
    checks.positive_float(seconds, "seconds", hint="the measured wall time of the step")
    achieved = flops / seconds
    peak = peak_flops(device)
    if achieved > peak:   # the cached peak may have been timed on a busy machine: time it again
        peak = peak_flops(device, again=True)
        if achieved > peak:
            warnings.warn(f"a step of {flops:.3g} FLOPs in {seconds:.3g} s beats the measured matmul "
                          f"peak ({peak / 1e9:.1f} GFLOP/s) even re-measured: its kernels outrun one "
                          "large matmul here, so its MFU above 1 is not a utilisation", stacklevel=2)
    return {"flops_per_second": achieved, "peak_flops": peak, "mfu": achieved / peak}


def step_utilisation(step, seconds: float, device="cpu") -> dict:
    """Run ``step()`` once more under the ledger (for its FLOPs) and turn them and ``seconds``,
    the measured time of one such step, into {"flops", "flops_per_second", "peak_flops", "mfu"}.
    Call it after timing: the extra step must not be one of the timed ones."""
    flops = measure(step).flops
    return {"flops": flops, **utilisation(flops, seconds, device)}
