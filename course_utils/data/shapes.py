"""\"shapes\": the embedded default, rendered procedurally here (8 classes of shape; colour, position,
size, rotation and texture are nuisances). Deterministic per seed and chunk; cached on disk."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import checks
from .storage import cache_path, cached



SHAPE_CLASSES = ["disk", "ring", "square", "triangle", "plus", "bar", "star", "crescent"]
_SHAPES_VERSION = 2                       # bump whenever the generator changes (invalidates caches)
# v2 (issue 3): weaker stripes (amplitude <= 0.15, was 0.6), less noise (std <= 0.03, was 0.06) and
# bigger shapes (radius >= 0.55, was 0.42). At 16 px the v1 nuisances (stripes with their own
# edges, tiny shapes) drowned the shape: a few CPU minutes of SimCLR gained only ~3 probe points.
_STRIPE_AMP_MAX = 0.15
_NOISE_STD_MAX = 0.03
_SCALE_RANGE = (0.55, 0.72)
_SHAPES_COUNTS = {"train": 10000, "test": 2000}
_SHAPES_SEEDS = {"train": 0, "test": 1}
_SHAPES_CHUNK = 1000                      # images per seeded chunk; a multiple of 8 classes
_SHAPES_SIZE = 32                         # native resolution (rendered at 2x, then average-pooled)


def _shape_masks(label: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Inside-mask of shape `label` in its own frame (u, v ~ [-1, 1] = the shape's radius)."""
    r2 = u * u + v * v
    name = SHAPE_CLASSES[label]
    if name == "disk":
        return r2 < 0.85 ** 2
    if name == "ring":
        return (r2 < 0.92 ** 2) & (r2 > 0.52 ** 2)
    if name == "square":
        return torch.maximum(u.abs(), v.abs()) < 0.68
    if name == "triangle":                # equilateral, circumradius 1: three half-planes
        inside = torch.ones_like(u, dtype=torch.bool)
        for k in range(3):
            a = -math.pi / 2 + 2 * math.pi * k / 3
            inside &= u * math.cos(a) + v * math.sin(a) < 0.5
        return inside
    if name == "plus":
        au, av = u.abs(), v.abs()
        return ((au < 0.27) & (av < 0.92)) | ((av < 0.27) & (au < 0.92))
    if name == "bar":
        return (u.abs() < 0.95) & (v.abs() < 0.26)
    if name == "star":                    # five lobes: radius between 0.25 and 0.95
        return r2.sqrt() < 0.6 + 0.35 * torch.cos(5 * torch.atan2(v, u))
    if name == "crescent":
        return (r2 < 0.9 ** 2) & ((u - 0.45) ** 2 + v * v > 0.7 ** 2)
    raise AssertionError(name)


def _uniform(g: torch.Generator, n: int, lo: float, hi: float, *rest: int) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, *rest, generator=g)


def _distinct_colours(g: torch.Generator, n: int, min_dist: float = 0.45) -> tuple[torch.Tensor, torch.Tensor]:
    """Random foreground/background RGB pairs (n×3 each) at least `min_dist` apart (RGB L2).

    Colours are independent of the class: a colour histogram says nothing about the label,
    but it does identify an image, which is what makes colour a shortcut for SimCLR.
    """
    bg = torch.rand(n, 3, generator=g)
    candidates = torch.rand(n, 16, 3, generator=g)                   # n×16×3
    ok = (candidates - bg[:, None]).norm(dim=-1) > min_dist           # n×16
    first_ok = torch.where(ok.any(1), ok.float().argmax(1), torch.zeros(n, dtype=torch.long))
    fg = candidates[torch.arange(n), first_ok]
    fallback = ~ok.any(1)                                             # rare: take the far corner
    fg[fallback] = (bg[fallback] < 0.5).float()
    return fg, bg


def _stripes(g: torch.Generator, n: int, xx: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
    """Multiplicative stripe texture n×H×W in [1 - amp, 1]: random frequency, angle, phase, amp."""
    freq = _uniform(g, n, 1.0, 4.0)[:, None, None]                    # cycles per image side
    angle = _uniform(g, n, 0.0, math.pi)[:, None, None]
    phase = _uniform(g, n, 0.0, 2 * math.pi)[:, None, None]
    amp = _uniform(g, n, 0.0, _STRIPE_AMP_MAX)[:, None, None]
    t = xx * torch.cos(angle) + yy * torch.sin(angle)                  # n×H×W, in image units
    return 1 - amp * 0.5 * (1 + torch.sin(math.pi * freq * t + phase))


def _render_shapes_chunk(seed: int, n: int, size: int = _SHAPES_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """n images (uint8 n×3×size×size) and labels (n,), all drawn from one seeded generator.

    Each image: a shape of a random class at random position, scale and rotation, filled with a
    random striped foreground colour on a random striped background colour, plus pixel noise.
    The shape's edge is rendered at 2·size and average-pooled 2×2 (antialiasing).
    """
    g = torch.Generator().manual_seed(seed)
    k = len(SHAPE_CLASSES)
    labels = torch.arange(n) % k
    labels = labels[torch.randperm(n, generator=g)]                   # balanced, shuffled
    s = 2 * size                                                      # supersampled side S
    coords = (torch.arange(s, dtype=torch.float32) + 0.5) / s * 2 - 1  # pixel centres in [-1, 1]
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")            # S×S each

    scale = _uniform(g, n, *_SCALE_RANGE)                             # shape radius / half-image
    reach = 1 - 0.9 * scale                                           # keep the shape in frame
    cx = (2 * torch.rand(n, generator=g) - 1) * reach
    cy = (2 * torch.rand(n, generator=g) - 1) * reach
    rot = _uniform(g, n, 0.0, 2 * math.pi)

    # coverage: the inside-mask at 2·size, average-pooled 2×2 -> fraction of each pixel covered
    mask = torch.zeros(n, s, s)
    for label in range(k):
        idx = (labels == label).nonzero().squeeze(1)
        c = torch.cos(rot[idx])[:, None, None]
        si = torch.sin(rot[idx])[:, None, None]
        sc = scale[idx][:, None, None]
        dx = xx[None] - cx[idx][:, None, None]                        # m×S×S
        dy = yy[None] - cy[idx][:, None, None]
        u = (c * dx + si * dy) / sc                                   # rotate by -rot, unscale
        v = (-si * dx + c * dy) / sc
        mask[idx] = _shape_masks(label, u, v).float()
    alpha = F.avg_pool2d(mask[:, None], 2)                            # n×1×size×size in [0, 1]

    # textures are smooth, so they are drawn at the final size and blended by coverage
    fine = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    fy, fx = torch.meshgrid(fine, fine, indexing="ij")
    fg, bg = _distinct_colours(g, n)
    fg_tex = _stripes(g, n, fx, fy)[:, None]                          # n×1×size×size
    bg_tex = _stripes(g, n, fx, fy)[:, None]
    img = alpha * fg[:, :, None, None] * fg_tex + (1 - alpha) * bg[:, :, None, None] * bg_tex
    noise_std = _uniform(g, n, 0.0, _NOISE_STD_MAX)[:, None, None, None]
    img = img + noise_std * torch.randn(img.shape, generator=g)       # n×3×size×size
    img_u8 = (img.clamp(0, 1) * 255).round().to(torch.uint8)
    return img_u8, labels


def make_shapes(n: int, *, seed: int = 0, size: int = _SHAPES_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate `n` shapes images (uint8 n×3×size×size) and labels, in seeded chunks of 1000.

    Chunk i uses seed `seed * 1_000_003 + i`, so the first m images do not depend on n.
    """
    n = checks.positive_int(n, "n")
    size = checks.positive_int(size, "size")
    images, labels = [], []
    for i, start in enumerate(range(0, n, _SHAPES_CHUNK)):
        m = min(_SHAPES_CHUNK, n - start)
        # always render a whole chunk, so image j is the same whatever n is
        x, y = _render_shapes_chunk(seed * 1_000_003 + i, _SHAPES_CHUNK, size)
        images.append(x[:m])
        labels.append(y[:m])
    return torch.cat(images), torch.cat(labels)


def load_shapes(split: str, limit: int | None):
    n, seed = _SHAPES_COUNTS[split], _SHAPES_SEEDS[split]
    key = f"shapes-v{_SHAPES_VERSION}-{split}-{n}"
    if limit is not None and limit < n and not cache_path(key).exists():
        # a small request: render only the chunks it needs and leave the cache for a full load
        images, labels = make_shapes(limit, seed=seed)
        return images, labels, list(SHAPE_CLASSES)
    return cached(key, lambda: (*make_shapes(n, seed=seed), list(SHAPE_CLASSES)), n)
