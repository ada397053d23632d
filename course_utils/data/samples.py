"""Datasets built from files that packages ship: scikit-learn's 8×8 digits, and textures cropped
from scikit-image's sample photos (which `load_photo` also returns whole)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import checks
from ..augment.photometric import adjust_brightness, adjust_contrast, hsv_to_rgb
from .dataset import to_float_resized
from .storage import cached



def load_digits(split: str):
    return cached(f"digits-v1-{split}", lambda: _build_digits(split))


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
    size = checks.positive_int(size, "size")
    x = _photo_u8(name)
    _, h, w = x.shape
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    x = x[:, top:top + side, left:left + side][None]                  # 1×3×side×side
    return to_float_resized(x, size)[0]


_RECOLOUR_SEEDS = {"train": 10, "test": 11}


def load_textures(split: str, recoloured: bool = False):
    if recoloured:
        return cached(f"textures-recoloured-v2-{split}", lambda: _recolour(*load_textures(split), split))
    return cached(f"textures-v1-{split}", lambda: _build_textures(split))


def _recolour(images_u8: torch.Tensor, labels: torch.Tensor, classes: list[str], split: str):
    """The same crops with their colour replaced: each crop's luma (ITU-R 601) tinted with a colour
    of its own (hue U(0, 1) of a turn, saturation U(0.2, 1)), then brightness and contrast each
    scaled by U(0.6, 1.4).

    Why: a randomly initialised CNN already tells the eight photos apart by their colours and
    tones (a linear probe on its features scores 70% on "textures"), which leaves a learned
    encoder little to add. With colour drawn per crop, the class is in the texture only: the
    random-init floor drops and self-supervised training has room to show what it learns.
    Tinting the luma rather than turning each crop's hue (v1) matters: four of the eight photos
    are grey, a hue turn leaves a grey crop grey, and "grey or not" told the random-init network
    half the answer (its floor: v1 about 51%, this v2 about 31%, seeds 0-2 at 16 px)."""
    from torchvision.transforms.v2.functional import rgb_to_grayscale
    g = torch.Generator().manual_seed(_RECOLOUR_SEEDS[split])
    n = images_u8.shape[0]
    luma = rgb_to_grayscale(images_u8.float() / 255.0)                 # N×1×H×W
    hsv = torch.stack([torch.rand(n, generator=g), 0.2 + 0.8 * torch.rand(n, generator=g),
                       torch.ones(n)], 1)[:, :, None, None]            # N×3×1×1
    x = luma * hsv_to_rgb(hsv)
    x = adjust_brightness(x, 0.6 + 0.8 * torch.rand(n, generator=g))
    x = adjust_contrast(x, 0.6 + 0.8 * torch.rand(n, generator=g))
    return (x.clamp(0, 1) * 255).round().to(torch.uint8), labels, classes


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
