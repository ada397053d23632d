"""What every augmentation shares: per-sample random draws and the checks on its arguments.

Random numbers are drawn on the generator's device and used on the batch's device, so a CPU
``torch.Generator`` drives a CUDA batch and the same generator state gives the same parameters.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .. import checks


def uniform(n: int, lo: float, hi: float, generator, device) -> torch.Tensor:
    """n samples of U(lo, hi) on `device`, drawn from `generator` on its own device."""
    draw_device = generator.device if generator is not None else device
    u = torch.rand(n, generator=generator, device=draw_device)
    return (lo + (hi - lo) * u).to(device)


def coin(n: int, p: float, generator, device) -> torch.Tensor:
    """n booleans, each True with probability p (always drawn, so p does not shift the stream)."""
    return uniform(n, 0.0, 1.0, generator, device) < p


def select(mask: torch.Tensor, changed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-sample choice: changed[b] where mask[b], else x[b]. mask: B bool."""
    return torch.where(mask[:, None, None, None], changed, x)


# ----------------------------------------------------------------------------------------------
# Argument checks specific to image batches (the generic ones are course_utils.checks)


def check_batch(x) -> torch.Tensor:
    """x is a float tensor B×C×H×W (values in [0, 1] are the caller's promise)."""
    checks.tensor(x, "x", shape_hint="B×C×H×W")
    if x.dim() != 4:
        raise ValueError(f"x must be a batch B×C×H×W (4 dims), got shape {tuple(x.shape)}; "
                         f"for one image pass x[None]")
    if not x.is_floating_point():
        raise TypeError(f"x must be a float tensor in [0, 1], got {x.dtype}; pass x.float() / 255")
    return x


def check_rgb_or_gray(x: torch.Tensor, what: str) -> None:
    if x.shape[1] not in (1, 3):
        raise ValueError(f"{what} needs 1 (gray) or 3 (RGB) channels, got {x.shape[1]}")


def output_size(size) -> tuple[int, int]:
    """An int S (square S×S) or a pair (h, w) of positive ints -> (h, w)."""
    pair = tuple(size) if isinstance(size, Sequence) and not isinstance(size, str) else (size, size)
    if len(pair) != 2:
        raise ValueError(f"size must be a positive int or a pair (h, w) of them, got {size!r}")
    h, w = (checks.positive_int(s, "size", hint="pass an int or a pair (h, w)") for s in pair)
    return h, w


def interval(pair, name: str, low: float, high: float) -> tuple[float, float]:
    """A pair (lo, hi) of numbers with low < lo <= hi <= high."""
    ok = (isinstance(pair, Sequence) and len(pair) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair))
    if ok:
        lo, hi = float(pair[0]), float(pair[1])
        ok = low < lo <= hi <= high
    if not ok:
        raise ValueError(f"{name} must be a pair (lo, hi) with lo <= hi inside ({low}, {high}], got {pair!r}")
    return lo, hi
