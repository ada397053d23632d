"""Where pixels go: random resized crop, horizontal flip, quarter turns. B×C×H×W -> B×C×H'×W'.

Each sample gets its own parameters; the whole batch is then moved by one batched op (one
``grid_sample`` for every crop, one ``where`` per flip or turn).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import checks
from .batch import check_batch, coin, interval, output_size, select, uniform


def random_resized_crop(x: torch.Tensor, size, scale=(0.2, 1.0), ratio=(3 / 4, 4 / 3),
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """Crop a random box from each image and resize it to `size` (int or (h, w)).

    Per sample: area fraction a ~ U(scale), aspect r = exp(U(log ratio)); the box is
    w = sqrt(a·r)·W by h = sqrt(a/r)·H pixels (clipped to the image, so extreme (a, r) give a
    slightly smaller area than drawn instead of torchvision's retry loop), centred uniformly
    where it fits. One affine grid per sample,
        [x_in, y_in] = [[w/W, 0], [0, h/H]] · [x_out, y_out] + [cx, cy]   (normalised coords),
    then one bilinear grid_sample for the whole batch: B×C×H×W -> B×C×h_out×w_out.
    """
    check_batch(x)
    out_h, out_w = output_size(size)
    lo, hi = interval(scale, "scale", 0.0, 1.0)
    rlo, rhi = interval(ratio, "ratio", 0.0, math.inf)
    b, c, h, w = x.shape
    area = uniform(b, lo, hi, generator, x.device)                          # B
    log_r = uniform(b, math.log(rlo), math.log(rhi), generator, x.device)  # B
    aspect = torch.exp(log_r)
    # box side as a fraction of the image side; aspect is in pixels (w_px / h_px)
    frac_w = torch.sqrt(area * aspect * h / w).clamp(max=1.0)               # B
    frac_h = torch.sqrt(area / aspect * w / h).clamp(max=1.0)
    cx = (2 * uniform(b, 0.0, 1.0, generator, x.device) - 1) * (1 - frac_w)  # box centre in [-1, 1]
    cy = (2 * uniform(b, 0.0, 1.0, generator, x.device) - 1) * (1 - frac_h)
    theta = torch.zeros(b, 2, 3, device=x.device, dtype=x.dtype)           # B×2×3 affine maps
    theta[:, 0, 0], theta[:, 0, 2] = frac_w, cx
    theta[:, 1, 1], theta[:, 1, 2] = frac_h, cy
    grid = F.affine_grid(theta, [b, c, out_h, out_w], align_corners=False)  # B×h×w×2
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.clamp_(0.0, 1.0)


def horizontal_flip(x: torch.Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each image left-right with probability p. B×C×H×W -> B×C×H×W."""
    check_batch(x)
    p = checks.fraction(p, "p", closed_right=True)
    flip = coin(x.shape[0], p, generator, x.device)                         # B
    return select(flip, x.flip(-1), x)


def random_rot90(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Rotate each square image by k·90°, k ~ U{0, 1, 2, 3} per sample. B×C×S×S -> B×C×S×S.

    Exact (a permutation of pixels, no interpolation). Use it when orientation is a nuisance of
    the data, as in "shapes" (every shape is drawn at a random rotation): the two views then
    disagree on orientation and the encoder cannot match them by it.
    """
    check_batch(x)
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"random_rot90 needs square images, got {x.shape[-2]}×{x.shape[-1]}; "
                         "crop to a square first (random_resized_crop(x, size=S))")
    k = torch.floor(uniform(x.shape[0], 0.0, 4.0, generator, x.device)).clamp_(max=3)  # B
    out = x
    for turns in (1, 2, 3):
        out = select(k == turns, torch.rot90(x, turns, dims=(2, 3)), out)
    return out
