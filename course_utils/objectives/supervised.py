"""Supervised classification: the baseline objective of the ledger comparison (lesson 05).

    logits = head(encoder(x))             B×C        one view per image, one forward, one backward
    loss   = cross_entropy(logits, y)     y: B int64 labels

Nothing is cached between steps and every image is encoded once: the ledger of the simplest
objective, against which SimCLR (2 views), MoCo (2 views, one without backward, plus a queue)
and MAE (a quarter of the patches through the encoder) are read.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checks
from .base import Objective, as_batch


class Supervised(Objective):
    """encoder (B×C×H×W → B×features) + head (features → B×classes logits); cross-entropy.

    head=None: the encoder already returns logits (a classifier trained as a whole).
    training_loss(batch, augment=None, generator=None): batch (images, labels[, ids]); one view
    per image, augmented when ``augment`` is given → {"loss"}.
    """

    def __init__(self, encoder: nn.Module, head: nn.Module | None = None):
        super().__init__()
        self.encoder = checks.instance(encoder, "encoder", nn.Module)
        self.head = checks.instance(head, "head", nn.Module, optional=True) or nn.Identity()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images))               # B×classes

    def training_loss(self, batch, *, augment=None, generator=None) -> dict:
        images, labels, _ = as_batch(batch)
        if labels is None or labels.shape != (images.shape[0],):
            raise ValueError(f"Supervised needs (images, labels) batches with B={images.shape[0]} "
                             f"class ids, got labels {None if labels is None else tuple(labels.shape)}")
        if augment is not None:
            images = augment(images, generator)
        return {"loss": F.cross_entropy(self(images), labels)}
