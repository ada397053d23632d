"""Tensor parallel: a Megatron-style MLP split across n ranks (lesson 09).

    y = GeLU(x W1ᵀ + b1) W2ᵀ + b2          x: B×h, W1: 4h×h, W2: h×4h

Column-then-row split: rank r keeps rows r of W1 (and b1), i.e. 4h/n hidden units, and the
matching columns of W2. Then

    H_r = GeLU(x W1_rᵀ + b1_r)     B×4h/n     no communication: GeLU is per unit
    y   = Σ_r H_r W2_rᵀ + b2       B×h        one all-reduce (the "g" operator)

Backward mirrors it: the gradient w.r.t. x is Σ_r of each rank's part, one all-reduce (the "f"
operator, identity in forward). So 2 all-reduces of B×h per MLP per step, whatever n, and each
rank holds 1/n of the MLP's weights and of its 4h-wide activations.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.distributed.comm_count import CollectiveCounter
from course_utils.distributed.data_parallel import settings
from course_utils.distributed.launcher import worker_device


class _CopyToRanks(torch.autograd.Function):
    """f: identity forward; all-reduce (sum) the input gradient in backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _SumFromRanks(torch.autograd.Function):
    """g: all-reduce (sum) the partial outputs in forward; identity in backward (every rank
    computes the same loss from the same y, so each partial gets the gradient of y as is)."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def make_mlp(hidden: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))


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
        x = _CopyToRanks.apply(x)
        hidden = F.gelu(x @ self.w1.t() + self.b1)                    # B×4h/n, local
        return _SumFromRanks.apply(hidden @ self.w2.t()) + self.b2    # B×h, after one all-reduce


def tensor_parallel_mlp(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Column-then-row MLP vs the unsplit one: outputs, gradients, all-reduces counted.

    Also runs torch's own DTensor version (parallelize_module with ColwiseParallel then
    RowwiseParallel) on the same weights and reports whether it agrees.
    """
    c = settings(cfg, dict(hidden=32, batch=8, seed=0))
    device = worker_device()
    full = make_mlp(c.hidden, c.seed).to(device)
    g = torch.Generator().manual_seed(c.seed + 1)
    x = torch.randn(c.batch, c.hidden, generator=g).to(device)
    target = torch.randn(c.batch, c.hidden, generator=g).to(device)
    x_full = x.clone().requires_grad_()
    y_full = full(x_full)
    F.mse_loss(y_full, target).backward()

    tp = ColumnRowMLP(full, rank, world_size).to(device)
    x_tp = x.clone().requires_grad_()
    with CollectiveCounter() as comm:
        y_tp = tp(x_tp)
        forward_calls = comm.calls["all_reduce"]
        F.mse_loss(y_tp, target).backward()
    part = tp.part
    grad_diffs = {
        "w1": (tp.w1.grad - full[0].weight.grad[part]).abs().max().item(),
        "b1": (tp.b1.grad - full[0].bias.grad[part]).abs().max().item(),
        "w2": (tp.w2.grad - full[2].weight.grad[:, part]).abs().max().item(),
        "b2": (tp.b2.grad - full[2].bias.grad).abs().max().item(),
        "x": (x_tp.grad - x_full.grad).abs().max().item()}
    result = {"output_diff": (y_tp - y_full).abs().max().item(), "grad_diff": grad_diffs,
              "allreduce_calls": dict(forward=forward_calls,
                                      backward=comm.calls["all_reduce"] - forward_calls),
              "allreduce_bytes": comm.payload["all_reduce"],
              "predicted_bytes": 2 * c.batch * c.hidden * 4,   # two B×h fp32 all-reduces
              "weights_on_this_rank": sum(p.numel() for p in tp.parameters()),
              "weights_unsplit": sum(p.numel() for p in full.parameters())}
    result["torch_dtensor_output_diff"] = _dtensor_version(full, x, world_size, c.seed, device)
    return result


def _dtensor_version(full, x, world_size, seed, device):
    """torch.distributed.tensor.parallel on a copy of ``full``; max |y - y_full| (or None)."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
    except ImportError:  # pragma: no cover - very old torch
        return None
    copy = make_mlp(full[0].in_features, seed).to(device)
    copy.load_state_dict(full.state_dict())
    mesh = init_device_mesh(device.type, (world_size,))
    parallelize_module(copy, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    with torch.no_grad():
        y = copy(x)
        return (y - full(x)).abs().max().item()
