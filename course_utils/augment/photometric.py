"""What pixels become: brightness, contrast, saturation, hue, grayscale and Gaussian blur.

Formulas per op in its docstring; factors are per sample (a number or a B-vector). Colour needs
RGB (C = 3): on one channel ``random_grayscale`` is a no-op and ``color_jitter`` applies brightness
and contrast only. Luma uses torchvision's weights (0.2989, 0.587, 0.114), so the results match
``torchvision.transforms.v2.functional`` to float precision (tests/test_augment.py checks it).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import checks
from .batch import check_batch, check_rgb_or_gray, coin, interval, select, uniform

# ITU-R 601 luma weights as torchvision's rgb_to_grayscale writes them (0.2989, not 0.299)
_LUMA = (0.2989, 0.587, 0.114)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma of RGB x: B×3×H×W -> B×1×H×W, 0.2989 R + 0.587 G + 0.114 B."""
    r, g, b = x.unbind(1)
    return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b)[:, None]


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor·x + (1 - factor)·other, per-sample factor (B,), clipped to [0, 1]."""
    f = factor[:, None, None, None]
    return (f * x + (1 - f) * other).clamp_(0.0, 1.0)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """RGB B×3×H×W in [0, 1] -> HSV B×3×H×W, hue in [0, 1) (fraction of a turn)."""
    r, g, b = x.unbind(1)
    maxc, _ = x.max(1)
    minc, _ = x.min(1)
    delta = maxc - minc
    v = maxc
    s = torch.where(maxc > 0, delta / maxc.clamp(min=1e-12), torch.zeros_like(maxc))
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    # the sector of the hue circle follows which channel is the largest
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(delta > 0, (h / 6.0) % 1.0, torch.zeros_like(h))
    return torch.stack([h, s, v], 1)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """HSV B×3×H×W (hue in [0, 1)) -> RGB B×3×H×W in [0, 1]. Inverse of rgb_to_hsv."""
    h, s, v = x.unbind(1)
    # c_k = v - v·s·clamp(min(k', 4 - k'), 0, 1) with k' = (n + 6h) mod 6, n = 5, 3, 1 for R, G, B
    n = torch.tensor([5.0, 3.0, 1.0], device=x.device, dtype=x.dtype)[None, :, None, None]
    k = (n + 6.0 * h[:, None]) % 6.0                                         # B×3×H×W
    ramp = torch.minimum(k, 4.0 - k).clamp(0.0, 1.0)
    return (v[:, None] - v[:, None] * s[:, None] * ramp).clamp(0.0, 1.0)


def _per_sample(factor, x: torch.Tensor, what: str) -> torch.Tensor:
    """A number or a B-vector -> B-vector on x's device and dtype."""
    f = torch.as_tensor(factor, dtype=x.dtype, device=x.device)
    if f.dim() == 0:
        f = f.expand(x.shape[0])
    if f.shape != (x.shape[0],):
        raise ValueError(f"{what} must be a number or one value per sample (shape ({x.shape[0]},)), "
                         f"got shape {tuple(f.shape)}")
    return f


def adjust_brightness(x: torch.Tensor, factor) -> torch.Tensor:
    """x <- clip(f·x), f per sample (number or B). B×C×H×W -> B×C×H×W."""
    check_batch(x)
    f = _per_sample(factor, x, "factor")
    return (x * f[:, None, None, None]).clamp(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, factor) -> torch.Tensor:
    """x <- clip(f·x + (1-f)·m), m = mean luma of the image, f per sample. B×C×H×W -> same."""
    check_batch(x)
    check_rgb_or_gray(x, "adjust_contrast")
    f = _per_sample(factor, x, "factor")
    gray = x if x.shape[1] == 1 else _gray(x)
    mean = gray.mean(dim=(1, 2, 3), keepdim=True)                            # B×1×1×1
    return _blend(x, mean, f)


def adjust_saturation(x: torch.Tensor, factor) -> torch.Tensor:
    """x <- clip(f·x + (1-f)·gray(x)) per pixel, f per sample. RGB only: B×3×H×W -> B×3×H×W."""
    check_batch(x)
    if x.shape[1] != 3:
        raise ValueError(f"adjust_saturation needs RGB (3 channels), got {x.shape[1]}")
    return _blend(x, _gray(x), _per_sample(factor, x, "factor"))


def adjust_hue(x: torch.Tensor, shift) -> torch.Tensor:
    """Rotate hue by `shift` turns (number or B, in [-0.5, 0.5]) in HSV. RGB only, B×3×H×W."""
    check_batch(x)
    if x.shape[1] != 3:
        raise ValueError(f"adjust_hue needs RGB (3 channels), got {x.shape[1]}")
    d = _per_sample(shift, x, "shift")
    h, s, v = rgb_to_hsv(x).unbind(1)
    return hsv_to_rgb(torch.stack([(h + d[:, None, None]) % 1.0, s, v], 1))


def color_jitter(x: torch.Tensor, brightness: float = 0.4, contrast: float = 0.4,
                 saturation: float = 0.4, hue: float = 0.1, p: float = 0.8,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per sample, jitter brightness, contrast, saturation and hue.

    Factors per sample: b ~ U(max(0, 1-brightness), 1+brightness), likewise c and s;
    hue shift d ~ U(-hue, hue) turns. Applied in this fixed order (torchvision shuffles it):
        brightness  x <- clip(b·x)
        contrast    x <- clip(c·x + (1-c)·mean(gray(x)))      (mean over the image)
        saturation  x <- clip(s·x + (1-s)·gray(x))            (per pixel)
        hue         HSV, h <- (h + d) mod 1, back to RGB
    B×C×H×W -> B×C×H×W. One channel: brightness and contrast only (saturation=hue=0 required).
    """
    check_batch(x)
    p = checks.fraction(p, "p", closed_right=True)
    for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
        checks.float_in_range(value, name, hint="0 turns it off")
    checks.float_in_range(hue, "hue", 0, 0.5, hint="a fraction of a turn")
    c = x.shape[1]
    if c == 1 and (saturation > 0 or hue > 0):
        raise ValueError("saturation and hue need RGB input, but x has 1 channel; pass "
                         "saturation=0, hue=0 for grayscale images (or repeat x to 3 channels)")
    check_rgb_or_gray(x, "color_jitter")
    b, dev = x.shape[0], x.device
    apply = coin(b, p, generator, dev)
    # draw every factor even when it is off, so changing one strength leaves the others' stream
    fb = uniform(b, max(0.0, 1 - brightness), 1 + brightness, generator, dev)
    fc = uniform(b, max(0.0, 1 - contrast), 1 + contrast, generator, dev)
    fs = uniform(b, max(0.0, 1 - saturation), 1 + saturation, generator, dev)
    dh = uniform(b, -hue, hue, generator, dev)
    y = x
    if brightness > 0:
        y = adjust_brightness(y, fb)
    if contrast > 0:
        y = adjust_contrast(y, fc)
    if saturation > 0:
        y = adjust_saturation(y, fs)
    if hue > 0:
        y = adjust_hue(y, dh)
    return select(apply, y, x)


def random_grayscale(x: torch.Tensor, p: float = 0.2, generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per sample replace RGB by its luma on all three channels.
    B×3×H×W -> B×3×H×W. One-channel input is already gray: returned unchanged (a documented no-op)."""
    check_batch(x)
    p = checks.fraction(p, "p", closed_right=True)
    check_rgb_or_gray(x, "random_grayscale")
    apply = coin(x.shape[0], p, generator, x.device)
    if x.shape[1] == 1:
        return x.clone()
    return select(apply, _gray(x).expand_as(x), x)


def gaussian_blur(x: torch.Tensor, kernel_size: int, sigma=(0.1, 2.0), p: float = 0.5,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per sample blur with a Gaussian of sigma ~ U(sigma) pixels.

    Kernel k_b(i) = exp(-i² / 2σ_b²) / Σ_j exp(-j² / 2σ_b²), i in [-K//2, K//2], applied
    separably (rows then columns) as one grouped conv over B·C channels with reflect padding.
    B×C×H×W -> B×C×H×W; kernel_size must be odd and smaller than 2·min(H, W).
    """
    check_batch(x)
    p = checks.fraction(p, "p", closed_right=True)
    checks.positive_int(kernel_size, "kernel_size", hint="pass a positive odd int")
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd int, got {kernel_size!r}")
    lo, hi = interval(sigma, "sigma", 0.0, math.inf)
    b, c, h, w = x.shape
    half = kernel_size // 2
    if half >= min(h, w):
        raise ValueError(f"kernel_size={kernel_size} is too large for {h}×{w} images; pass an odd "
                         f"kernel_size < {2 * min(h, w)}")
    apply = coin(b, p, generator, x.device)
    sig = uniform(b, lo, hi, generator, x.device)                          # B
    offsets = torch.arange(-half, half + 1, device=x.device, dtype=x.dtype)  # K
    kernel = torch.exp(-offsets[None] ** 2 / (2 * sig[:, None] ** 2))       # B×K
    kernel = kernel / kernel.sum(1, keepdim=True)
    kernel = kernel.repeat_interleave(c, 0)                                 # (B·C)×K, one per channel
    flat = x.reshape(1, b * c, h, w)                                        # channels = B·C groups
    flat = F.pad(flat, (half, half, 0, 0), mode="reflect")
    flat = F.conv2d(flat, kernel[:, None, None, :], groups=b * c)           # rows
    flat = F.pad(flat, (0, 0, half, half), mode="reflect")
    flat = F.conv2d(flat, kernel[:, None, :, None], groups=b * c)           # columns
    blurred = flat.reshape(b, c, h, w).clamp_(0.0, 1.0)
    return select(apply, blurred, x)
