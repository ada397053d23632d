"""``SimCLRAugment``: the SimCLR view recipe the lessons use, built from the batched
augmentations of this package (re-exported by ``course_utils.augment``).
"""
from __future__ import annotations

import torch

from .. import checks
from .batch import check_batch, check_rgb_or_gray, interval
from .geometry import horizontal_flip, random_resized_crop, random_rot90
from .photometric import color_jitter, gaussian_blur, random_grayscale

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
    ``geometry(x, g)`` and ``colour(y, g)`` are the two halves (a view is colour(geometry(x))).
    x: B×C×H×W in [0, 1] -> B×C×image_size×image_size in [0, 1].
    """

    def __init__(self, image_size: int, *, crop_scale=(0.2, 1.0), color: bool = True,
                 color_strength: float = 0.5, blur: bool = False, grayscale: bool | None = None,
                 flip: bool = True, rotate: bool = False):
        self.image_size = checks.positive_int(image_size, "image_size", hint="the output side in pixels")
        self.crop_scale = interval(crop_scale, "crop_scale", 0.0, 1.0)
        checks.float_in_range(color_strength, "color_strength", 0, 2.5, hint="0.5 is SimCLR's CIFAR setting")
        self.color = bool(color)
        self.color_strength = float(color_strength)
        self.blur = bool(blur)
        self.grayscale = self.color if grayscale is None else bool(grayscale)
        self.flip = bool(flip)
        self.rotate = bool(rotate)
        self.blur_kernel = max(3, int(0.1 * self.image_size) // 2 * 2 + 1)    # odd, ≈10% of side

    def __str__(self) -> str:
        """The recipe in words, as a lesson prints it."""
        low, high = self.crop_scale
        steps = [f"random crop ({low:g}-{high:g} of the area) to {self.image_size} px"]
        steps += ["flip"] * self.flip + ["rotation by 90° steps"] * self.rotate
        if self.color:
            steps.append(f"colour jitter (strength {self.color_strength:g})")
        steps += ["grayscale"] * self.grayscale + ["blur"] * self.blur
        return ", ".join(steps)

    def __repr__(self) -> str:
        return (f"SimCLRAugment(image_size={self.image_size}, crop_scale={self.crop_scale}, "
                f"color={self.color}, color_strength={self.color_strength}, blur={self.blur}, "
                f"grayscale={self.grayscale}, flip={self.flip}, rotate={self.rotate})")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.colour(self.geometry(x, generator), generator)

    def geometry(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The spatial part of the recipe: crop, flip [, quarter turn]. B×C×H×W -> B×C×S×S.
        Its draws come first, so ``colour(geometry(x, g), g)`` is ``self(x, g)``, bit for bit."""
        check_batch(x)
        check_rgb_or_gray(x, "SimCLRAugment")
        y = random_resized_crop(x, self.image_size, scale=self.crop_scale, generator=generator)
        if self.flip:
            y = horizontal_flip(y, 0.5, generator=generator)
        if self.rotate:
            y = random_rot90(y, generator=generator)
        return y

    def colour(self, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The per-pixel part: colour jitter, grayscale [, blur], as configured (a no-op with
        color=False and no blur). Moves no pixel, so the geometry of y is kept."""
        check_batch(y)
        check_rgb_or_gray(y, "SimCLRAugment")
        rgb = y.shape[1] == 3
        s = self.color_strength
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
