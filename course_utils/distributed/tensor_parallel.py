"""Tensor parallel: a Megatron-style MLP split across n ranks (lesson 09).

    y = GeLU(x W1ᵀ + b1) W2ᵀ + b2          x: B×h, W1: 4h×h, W2: h×4h

Column-then-row split: rank r keeps rows r of W1 (and b1), i.e. 4h/n hidden units, and the
matching columns of W2. Then

    H_r = GeLU(x W1_rᵀ + b1_r)     B×4h/n     no communication: GeLU is per unit
    y   = Σ_r H_r W2_rᵀ + b2       B×h        one all-reduce (the "g" operator)

Backward mirrors it: the gradient w.r.t. x is Σ_r of each rank's part, one all-reduce (the "f"
operator, identity in forward). So 2 all-reduces of B×h per MLP per step, whatever n, and each
rank holds 1/n of the MLP's weights and of its 4h-wide activations.

This module is the layer; its two communication ops (f, g) are in ``collectives``. The lesson's
experiment (against the unsplit MLP and torch's DTensor version) is in
``course_utils.experiments.pipeline_tensor_parallel``.
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from course_utils.distributed.collectives import copy_to_ranks, sum_from_ranks


class ColumnRowMLP(nn.Module):
    """This rank's part of ``full`` (an nn.Sequential Linear-GELU-Linear): W1 rows, W2 columns."""

    def __init__(self, full: nn.Sequential, rank: int, world_size: int):
        super().__init__()
        fc1, fc2 = full[0], full[2]
        if fc1.out_features % world_size:
            raise ValueError(f"hidden width {fc1.out_features} must divide by {world_size} ranks")
        part = slice(rank * fc1.out_features // world_size, (rank + 1) * fc1.out_features // world_size)
        self.w1 = nn.Parameter(fc1.weight.detach()[part].clone())     # 4h/n × h   (column split)
        self.b1 = nn.Parameter(fc1.bias.detach()[part].clone())       # 4h/n
        self.w2 = nn.Parameter(fc2.weight.detach()[:, part].clone())  # h × 4h/n   (row split)
        self.b2 = nn.Parameter(fc2.bias.detach().clone())             # h, replicated
        self.part = part

    def forward(self, x):                                             # x: B×h, same on all ranks
        x = copy_to_ranks(x)
        hidden = F.gelu(x @ self.w1.t() + self.b1)                    # B×4h/n, local
        return sum_from_ranks(hidden @ self.w2.t()) + self.b2         # B×h, after one all-reduce
