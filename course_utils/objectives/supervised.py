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


class Supervised(nn.Module):
    """encoder (B×C×H×W → B×feature_dim) + linear head. forward(images, labels) → scalar loss."""

    def __init__(self, encoder: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"encoder must be an nn.Module, got {type(encoder).__name__}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.encoder = encoder
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must be a B={images.shape[0]} vector of class ids, "
                             f"got shape {tuple(labels.shape)}")
        return F.cross_entropy(self.head(self.encoder(images)), labels)
