"""SimSiam (Chen & He 2021): two views, no negatives, a predictor and a stop-gradient.

Both views of N images go through the same encoder f (backbone + projector) to z1, z2 (N×d), and
a small predictor h maps each to p1 = h(z1), p2 = h(z2). With D(p, z) = −cos(p, z) =
−(p / ‖p‖₂) · (z / ‖z‖₂) and stopgrad(·) a constant in backward,

    loss = ½ D(p1, stopgrad(z2)) + ½ D(p2, stopgrad(z1))          (mean over the N images)

It lies in [−1, 1]; −1 when every prediction points exactly at the other view's projection.

Nothing in the loss pushes two images apart: no candidate matrix, no N×N similarities, no cache.
What keeps the representation from collapsing to one constant vector (which would score −1 at
once) is the asymmetry: the predictor and the stop-gradient. Remove the stop-gradient and the
encoder collapses (``stop_gradient=False``; ``tests/test_simsiam.py`` measures it with
``course_utils.evaluate.collapse_stats``); ``use_predictor=False`` makes p = z.

Shapes:
    view1, view2   B×C×H×W       two augmentations of the same B images
    z1, z2         B×d           projections (the encoder's features go through the projector)
    p1, p2         B×d           predictions
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checks
from ..models import ProjectionHead
from .base import Objective, as_batch


def negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """D(p, z) = −mean_i cos(p_i, z_i) over the rows of two N×d tensors; no stop-gradient here
    (the caller detaches z where the method says so)."""
    checks.tensor(p, "p", dim=2, shape_hint="N×d")
    checks.tensor(z, "z", dim=2, shape_hint="N×d")
    if p.shape != z.shape or 0 in p.shape:
        raise ValueError(f"p and z must have the same non-empty shape N×d, got {tuple(p.shape)} "
                         f"and {tuple(z.shape)}")
    return -(F.normalize(p, dim=1) * F.normalize(z, dim=1)).sum(dim=1).mean()


def simsiam_loss(p1, p2, z1, z2, *, stop_gradient: bool = True) -> torch.Tensor:
    """½ D(p1, sg(z2)) + ½ D(p2, sg(z1)) (module docstring); sg is detach() unless
    ``stop_gradient=False`` (the ablation that collapses)."""
    if stop_gradient:
        z1, z2 = z1.detach(), z2.detach()
    return 0.5 * negative_cosine(p1, z2) + 0.5 * negative_cosine(p2, z1)


def prediction_mlp(dim: int, hidden: int) -> nn.Module:
    """SimSiam's predictor h: Linear(d, hidden) - BN - ReLU - Linear(hidden, d), a bottleneck
    (the paper: d = 2048, hidden = 512)."""
    checks.positive_int(dim, "dim")
    checks.positive_int(hidden, "hidden")
    return nn.Sequential(nn.Linear(dim, hidden, bias=False), nn.BatchNorm1d(hidden),
                         nn.ReLU(inplace=True), nn.Linear(hidden, dim))


class SimSiam(Objective):
    """Backbone + projector (the encoder f) + predictor h, trained with ``simsiam_loss``.

    ``encoder`` is the backbone (what a probe evaluates). ``predictor=None`` builds
    ``prediction_mlp(d, d // 4)`` on the projector's output size ``dim``; ``use_predictor=False``
    drops it (p = z); ``stop_gradient=False`` lets the gradient flow into both branches. Both
    views go through the encoder in one concatenated batch of 2B, as SimCLR does.
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module, dim: int, *,
                 predictor: nn.Module | None = None, use_predictor: bool = True,
                 stop_gradient: bool = True):
        super().__init__()
        checks.instance(backbone, "backbone", nn.Module)
        checks.instance(projector, "projector", nn.Module)
        checks.positive_int(dim, "dim", hint="the projector's output size")
        self.encoder, self.projector = backbone, projector
        self.predictor = (predictor or prediction_mlp(dim, max(1, dim // 4))) if use_predictor else nn.Identity()
        self.stop_gradient = bool(stop_gradient)

    @classmethod
    def recipe(cls, backbone: nn.Module, dim: int, *, hidden: int = 128, **kwargs) -> "SimSiam":
        """SimSiam as the kit trains it (lesson 13, benchmarks/bench_ssl_quality.py and
        tools/gpu_budget.py build it here, so the three cannot drift apart): the paper's projector
        ending in BatchNorm, ``ProjectionHead(backbone.feature_dim, hidden, dim,
        output_batch_norm=True)``, and a predictor as wide as d, ``prediction_mlp(dim, dim)``
        (the paper's d/4 bottleneck is for d = 2048). ``kwargs``: ``stop_gradient``,
        ``use_predictor``."""
        feature_dim = getattr(backbone, "feature_dim", None)
        if not isinstance(feature_dim, int):
            raise TypeError(f"SimSiam.recipe needs a backbone with an int feature_dim (the kit's "
                            f"SmallResNet or ViT), got {type(backbone).__name__}")
        checks.positive_int(dim, "dim", hint="the projector's output size")
        projector = ProjectionHead(feature_dim, hidden, dim, output_batch_norm=True)
        return cls(backbone, projector, dim, predictor=prediction_mlp(dim, dim), **kwargs)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.encoder(x))                       # B×d

    def forward(self, view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
        if view1.shape != view2.shape:
            raise ValueError(f"the two views must have the same shape, got "
                             f"{tuple(view1.shape)} and {tuple(view2.shape)}")
        z = self.embed(torch.cat([view1, view2]))                    # 2B×d
        p = self.predictor(z)
        (z1, z2), (p1, p2) = z.chunk(2), p.chunk(2)
        return simsiam_loss(p1, p2, z1, z2, stop_gradient=self.stop_gradient)

    def training_loss(self, batch, *, augment=None, generator=None) -> dict:
        if augment is None:
            raise ValueError("SimSiam needs augment= to make two views of each image "
                             "(e.g. course_utils.augment.SimCLRAugment(image_size))")
        images = as_batch(batch).images
        return {"loss": self(augment(images, generator), augment(images, generator))}
