"""Batched image augmentations that run where the batch lives (CPU or GPU).

Every function takes a batch x of shape B×C×H×W, float in [0, 1], and returns a new batch in
[0, 1] on the same device. Each sample gets its own random parameters, drawn from `generator`:
a `torch.Generator` on any device (a CPU generator is fine for a CUDA batch: parameters are drawn
on the generator's device and then moved), or torch's global RNG when `generator` is None.
The same generator state gives the same output, bit for bit on one device.

Why on-device and batched: SimCLR-style training makes two views of every image every step; with
per-image CPU transforms a Colab GPU waits on two CPU workers. Here one view of a 512-image batch
is a handful of batched tensor ops.

Colour operations need RGB (C = 3). On one-channel input `random_grayscale` is a no-op (it is
already gray), `color_jitter` applies brightness and contrast and raises if asked for saturation
or hue, and `SimCLRAugment` drops the colour-only parts by itself.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["random_resized_crop", "horizontal_flip", "random_rot90", "color_jitter", "random_grayscale",
           "gaussian_blur", "SimCLRAugment", "adjust_brightness", "adjust_contrast",
           "adjust_saturation", "adjust_hue", "rgb_to_hsv", "hsv_to_rgb"]

# ITU-R 601 luma weights as torchvision's rgb_to_grayscale writes them (0.2989, not 0.299)
_LUMA = (0.2989, 0.587, 0.114)


# ----------------------------------------------------------------------------------------------
# Random numbers: drawn on the generator's device, used on the batch's device


def _uniform(n: int, lo: float, hi: float, generator, device) -> torch.Tensor:
    """n samples of U(lo, hi) on `device`, drawn from `generator` on its own device."""
    draw_device = generator.device if generator is not None else device
    u = torch.rand(n, generator=generator, device=draw_device)
    return (lo + (hi - lo) * u).to(device)


def _coin(n: int, p: float, generator, device) -> torch.Tensor:
    """n booleans, each True with probability p (always drawn, so p does not shift the stream)."""
    return _uniform(n, 0.0, 1.0, generator, device) < p


def _select(mask: torch.Tensor, changed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-sample choice: changed[b] where mask[b], else x[b]. mask: B bool."""
    return torch.where(mask[:, None, None, None], changed, x)


# ----------------------------------------------------------------------------------------------
# Geometry


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
    _check_batch(x)
    out_h, out_w = _check_size(size)
    lo, hi = _check_range(scale, "scale", 0.0, 1.0, allow_low_equal=False)
    rlo, rhi = _check_range(ratio, "ratio", 0.0, math.inf, allow_low_equal=False)
    b, c, h, w = x.shape
    area = _uniform(b, lo, hi, generator, x.device)                          # B
    log_r = _uniform(b, math.log(rlo), math.log(rhi), generator, x.device)  # B
    aspect = torch.exp(log_r)
    # box side as a fraction of the image side; aspect is in pixels (w_px / h_px)
    frac_w = torch.sqrt(area * aspect * h / w).clamp(max=1.0)               # B
    frac_h = torch.sqrt(area / aspect * w / h).clamp(max=1.0)
    cx = (2 * _uniform(b, 0.0, 1.0, generator, x.device) - 1) * (1 - frac_w)  # box centre in [-1, 1]
    cy = (2 * _uniform(b, 0.0, 1.0, generator, x.device) - 1) * (1 - frac_h)
    theta = torch.zeros(b, 2, 3, device=x.device, dtype=x.dtype)           # B×2×3 affine maps
    theta[:, 0, 0], theta[:, 0, 2] = frac_w, cx
    theta[:, 1, 1], theta[:, 1, 2] = frac_h, cy
    grid = F.affine_grid(theta, [b, c, out_h, out_w], align_corners=False)  # B×h×w×2
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.clamp_(0.0, 1.0)


def horizontal_flip(x: torch.Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each image left-right with probability p. B×C×H×W -> B×C×H×W."""
    _check_batch(x)
    p = _check_prob(p)
    flip = _coin(x.shape[0], p, generator, x.device)                         # B
    return _select(flip, x.flip(-1), x)


def random_rot90(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Rotate each square image by k·90°, k ~ U{0, 1, 2, 3} per sample. B×C×S×S -> B×C×S×S.

    Exact (a permutation of pixels, no interpolation). Use it when orientation is a nuisance of
    the data, as in "shapes" (every shape is drawn at a random rotation): the two views then
    disagree on orientation and the encoder cannot match them by it.
    """
    _check_batch(x)
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"random_rot90 needs square images, got {x.shape[-2]}×{x.shape[-1]}; "
                         "crop to a square first (random_resized_crop(x, size=S))")
    k = torch.floor(_uniform(x.shape[0], 0.0, 4.0, generator, x.device)).clamp_(max=3)  # B
    out = x
    for turns in (1, 2, 3):
        out = _select(k == turns, torch.rot90(x, turns, dims=(2, 3)), out)
    return out


# ----------------------------------------------------------------------------------------------
# Colour


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
    _check_batch(x)
    f = _per_sample(factor, x, "factor")
    return (x * f[:, None, None, None]).clamp(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, factor) -> torch.Tensor:
    """x <- clip(f·x + (1-f)·m), m = mean luma of the image, f per sample. B×C×H×W -> same."""
    _check_batch(x)
    _check_rgb_or_gray(x, "adjust_contrast")
    f = _per_sample(factor, x, "factor")
    gray = x if x.shape[1] == 1 else _gray(x)
    mean = gray.mean(dim=(1, 2, 3), keepdim=True)                            # B×1×1×1
    return _blend(x, mean, f)


def adjust_saturation(x: torch.Tensor, factor) -> torch.Tensor:
    """x <- clip(f·x + (1-f)·gray(x)) per pixel, f per sample. RGB only: B×3×H×W -> B×3×H×W."""
    _check_batch(x)
    if x.shape[1] != 3:
        raise ValueError(f"adjust_saturation needs RGB (3 channels), got {x.shape[1]}")
    return _blend(x, _gray(x), _per_sample(factor, x, "factor"))


def adjust_hue(x: torch.Tensor, shift) -> torch.Tensor:
    """Rotate hue by `shift` turns (number or B, in [-0.5, 0.5]) in HSV. RGB only, B×3×H×W."""
    _check_batch(x)
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
    _check_batch(x)
    p = _check_prob(p)
    for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{name} must be a number >= 0 (0 = off), got {value!r}")
    if not isinstance(hue, (int, float)) or not 0 <= hue <= 0.5:
        raise ValueError(f"hue must be in [0, 0.5] (fraction of a turn), got {hue!r}")
    c = x.shape[1]
    if c == 1 and (saturation > 0 or hue > 0):
        raise ValueError("saturation and hue need RGB input, but x has 1 channel; pass "
                         "saturation=0, hue=0 for grayscale images (or repeat x to 3 channels)")
    _check_rgb_or_gray(x, "color_jitter")
    b, dev = x.shape[0], x.device
    apply = _coin(b, p, generator, dev)
    # draw every factor even when it is off, so changing one strength leaves the others' stream
    fb = _uniform(b, max(0.0, 1 - brightness), 1 + brightness, generator, dev)
    fc = _uniform(b, max(0.0, 1 - contrast), 1 + contrast, generator, dev)
    fs = _uniform(b, max(0.0, 1 - saturation), 1 + saturation, generator, dev)
    dh = _uniform(b, -hue, hue, generator, dev)
    y = x
    if brightness > 0:
        y = adjust_brightness(y, fb)
    if contrast > 0:
        y = adjust_contrast(y, fc)
    if saturation > 0:
        y = adjust_saturation(y, fs)
    if hue > 0:
        y = adjust_hue(y, dh)
    return _select(apply, y, x)


def random_grayscale(x: torch.Tensor, p: float = 0.2, generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per sample replace RGB by its luma on all three channels.
    B×3×H×W -> B×3×H×W. One-channel input is already gray: returned unchanged (a documented no-op)."""
    _check_batch(x)
    p = _check_prob(p)
    _check_rgb_or_gray(x, "random_grayscale")
    apply = _coin(x.shape[0], p, generator, x.device)
    if x.shape[1] == 1:
        return x.clone()
    return _select(apply, _gray(x).expand_as(x), x)


def gaussian_blur(x: torch.Tensor, kernel_size: int, sigma=(0.1, 2.0), p: float = 0.5,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """With probability p per sample blur with a Gaussian of sigma ~ U(sigma) pixels.

    Kernel k_b(i) = exp(-i² / 2σ_b²) / Σ_j exp(-j² / 2σ_b²), i in [-K//2, K//2], applied
    separably (rows then columns) as one grouped conv over B·C channels with reflect padding.
    B×C×H×W -> B×C×H×W; kernel_size must be odd and smaller than 2·min(H, W).
    """
    _check_batch(x)
    p = _check_prob(p)
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size <= 0 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd int, got {kernel_size!r}")
    lo, hi = _check_range(sigma, "sigma", 0.0, math.inf, allow_low_equal=False)
    b, c, h, w = x.shape
    half = kernel_size // 2
    if half >= min(h, w):
        raise ValueError(f"kernel_size={kernel_size} is too large for {h}×{w} images; pass an odd "
                         f"kernel_size < {2 * min(h, w)}")
    apply = _coin(b, p, generator, x.device)
    sig = _uniform(b, lo, hi, generator, x.device)                          # B
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
    return _select(apply, blurred, x)


# ----------------------------------------------------------------------------------------------
# The SimCLR recipe


class SimCLRAugment:
    """One random view per call, the SimCLR recipe (Chen et al. 2020, appendix A) on a batch:

        random_resized_crop(scale=crop_scale) -> horizontal_flip(0.5) [-> random_rot90]
        -> color_jitter(0.8s, 0.8s, 0.8s, 0.2s, p=0.8) -> random_grayscale(0.2)
        -> gaussian_blur(kernel ≈ 10% of the image, sigma 0.1-2.0, p=0.5)

    with s = color_strength (0.5 gives torchvision's usual 0.4/0.4/0.4/0.1).
    color=False drops the jitter and, unless grayscale=True is passed, the grayscale step too:
    that is the "colour shortcut" ablation. blur is off by default (small images).
    rotate=True adds a random multiple of 90° after the flip (off by default: not in the paper;
    the lessons turn it on for "shapes", whose shapes are drawn at random rotations).
    On one-channel input only brightness and contrast are jittered and grayscale is skipped.
    x: B×C×H×W in [0, 1] -> B×C×image_size×image_size in [0, 1].
    """

    def __init__(self, image_size: int, *, crop_scale=(0.2, 1.0), color: bool = True,
                 color_strength: float = 0.5, blur: bool = False, grayscale: bool | None = None,
                 flip: bool = True, rotate: bool = False):
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
            raise ValueError(f"image_size must be a positive int (output side in pixels), got {image_size!r}")
        self.image_size = image_size
        self.crop_scale = _check_range(crop_scale, "crop_scale", 0.0, 1.0, allow_low_equal=False)
        if not isinstance(color_strength, (int, float)) or not 0 <= color_strength <= 2.5:
            raise ValueError(f"color_strength must be in [0, 2.5] (0.5 = SimCLR's CIFAR setting), "
                             f"got {color_strength!r}")
        self.color = bool(color)
        self.color_strength = float(color_strength)
        self.blur = bool(blur)
        self.grayscale = self.color if grayscale is None else bool(grayscale)
        self.flip = bool(flip)
        self.rotate = bool(rotate)
        self.blur_kernel = max(3, int(0.1 * self.image_size) // 2 * 2 + 1)    # odd, ≈10% of side

    def __repr__(self) -> str:
        return (f"SimCLRAugment(image_size={self.image_size}, crop_scale={self.crop_scale}, "
                f"color={self.color}, color_strength={self.color_strength}, blur={self.blur}, "
                f"grayscale={self.grayscale}, flip={self.flip}, rotate={self.rotate})")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        _check_batch(x)
        _check_rgb_or_gray(x, "SimCLRAugment")
        rgb = x.shape[1] == 3
        s = self.color_strength
        y = random_resized_crop(x, self.image_size, scale=self.crop_scale, generator=generator)
        if self.flip:
            y = horizontal_flip(y, 0.5, generator=generator)
        if self.rotate:
            y = random_rot90(y, generator=generator)
        if self.color:
            y = color_jitter(y, 0.8 * s, 0.8 * s, 0.8 * s if rgb else 0.0,
                             min(0.5, 0.2 * s) if rgb else 0.0, p=0.8, generator=generator)
        if self.grayscale and rgb:
            y = random_grayscale(y, 0.2, generator=generator)
        if self.blur:
            y = gaussian_blur(y, self.blur_kernel, (0.1, 2.0), p=0.5, generator=generator)
        return y

    def two_views(self, x: torch.Tensor, generator: torch.Generator | None = None):
        """Two independent views of the same batch: (view1, view2), each B×C×S×S."""
        return self(x, generator), self(x, generator)


# ----------------------------------------------------------------------------------------------
# Validation


def _check_batch(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor B×C×H×W, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"x must be a batch B×C×H×W (4 dims), got shape {tuple(x.shape)}; "
                         f"for one image pass x[None]")
    if not x.is_floating_point():
        raise TypeError(f"x must be a float tensor in [0, 1], got {x.dtype}; pass x.float() / 255")


def _check_rgb_or_gray(x: torch.Tensor, what: str) -> None:
    if x.shape[1] not in (1, 3):
        raise ValueError(f"{what} needs 1 (gray) or 3 (RGB) channels, got {x.shape[1]}")


def _check_prob(p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    return float(p)


def _check_size(size) -> tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if (not isinstance(size, Sequence) or len(size) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
        raise ValueError(f"size must be a positive int or a pair (h, w) of them, got {size!r}")
    return int(size[0]), int(size[1])


def _check_range(pair, what: str, low: float, high: float, *, allow_low_equal: bool) -> tuple[float, float]:
    ok = (isinstance(pair, Sequence) and len(pair) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair))
    if ok:
        lo, hi = float(pair[0]), float(pair[1])
        ok = (lo >= low if allow_low_equal else lo > low) and lo <= hi <= high
    if not ok:
        bound = "[" if allow_low_equal else "("
        raise ValueError(f"{what} must be a pair (lo, hi) with lo <= hi inside {bound}{low}, {high}], "
                         f"got {pair!r}")
    return lo, hi
