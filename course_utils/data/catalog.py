"""The dataset catalogue: names, splits and ``load_dataset`` (re-exported by ``course_utils.data``,
whose docstring has the table of datasets).
"""
from __future__ import annotations

from .. import checks
from .dataset import ImageDataset, to_float_resized
from .downloads import load_torchvision
from .samples import load_digits, load_textures
from .shapes import load_shapes

_SPLITS = {
    "shapes": ("train", "test"),
    "digits": ("train", "test"),
    "textures": ("train", "test"),
    "textures-recoloured": ("train", "test"),
    "cifar10": ("train", "test"),
    "stl10": ("train", "test", "unlabeled"),
}


def available_datasets() -> list[str]:
    """Names accepted by `load_dataset`, the embedded default ("shapes") first."""
    return list(_SPLITS)


def dataset_splits(name: str) -> tuple[str, ...]:
    """Valid `split` values of dataset `name`."""
    _check_name(name)
    return _SPLITS[name]


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
        image_size = checks.positive_int(image_size, "image_size")
    if limit is not None:
        limit = checks.positive_int(limit, "limit")
    if not isinstance(download, bool):
        raise TypeError(f"download must be True or False, got {download!r}")
    device = checks.device(device)

    if name == "shapes":
        images_u8, labels, classes = load_shapes(split, limit)
    elif name == "digits":
        images_u8, labels, classes = load_digits(split)
    elif name in ("textures", "textures-recoloured"):
        images_u8, labels, classes = load_textures(split, recoloured=name == "textures-recoloured")
    else:
        images_u8, labels, classes = load_torchvision(name, split, download, limit)

    if limit is not None:
        if limit > images_u8.shape[0]:
            raise ValueError(f"limit={limit} is more than the {images_u8.shape[0]} images of "
                             f"{name!r}/{split}; pass limit <= {images_u8.shape[0]} or None")
        images_u8, labels = images_u8[:limit], labels[:limit]
    images = to_float_resized(images_u8, image_size)
    return ImageDataset(images.to(device), labels.to(device), classes, name, split)


def _check_name(name) -> None:
    if not isinstance(name, str) or name not in _SPLITS:
        raise ValueError(f"unknown dataset {name!r}; pass one of {available_datasets()}")
