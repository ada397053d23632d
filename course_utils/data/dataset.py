"""The container every loader returns: a labelled image set held as two tensors."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import checks
from ..batches import Batches



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

    def __str__(self) -> str:
        """What a learner reads: 'shapes (train): 10,000 images of 3×32×32, 8 classes, on cpu'."""
        c, h, w = self.images.shape[1:]
        return (f"{self.name} ({self.split}): {len(self):,} images of {c}×{h}×{w}, "
                f"{len(self.classes)} classes, on {self.images.device}")

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

    def to(self, device) -> "ImageDataset":
        """The same data on `device` (a new dataset; this one is unchanged)."""
        device = checks.device(device)
        return ImageDataset(self.images.to(device), self.labels.to(device), list(self.classes),
                            self.name, self.split, dict(self.meta))

    def subset(self, n: int, *, seed: int | None = None) -> "ImageDataset":
        """The first `n` images, or with `seed` a seeded random choice of `n` (no repeats)."""
        n = checks.positive_int(n, "n")
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


def to_float_resized(images_u8: torch.Tensor, image_size: int | None,
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
