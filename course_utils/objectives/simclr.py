"""SimCLR: in-batch contrastive learning with the NT-Xent (InfoNCE) loss.

Two augmented views of N images are encoded and projected to z1, z2 (N×d each). Stack them into
z = [z1; z2] (2N×d), L2-normalise every row, and for every anchor i in 0..2N-1 let p(i) be the
other view of the same image (i+N mod 2N). With temperature T and cosine similarity s(i, j):

    loss_i = -log( exp(s(i, p(i)) / T) / sum_{j != i} exp(s(i, j) / T) )
    loss   = mean_i loss_i                                   (over all 2N anchors)

The sum runs over the 2N-1 other rows (the anchor itself is excluded: its similarity is always 1,
so including it would add exp(1/T) to every denominator, a term that changes both the loss and
the softmax weights on the real candidates and carries no information) plus, optionally, M extra negatives (rows gathered from other
ranks or a queue). With random unit vectors as embeddings every similarity is about 0, so the
loss is near log(2N - 1 + M) (a random encoder's embeddings are not random vectors: its two views
of one image start closer than other pairs, and its first loss can sit off this value): more candidates means a harder, more informative task, and in SimCLR more
candidates means more images encoded in the same step, both views' forward state kept alive
until backward. That is the resource-ledger point of lesson 02.

Shapes:
    z1, z2            N×d      projections of view 1 and view 2 (row i of each is image i)
    extra_negatives   M×d      optional, never positives for any anchor
    logits            2N×(2N+M) cosine / T, self-similarity set to -inf
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checks
from .base import Objective, as_batch
from .tiled_loss import tiled_nt_xent


def _check_pair(z1, z2, extra_negatives, temperature):
    checks.tensor(z1, "z1", dim=2, shape_hint="N×d")
    checks.tensor(z2, "z2", dim=2, shape_hint="N×d")
    if z1.shape != z2.shape or 0 in z1.shape:
        raise ValueError(f"z1 and z2 must have the same non-empty shape N×d (row i of each is one "
                         f"image), got {tuple(z1.shape)} and {tuple(z2.shape)}")
    checks.positive_float(temperature, "temperature", hint="typical 0.1-0.5")
    if extra_negatives is not None:
        checks.tensor(extra_negatives, "extra_negatives", dim=2, shape_hint=f"M×{z1.shape[1]}")
        if extra_negatives.shape[1] != z1.shape[1]:
            raise ValueError(f"extra_negatives must be M×{z1.shape[1]} (same feature dim as z1), "
                             f"got shape {tuple(extra_negatives.shape)}")


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.5,
                 extra_negatives: torch.Tensor | None = None) -> torch.Tensor:
    """Mean NT-Xent over the 2N anchors of two views (formula in the module docstring).

    z1, z2: N×d. extra_negatives: M×d or None (appended as candidates for every anchor, never a
    positive; they are normalised here too). Returns a scalar tensor. Numerically stable: the
    loss is cross-entropy on masked logits, i.e. a logsumexp, never exp() of raw logits.
    """
    _check_pair(z1, z2, extra_negatives, temperature)
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)              # 2N×d
    logits = z @ z.t() / temperature                                 # 2N×2N
    self_mask = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(self_mask, float("-inf"))            # anchor is not a candidate
    if extra_negatives is not None and extra_negatives.shape[0] > 0:
        negatives = F.normalize(extra_negatives.to(z.dtype), dim=1)  # M×d
        logits = torch.cat([logits, z @ negatives.t() / temperature], dim=1)  # 2N×(2N+M)
    # The positive of row i is the other view of the same image: i+N for view 1, i-N for view 2.
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, targets)


def nt_xent_loss_tiled(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.5, tile: int = 256,
                       extra_negatives: torch.Tensor | None = None) -> torch.Tensor:
    """``nt_xent_loss`` computed in blocks of ``tile`` anchors (see ``tiled_loss``): the same value
    and gradients, but what it keeps for backward grows as N·d, not as the 2N×(2N+M) logits."""
    _check_pair(z1, z2, extra_negatives, temperature)
    checks.positive_int(tile, "tile")
    return tiled_nt_xent(z1, z2, float(temperature), tile, extra_negatives)


def nt_xent_loss_naive(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.5,
                       extra_negatives: torch.Tensor | None = None) -> torch.Tensor:
    """The same loss written as the textbook double loop (slow; for tests and exercises)."""
    _check_pair(z1, z2, extra_negatives, temperature)
    z = F.normalize(torch.cat([z1, z2]), dim=1).double()
    extra = (F.normalize(extra_negatives, dim=1).double() if extra_negatives is not None
             else z.new_zeros(0, z.shape[1]))
    n2 = z.shape[0]
    total = 0.0
    for i in range(n2):
        positive = (i + n2 // 2) % n2
        sims = [torch.dot(z[i], z[j]) / temperature for j in range(n2) if j != i]
        sims += [torch.dot(z[i], e) / temperature for e in extra]
        denom = torch.logsumexp(torch.stack(sims), dim=0)
        total = total - (torch.dot(z[i], z[positive]) / temperature - denom)
    return (total / n2).to(z1.dtype)


class SimCLR(Objective):
    """Backbone + projection head + NT-Xent.

    training_loss(batch, augment=..., generator=...) makes two views of every image and returns
    {"loss"}; forward(view1, view2) is the loss on two given views. Both views go through the
    same encoder in one concatenated batch of 2B (one forward, one backward), so BatchNorm sees
    both views, as in the paper's single-device setting. ``encoder`` is the backbone (what the
    probe evaluates; the projector's output is only for the loss).
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module, temperature: float = 0.5, *,
                 tile: int | None = None):
        super().__init__()
        checks.instance(backbone, "backbone", nn.Module)
        checks.instance(projector, "projector", nn.Module)
        self.encoder = backbone
        self.projector = projector
        self.temperature = checks.positive_float(temperature, "temperature", hint="typical 0.1-0.5")
        # tile: compute the loss with nt_xent_loss_tiled (O(N·d) kept for backward, not O(N²))
        self.tile = None if tile is None else checks.positive_int(tile, "tile")

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.encoder(x))                       # B×d

    def loss(self, z1: torch.Tensor, z2: torch.Tensor,
             extra_negatives: torch.Tensor | None = None) -> torch.Tensor:
        """NT-Xent of two views' embeddings, plain or tiled."""
        if self.tile is None:
            return nt_xent_loss(z1, z2, self.temperature, extra_negatives)
        return nt_xent_loss_tiled(z1, z2, self.temperature, self.tile, extra_negatives)

    def forward(self, view1: torch.Tensor, view2: torch.Tensor,
                extra_negatives: torch.Tensor | None = None) -> torch.Tensor:
        if view1.shape != view2.shape:
            raise ValueError(f"the two views must have the same shape, got "
                             f"{tuple(view1.shape)} and {tuple(view2.shape)}")
        z = self.embed(torch.cat([view1, view2]))                    # 2B×d
        z1, z2 = z.chunk(2)
        return self.loss(z1, z2, extra_negatives)

    def training_loss(self, batch, *, augment=None, generator=None) -> dict:
        if augment is None:
            raise ValueError("SimCLR needs augment= to make two views of each image "
                             "(e.g. course_utils.augment.SimCLRAugment(image_size))")
        images = as_batch(batch).images
        return {"loss": self(augment(images, generator), augment(images, generator))}
