"""Differentiable collectives: the communication code the parallel layers and losses are built on.

The layers (``data_parallel``, ``tensor_parallel``) hold the arithmetic; everything that crosses
ranks is here, each op with its forward and its backward (picotron keeps them apart the same way):

    op                      forward                      backward
    all_gather_with_grad    B×d -> nB×d (all-gather)     reduce-scatter: Σ_k dL_k/dX, my rows
    all_reduce_with_grad    Σ_r x_r (all-reduce)         all-reduce of the gradient
    copy_to_ranks     (f)   identity                     all-reduce of the gradient
    sum_from_ranks    (g)   Σ_r x_r (all-reduce)         identity
    all_gather_no_grad      B×d -> nB×d, detached        (none)

Why the all-gather's backward is a reduce-scatter: each rank r holds B local rows x_r and every
rank's loss L_k may use all of X = [x_0; x_1; ...], and the objective is Σ_k L_k, so

    d(Σ_k L_k)/d x_r  =  Σ_k  dL_k/dX[rows of r].

DDP then averages parameter gradients over ranks, which turns Σ_k L_k into mean_k L_k: with equal
B, exactly the single-process loss over the nB-row batch.

torch also ships the gather as ``torch.distributed.nn.functional.all_gather``; the Function below
is the same idea in ten lines so the lesson can show it, and the tests check the two agree.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils import checks

# torch >= 2.10 renamed *_into_tensor / *_tensor to *_single; older versions only have the old names.
# Looked up at call time, so that wrappers installed on torch.distributed (CollectiveCounter, the
# placement check) see these calls too.
def all_gather_single(output: torch.Tensor, local: torch.Tensor, group=None, async_op=False):
    """output (n·B×...) <- concatenation of every rank's ``local`` (B×...), in rank order."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, local, group=group, async_op=async_op)


def reduce_scatter_single(output: torch.Tensor, full: torch.Tensor, group=None, async_op=False):
    """output (B×...) <- this rank's slice of Σ over ranks of ``full`` (n·B×...)."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, full, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def _gather(local: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    out = local.new_empty((n * local.shape[0], *local.shape[1:]))  # nB×d
    all_gather_single(out, local.contiguous())
    return out


def _summed(t: torch.Tensor) -> torch.Tensor:
    """Σ over ranks of ``t``, as a new tensor (``t`` itself is left alone)."""
    total = t.clone()
    dist.all_reduce(total)
    return total


class _AllGatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local):                  # local: B×d
        return _gather(local)                 # nB×d, identical on every rank

    @staticmethod
    def backward(ctx, grad_gathered):         # nB×d: dL_k/dX on rank k
        grad_local = grad_gathered.new_empty(grad_gathered.shape[0] // dist.get_world_size(),
                                             *grad_gathered.shape[1:])
        reduce_scatter_single(grad_local, grad_gathered.contiguous())  # Σ_k, my rows
        return grad_local                     # B×d


class _AllReduceWithGrad(torch.autograd.Function):
    """y = Σ_r x_r on every rank; every rank's loss uses y, so dΣ_k L_k/dx_r = Σ_k dL_k/dy."""

    @staticmethod
    def forward(ctx, local):
        return _summed(local)

    @staticmethod
    def backward(ctx, grad_total):
        return _summed(grad_total)


class _CopyToRanks(torch.autograd.Function):
    """f: identity forward; all-reduce (sum) the input gradient in backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _summed(grad)


class _SumFromRanks(torch.autograd.Function):
    """g: all-reduce (sum) the partial outputs in forward; identity in backward (every rank
    computes the same loss from the same y, so each partial gets the gradient of y as is)."""

    @staticmethod
    def forward(ctx, partial):
        return _summed(partial)

    @staticmethod
    def backward(ctx, grad):
        return grad


def all_reduce_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Σ over ranks, differentiable (cross-rank BatchNorm statistics)."""
    return _AllReduceWithGrad.apply(local)


def all_gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """B×d on each rank -> nB×d on every rank; gradients flow back to each rank's own rows."""
    checks.tensor(local, "all_gather_with_grad's input", shape_hint="B×...")
    if local.dim() < 1:
        raise TypeError(f"all_gather_with_grad needs a tensor of shape B×..., got {local!r}")
    return _AllGatherWithGrad.apply(local)


@torch.no_grad()
def all_gather_no_grad(local: torch.Tensor) -> torch.Tensor:
    """B×d -> nB×d, detached (MoCo keys: no gradient flows into the key encoder anyway)."""
    return _gather(local)


def copy_to_ranks(x: torch.Tensor) -> torch.Tensor:
    """Megatron's f: the same ``x`` on every rank enters a split layer (gradients summed back)."""
    return _CopyToRanks.apply(x)


def sum_from_ranks(partial: torch.Tensor) -> torch.Tensor:
    """Megatron's g: add the ranks' partial outputs of a split layer (gradient passed as is)."""
    return _SumFromRanks.apply(partial)
