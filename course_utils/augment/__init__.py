"""Batched image augmentations that run where the batch lives (CPU or GPU).

Every function takes a batch x of shape B×C×H×W, float in [0, 1], and returns a new batch in
[0, 1] on the same device. Each sample gets its own random parameters, drawn from `generator`:
a `torch.Generator` on any device (a CPU generator is fine for a CUDA batch: parameters are drawn
on the generator's device and then moved), or torch's global RNG when `generator` is None.
The same generator state gives the same output, bit for bit on one device.

Colour operations need RGB (C = 3). On one-channel input `random_grayscale` is a no-op (it is
already gray), `color_jitter` applies brightness and contrast and raises if asked for saturation
or hue, and `SimCLRAugment` drops the colour-only parts by itself.

Why hand-written rather than ``torchvision.transforms.v2``: v2 draws one set of parameters per
call, so a batch passed in one call gets the same crop and jitter on every image, and per-image
calls on the CPU leave a Colab GPU waiting (SimCLR makes two views of every image every step).
Here parameters are drawn per sample and applied with one batched op on the batch's device (one
grid_sample for all crops, one grouped conv for all blurs): a view of a 512-image batch is a
handful of tensor ops. The colour formulas are torchvision's (tests/test_augment.py compares them).

- ``geometry.py``: ``random_resized_crop``, ``horizontal_flip``, ``random_rot90``.
- ``photometric.py``: ``color_jitter``, ``random_grayscale``, ``gaussian_blur``, the
  ``adjust_*`` functions and ``rgb_to_hsv`` / ``hsv_to_rgb``.
- ``batch.py``: per-sample random draws and the image-batch argument checks.
- ``simclr.py``: ``SimCLRAugment``, the recipe the lessons use.
"""
from __future__ import annotations

from .geometry import horizontal_flip, random_resized_crop, random_rot90
from .photometric import (adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation, color_jitter,
                          gaussian_blur, hsv_to_rgb, random_grayscale, rgb_to_hsv)
from .simclr import SimCLRAugment

__all__ = ["random_resized_crop", "horizontal_flip", "random_rot90", "color_jitter", "random_grayscale",
           "gaussian_blur", "SimCLRAugment", "adjust_brightness", "adjust_contrast",
           "adjust_saturation", "adjust_hue", "rgb_to_hsv", "hsv_to_rgb"]
