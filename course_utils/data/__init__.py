"""Image datasets as plain tensors: one call, one `ImageDataset`, no DataLoader workers.

Every dataset comes back whole, as `images` (N×C×H×W float32 in [0, 1]) and `labels` (N int64)
on the device you ask for, so augmentations (course_utils.augment) run batched on that device.

Names (`available_datasets()`):

| name       | source                                   | C | native | splits (default sizes)          |
|------------|------------------------------------------|---|--------|---------------------------------|
| "shapes"   | procedural, generated here (the default) | 3 | 32     | train 10000, test 2000          |
| "digits"   | scikit-learn `load_digits` (shipped)     | 1 | 8      | train 1437, test 360            |
| "textures" | crops of scikit-image sample images      | 3 | 32     | train 2048, test 512            |
| "textures-recoloured" | the same crops in grey, each tinted a random colour and tone (class = texture only) | 3 | 32 | train 2048, test 512 |
| "cifar10"  | torchvision, needs a download            | 3 | 32     | train 50000, test 10000         |
| "stl10"    | torchvision, needs a download            | 3 | 96     | train 5000, test 8000, unlabeled 100000 |

"shapes", "digits" and both "textures" need nothing from the internet. "cifar10"/"stl10" live under
`data_root()` and are only fetched with `download=True`; without them a `DatasetUnavailableError`
says how to get them. Everything is deterministic: two loads give bitwise-equal tensors.
`catalog.py` holds `load_dataset` and the names; the other modules, one source each.
"""
from __future__ import annotations

from .catalog import available_datasets, dataset_splits, load_dataset
from .dataset import ImageDataset
from .samples import TEXTURE_CLASSES, available_photos, load_photo
from .shapes import SHAPE_CLASSES, make_shapes
from .storage import DatasetUnavailableError, data_root

__all__ = [
    "ImageDataset", "DatasetUnavailableError", "load_dataset", "available_datasets",
    "dataset_splits", "load_photo", "available_photos", "data_root", "make_shapes",
    "SHAPE_CLASSES", "TEXTURE_CLASSES",
]
