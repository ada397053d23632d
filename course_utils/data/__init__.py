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

from .. import checks
from .dataset import ImageDataset, to_float_resized
from .downloads import load_torchvision
from .samples import TEXTURE_CLASSES, available_photos, load_digits, load_photo, load_textures
from .shapes import SHAPE_CLASSES, load_shapes, make_shapes
from .storage import DatasetUnavailableError, data_root

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
    elif name == "textures":
        images_u8, labels, classes = load_textures(split)
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
