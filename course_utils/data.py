"""Image datasets as plain tensors: one call, one `ImageDataset`, no DataLoader workers.

Every dataset comes back whole, as `images` (N×C×H×W float32 in [0, 1]) and `labels` (N int64)
on the device you ask for, so augmentations (course_utils.augment) run batched on that device.

Names (`available_datasets()`):

| name       | source                                   | C | native | splits (default sizes)          |
|------------|------------------------------------------|---|--------|---------------------------------|
| "shapes"   | procedural, generated here (the default) | 3 | 32     | train 10000, test 2000          |
| "digits"   | scikit-learn `load_digits` (shipped)     | 1 | 8      | train 1437, test 360            |
| "textures" | crops of scikit-image sample images      | 3 | 32     | train 2048, test 512            |
| "cifar10"  | torchvision, needs a download            | 3 | 32     | train 50000, test 10000         |
| "stl10"    | torchvision, needs a download            | 3 | 96     | train 5000, test 8000, unlabeled 100000 |

"shapes", "digits" and "textures" need nothing from the internet. "cifar10"/"stl10" live under
`data_root()` and are only fetched with `download=True`; without them a `DatasetUnavailableError`
says how to get them. Everything is deterministic: two loads give bitwise-equal tensors.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .batches import Batches
from .files import save_atomically

__all__ = [
    "ImageDataset", "DatasetUnavailableError", "load_dataset", "available_datasets",
    "dataset_splits", "load_photo", "available_photos", "data_root", "make_shapes",
    "SHAPE_CLASSES", "TEXTURE_CLASSES",
]

_SPLITS = {
    "shapes": ("train", "test"),
    "digits": ("train", "test"),
    "textures": ("train", "test"),
    "cifar10": ("train", "test"),
    "stl10": ("train", "test", "unlabeled"),
}


class DatasetUnavailableError(RuntimeError):
    """A dataset that must be downloaded is not on disk (or the download failed)."""


def available_datasets() -> list[str]:
    """Names accepted by `load_dataset`, the embedded default ("shapes") first."""
    return list(_SPLITS)


def dataset_splits(name: str) -> tuple[str, ...]:
    """Valid `split` values of dataset `name`."""
    _check_name(name)
    return _SPLITS[name]


def data_root() -> Path:
    """Folder for caches and downloads: $COURSE_DATA_DIR, else <repo>/data in a checkout,
    else ./data (e.g. /content/data on Colab, where the kit is pip-installed)."""
    if os.environ.get("COURSE_DATA_DIR"):
        return Path(os.environ["COURSE_DATA_DIR"])
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").exists():
        return repo / "data"
    return Path.cwd() / "data"


# ----------------------------------------------------------------------------------------------
# The container


@dataclass
class ImageDataset:
    """A labelled image set held as two tensors.

    images: N×C×H×W float32 in [0, 1]; labels: N int64 (-1 where a split has no labels,
    i.e. stl10 "unlabeled"); classes: class names, `classes[label]`.
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    name: str = "dataset"
    split: str = "train"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.images, torch.Tensor) or self.images.dim() != 4:
            raise ValueError(f"images must be an N×C×H×W tensor, got "
                             f"{getattr(self.images, 'shape', type(self.images))}")
        if not isinstance(self.labels, torch.Tensor) or self.labels.shape != self.images.shape[:1]:
            raise ValueError(f"labels must be a tensor of shape ({self.images.shape[0]},), got "
                             f"{getattr(self.labels, 'shape', type(self.labels))}")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __repr__(self) -> str:
        n, c, h, w = self.images.shape
        return (f"ImageDataset(name={self.name!r}, split={self.split!r}, n={n}, shape={c}×{h}×{w}, "
                f"classes={len(self.classes)}, device={self.device})")

    @property
    def device(self) -> torch.device:
        return self.images.device

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return tuple(self.images.shape[1:])

    def to(self, device) -> "ImageDataset":
        """The same data on `device` (a new dataset; this one is unchanged)."""
        device = _check_device(device)
        return ImageDataset(self.images.to(device), self.labels.to(device), list(self.classes),
                            self.name, self.split, dict(self.meta))

    def subset(self, n: int, *, seed: int | None = None) -> "ImageDataset":
        """The first `n` images, or with `seed` a seeded random choice of `n` (no repeats)."""
        n = _check_positive_int(n, "n")
        if n > len(self):
            raise ValueError(f"subset n={n} is larger than the dataset ({len(self)} images); "
                             f"pass n <= {len(self)}")
        if seed is None:
            idx = torch.arange(n)
        else:
            g = torch.Generator().manual_seed(int(seed))
            idx = torch.randperm(len(self), generator=g)[:n]
        idx = idx.to(self.device)
        return ImageDataset(self.images[idx], self.labels[idx], list(self.classes), self.name,
                            self.split, dict(self.meta))

    def batches(self, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                drop_last: bool = True, with_ids: bool = False) -> Batches:
        """The dataset's one batch source: ``epoch -> iterator of (images B×C×H×W, labels B)``
        (plus ids with ``with_ids``) on the dataset's device, each epoch's order seeded from
        ``seed`` so that a run resumes exactly (see ``course_utils.batches``). Iterating it
        directly gives epoch 0."""
        return Batches(self.images, self.labels, batch_size=batch_size, seed=seed, shuffle=shuffle,
                       drop_last=drop_last, with_ids=with_ids)


# ----------------------------------------------------------------------------------------------
# The one entry point


def load_dataset(name: str, split: str = "train", *, image_size: int | None = None,
                 device="cpu", download: bool = False, limit: int | None = None) -> ImageDataset:
    """Load dataset `name` (see `available_datasets()`) as an `ImageDataset`.

    split: one of `dataset_splits(name)`. image_size: resize to image_size×image_size with
    bilinear, antialiased interpolation (None keeps the native size). limit: keep the first
    `limit` images (a fixed, already shuffled order). download: only for cifar10/stl10.
    """
    _check_name(name)
    if not isinstance(split, str) or split not in _SPLITS[name]:
        raise ValueError(f"split={split!r} is not a split of {name!r}; pass one of {list(_SPLITS[name])}")
    if image_size is not None:
        image_size = _check_positive_int(image_size, "image_size")
    if limit is not None:
        limit = _check_positive_int(limit, "limit")
    if not isinstance(download, bool):
        raise TypeError(f"download must be True or False, got {download!r}")
    device = _check_device(device)

    if name == "shapes":
        images_u8, labels, classes = _load_shapes(split, limit)
    elif name == "digits":
        images_u8, labels, classes = _load_digits(split)
    elif name == "textures":
        images_u8, labels, classes = _load_textures(split)
    else:
        images_u8, labels, classes = _load_torchvision(name, split, download, limit)

    if limit is not None:
        if limit > images_u8.shape[0]:
            raise ValueError(f"limit={limit} is more than the {images_u8.shape[0]} images of "
                             f"{name!r}/{split}; pass limit <= {images_u8.shape[0]} or None")
        images_u8, labels = images_u8[:limit], labels[:limit]
    images = _to_float_resized(images_u8, image_size)
    return ImageDataset(images.to(device), labels.to(device), classes, name, split)


def _to_float_resized(images_u8: torch.Tensor, image_size: int | None,
                      chunk: int = 2048) -> torch.Tensor:
    """uint8 N×C×H×W -> float32 in [0, 1], resized in chunks (keeps peak memory small)."""
    n, c, h, w = images_u8.shape
    size = (h, w) if image_size is None else (image_size, image_size)
    out = torch.empty(n, c, *size, dtype=torch.float32)
    for i in range(0, n, chunk):
        x = images_u8[i:i + chunk].float().div_(255.0)
        if size != (h, w):
            x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
            x = x.clamp_(0.0, 1.0)  # bilinear+antialias can overshoot by rounding
        out[i:i + chunk] = x
    return out


# ----------------------------------------------------------------------------------------------
# "shapes": the embedded default


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
    n = _check_positive_int(n, "n")
    size = _check_positive_int(size, "size")
    images, labels = [], []
    for i, start in enumerate(range(0, n, _SHAPES_CHUNK)):
        m = min(_SHAPES_CHUNK, n - start)
        # always render a whole chunk, so image j is the same whatever n is
        x, y = _render_shapes_chunk(seed * 1_000_003 + i, _SHAPES_CHUNK, size)
        images.append(x[:m])
        labels.append(y[:m])
    return torch.cat(images), torch.cat(labels)


def _cache_path(key: str) -> Path:
    return data_root() / f"{key}.pt"


def _read_cache(path: Path, n: int | None = None):
    """Cached (images uint8 N×C×H×W, labels N, classes), or None if missing, unreadable,
    malformed or of another size: a bad cache is regenerated, never trusted."""
    if not path.exists():
        return None
    try:
        blob = torch.load(path, weights_only=True)
        images, labels, classes = blob["images"], blob["labels"], list(blob["classes"])
        ok = (images.dtype == torch.uint8 and images.dim() == 4
              and labels.dtype == torch.int64 and tuple(labels.shape) == images.shape[:1]
              and (n is None or images.shape[0] == n) and all(isinstance(c, str) for c in classes))
    except Exception:  # truncated, not a torch file, wrong keys: regenerate
        ok = False
    if not ok:
        warnings.warn(f"ignoring a corrupt or outdated cache {path}; regenerating it")
        return None
    return images, labels, classes


def _cached(key: str, build, n: int | None = None):
    """(images, labels, classes) from data_root()/key.pt, built by `build()` and saved if absent."""
    path = _cache_path(key)
    hit = _read_cache(path, n)
    if hit is not None:
        return hit
    images, labels, classes = build()
    try:
        save_atomically({"images": images, "labels": labels, "classes": list(classes)}, path)
    except OSError as err:  # a read-only install still works, just without the cache
        warnings.warn(f"could not write the cache {path}: {err}")
    return images, labels, classes


def _load_shapes(split: str, limit: int | None):
    n, seed = _SHAPES_COUNTS[split], _SHAPES_SEEDS[split]
    key = f"shapes-v{_SHAPES_VERSION}-{split}-{n}"
    if limit is not None and limit < n and not _cache_path(key).exists():
        # a small request: render only the chunks it needs and leave the cache for a full load
        images, labels = make_shapes(limit, seed=seed)
        return images, labels, list(SHAPE_CLASSES)
    return _cached(key, lambda: (*make_shapes(n, seed=seed), list(SHAPE_CLASSES)), n)


# ----------------------------------------------------------------------------------------------
# "digits": scikit-learn's 8×8 handwritten digits


def _load_digits(split: str):
    return _cached(f"digits-v1-{split}", lambda: _build_digits(split))


def _build_digits(split: str):
    """sklearn digits (1797 images, 8×8, values 0..16) as uint8 N×1×8×8 scaled to 0..255.

    Fixed split: a seeded permutation, first 1437 train, last 360 test.
    """
    from sklearn.datasets import load_digits
    bunch = load_digits()
    x = torch.as_tensor(bunch.images, dtype=torch.float32)            # 1797×8×8 in 0..16
    x = (x / 16.0 * 255.0).round().to(torch.uint8)[:, None]           # N×1×8×8
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_train = 1437
    idx = order[:n_train] if split == "train" else order[n_train:]
    return x[idx], y[idx], [str(d) for d in range(10)]


# ----------------------------------------------------------------------------------------------
# "textures" and photos: scikit-image's shipped sample images (no pooch download)

# Every name here is a file inside the scikit-image wheel (skimage/data/*.png|jpg).
_PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field",
           "retina", "camera", "brick", "grass", "gravel", "moon", "coins"]
TEXTURE_CLASSES = ["brick", "grass", "gravel", "moon", "coffee", "chelsea", "astronaut",
                   "immunohistochemistry"]
_TEXTURE_PER_CLASS = {"train": 256, "test": 64}
_TEXTURE_SEEDS = {"train": 0, "test": 1}
_TEXTURE_SIZE = 32


def available_photos() -> list[str]:
    """Names accepted by `load_photo` (scikit-image sample images shipped with the package)."""
    return list(_PHOTOS)


def _photo_u8(name: str) -> torch.Tensor:
    """The sample image as uint8 3×H×W (grayscale repeated to three channels)."""
    import numpy as np
    import skimage.data
    arr = np.asarray(getattr(skimage.data, name)())
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    x = torch.from_numpy(np.ascontiguousarray(arr))
    if x.dim() == 2:
        x = x[None].expand(3, -1, -1)
    else:
        x = x[..., :3].permute(2, 0, 1)                               # H×W×3 -> 3×H×W
    return x.contiguous()


def load_photo(name: str, size: int = 64) -> torch.Tensor:
    """One sample photo as a 3×size×size float32 tensor in [0, 1] (centre square crop, resized)."""
    if name not in _PHOTOS:
        raise ValueError(f"unknown photo {name!r}; pass one of {available_photos()}")
    size = _check_positive_int(size, "size")
    x = _photo_u8(name)
    _, h, w = x.shape
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    x = x[:, top:top + side, left:left + side][None]                  # 1×3×side×side
    return _to_float_resized(x, size)[0]


def _load_textures(split: str):
    return _cached(f"textures-v1-{split}", lambda: _build_textures(split))


def _build_textures(split: str):
    """Random square crops (side 20-40% of the short edge) of eight sample images, resized to 32.

    Train crops come from the left 75% of each image, test crops from the right 25%, so no
    test pixel was seen in training. Label = source image.
    """
    g = torch.Generator().manual_seed(_TEXTURE_SEEDS[split])
    per_class = _TEXTURE_PER_CLASS[split]
    images, labels = [], []
    for label, name in enumerate(TEXTURE_CLASSES):
        photo = _photo_u8(name).float()[None] / 255.0                 # 1×3×H×W
        _, _, h, w = photo.shape
        x0, x1 = (0, int(0.75 * w)) if split == "train" else (int(0.75 * w), w)
        side_max = min(h, x1 - x0, int(0.4 * min(h, w)))
        side_min = max(8, min(side_max, int(0.2 * min(h, w))))
        sides = torch.randint(side_min, side_max + 1, (per_class,), generator=g)
        for side in sides.tolist():
            top = int(torch.randint(0, h - side + 1, (1,), generator=g))
            left = x0 + int(torch.randint(0, x1 - x0 - side + 1, (1,), generator=g))
            crop = photo[:, :, top:top + side, left:left + side]
            crop = F.interpolate(crop, size=(_TEXTURE_SIZE, _TEXTURE_SIZE), mode="bilinear",
                                 antialias=True, align_corners=False)
            images.append(crop)
        labels.append(torch.full((per_class,), label, dtype=torch.int64))
    x = (torch.cat(images).clamp(0, 1) * 255).round().to(torch.uint8)
    y = torch.cat(labels)
    order = torch.randperm(len(y), generator=g)                       # mix classes for limit=
    return x[order], y[order], list(TEXTURE_CLASSES)


# ----------------------------------------------------------------------------------------------
# "cifar10" / "stl10": torchvision, downloaded only when asked


def _unavailable(name: str, root: Path, reason: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"{name!r} is not available under {root} ({reason}). Get it once with "
        f"load_dataset({name!r}, download=True) on a machine with internet (e.g. Colab), or "
        f"copy it into {root}; offline, use the embedded dataset load_dataset('shapes').")


def _load_torchvision(name: str, split: str, download: bool, limit: int | None):
    """cifar10 / stl10 as uint8 N×3×H×W. Only the first `limit` images are kept (saves memory:
    stl10 "unlabeled" is 100000×3×96×96, 2.8 GB as uint8 and 11 GB as float32)."""
    root = data_root()
    folder = {"cifar10": "cifar-10-batches-py", "stl10": "stl10_binary"}[name]
    if not download and not (root / folder).is_dir():
        raise _unavailable(name, root, f"no folder {folder}/")
    import numpy as np
    from torchvision import datasets
    try:
        if name == "cifar10":
            ds = datasets.CIFAR10(root=str(root), train=(split == "train"), download=download)
            x = ds.data[:limit]                                       # N×32×32×3 uint8
            x = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2)
            y = torch.as_tensor(ds.targets[:limit], dtype=torch.int64)
        else:
            ds = datasets.STL10(root=str(root), split=split, download=download)
            x = torch.from_numpy(np.ascontiguousarray(ds.data[:limit]))  # N×3×96×96 uint8
            y = torch.as_tensor(ds.labels[:limit], dtype=torch.int64)   # -1 for "unlabeled"
        classes = list(ds.classes)
    except DatasetUnavailableError:
        raise
    except RuntimeError as err:               # torchvision: "Dataset not found or corrupted"
        raise _unavailable(name, root, "not found" if not download else f"download failed: {err}") from err
    except (OSError, ValueError) as err:      # offline download: URLError is an OSError
        raise _unavailable(name, root, f"{type(err).__name__}: {err}") from err
    return x.contiguous(), y, classes


# ----------------------------------------------------------------------------------------------
# Validation helpers


def _check_name(name) -> None:
    if not isinstance(name, str) or name not in _SPLITS:
        raise ValueError(f"unknown dataset {name!r}; pass one of {available_datasets()}")


def _check_positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{what} must be a positive int, got {value}")
    return value


def _check_device(device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a device; pass 'cpu', 'cuda' or a torch.device") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but CUDA is not available here; pass device='cpu'")
    return device
