"""All-gather that routes gradients back: SimCLR negatives from every rank, one consistent loss.

Each rank r holds B local rows x_r. ``all_gather_with_grad`` returns X = [x_0; x_1; ...] (nB×d)
on every rank. Every rank's loss L_k may use all of X, and the total objective is Σ_k L_k, so

    d(Σ_k L_k)/d x_r  =  Σ_k  dL_k/dX[rows of r]

i.e. the backward of an all-gather is a *reduce-scatter* (sum the gathered-gradient from every
rank, keep your own slice). DDP then averages parameter gradients over ranks, which turns Σ_k L_k
into mean_k L_k: with equal B, exactly the single-process loss over the nB-image batch.

torch also ships this as ``torch.distributed.nn.functional.all_gather``; the Function below is the
same idea in ten lines so the lesson can show it, and the tests check the two agree.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils.objectives.simclr import nt_xent_loss

# torch >= 2.10 renamed *_into_tensor / *_tensor to *_single; older versions only have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_single(output: torch.Tensor, local: torch.Tensor, group=None, async_op=False):
    """output (n·B×...) <- concatenation of every rank's ``local`` (B×...), in rank order."""
    return _all_gather_single(output, local, group=group, async_op=async_op)


def reduce_scatter_single(output: torch.Tensor, full: torch.Tensor, group=None, async_op=False):
    """output (B×...) <- this rank's slice of Σ over ranks of ``full`` (n·B×...)."""
    return _reduce_scatter_single(output, full, op=dist.ReduceOp.SUM, group=group,
                                  async_op=async_op)


def _gather(local: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    out = local.new_empty((n * local.shape[0], *local.shape[1:]))  # nB×d
    all_gather_single(out, local.contiguous())
    return out


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
        total = local.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad = grad_total.clone()
        dist.all_reduce(grad)
        return grad


def all_reduce_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Σ over ranks, differentiable (cross-rank BatchNorm statistics)."""
    return _AllReduceWithGrad.apply(local)


def all_gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """B×d on each rank -> nB×d on every rank; gradients flow back to each rank's own rows."""
    if not isinstance(local, torch.Tensor) or local.dim() < 1:
        raise TypeError(f"all_gather_with_grad needs a tensor of shape B×..., got {local!r}")
    return _AllGatherWithGrad.apply(local)


@torch.no_grad()
def all_gather_no_grad(local: torch.Tensor) -> torch.Tensor:
    """B×d -> nB×d, detached (MoCo keys: no gradient flows into the key encoder anyway)."""
    return _gather(local)


def nt_xent_local_with_global_negatives(z1: torch.Tensor, z2: torch.Tensor,
                                        temperature: float = 0.5) -> torch.Tensor:
    """This rank's share of the large-batch NT-Xent: its 2B anchors against all 2nB candidates.

    z1, z2: B×d (this rank's two views). The other ranks' rows (2(n-1)B of them, both views) are
    exactly ``extra_negatives`` of the single-process loss: never a positive for a local anchor.
    Returns the mean over local anchors; its mean over ranks (what DDP's gradient averaging
    optimises) equals nt_xent_loss on the concatenated batch.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    b = z1.shape[0]
    every1, every2 = all_gather_with_grad(z1), all_gather_with_grad(z2)  # nB×d each
    others = torch.ones(n * b, dtype=torch.bool, device=z1.device)
    others[rank * b:(rank + 1) * b] = False                               # drop my own rows
    negatives = torch.cat([every1[others], every2[others]])               # 2(n-1)B×d
    return nt_xent_loss(z1, z2, temperature=temperature, extra_negatives=negatives)
