"""Data parallel: n ranks see different data and keep one set of parameters (lesson 07).

The claim: with the global batch X (nB rows) split into n shards X_r of B rows,

    grad of mean-loss on X  =  (1/n) Σ_r  grad of mean-loss on X_r          (equal B)

so DDP (local backward, then all-reduce-average the gradients) takes the *same* optimizer step
as one process on the concatenated batch, whatever the optimizer. Only the summation order
differs, so fp32 agrees to rounding (about 1e-7 relative), fp64 to about 1e-15.

What is *not* automatically one large batch is whatever couples rows within a batch; the pieces
that restore it across ranks live here too:

- ``CrossRankBatchNorm1d`` / ``synced_batch_norm``: BatchNorm statistics over the global batch.
- ``nt_xent_local_with_global_negatives``: SimCLR anchors scored against every rank's embeddings.

The communication they use is in ``collectives``; the lesson's experiments are in
``course_utils.experiments.data_parallel``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils.distributed.collectives import all_gather_with_grad, all_reduce_with_grad
from course_utils.distributed.devices import worker_device
from course_utils.ledger.measured import storage_key
from course_utils.objectives.simclr import nt_xent_loss


def wrap_ddp(model: nn.Module) -> DDP:
    """DDP on this rank's device (its GPU under NCCL; the CPU, no device ids, under gloo).

    ``gradient_as_bucket_view=True``: by default DDP copies every gradient into flat
    communication buckets, so a rank holds the gradients twice (4Ψ in ``p.grad`` + 4Ψ in the
    buckets, for Ψ fp32 parameters). As views, each ``p.grad`` *is* a slice of its bucket: one copy,
    and the ledger's 4Ψ of gradients is the whole story (``grad_storages`` shows it).
    """
    device = worker_device()
    # init_sync broadcasts rank 0's weights; a fake process group (ledger.fake_world) has no
    # other ranks and fake tensors no values to send
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
               gradient_as_bucket_view=True, init_sync=dist.get_backend() != "fake")


def grad_storages(model: nn.Module) -> dict:
    """How the gradients are laid out in memory: distinct storages and their total bytes.

    Under ``wrap_ddp`` every gradient is a view into one of DDP's buckets, so there are as many
    storages as buckets (not one per parameter) and their bytes equal the gradients' bytes."""
    storages = {}
    for p in model.parameters():
        if p.grad is not None:
            storages[storage_key(p.grad)] = p.grad.untyped_storage().nbytes()
    return {"storages": len(storages), "bytes": sum(storages.values()),
            "grads": sum(1 for p in model.parameters() if p.grad is not None)}


def average_gradients(model: nn.Module) -> None:
    """What DDP does, by hand: every grad becomes the mean over ranks (divide first, then sum)."""
    n = dist.get_world_size()
    for p in model.parameters():
        p.grad.div_(n)
        dist.all_reduce(p.grad)  # SUM over ranks, in place, same result everywhere


class CrossRankBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d whose training statistics are over the *global* batch (all ranks).

    What ``nn.SyncBatchNorm`` does on GPUs (it refuses CPU tensors, hence this hand-written
    twin): all-reduce per-channel Σx, Σx² and the row count (2C+1 numbers), then mean = Σx/N,
    var = Σx²/N − mean². The all-reduce is differentiable (``all_reduce_with_grad``), so gradients
    also see the global batch.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: B×C
        if not self.training:
            return super().forward(x)
        c = x.shape[1]
        local = torch.cat([x.sum(0), (x * x).sum(0), x.new_tensor([x.shape[0]])])  # 2C+1
        total = all_reduce_with_grad(local)                                       # Σ over ranks
        count = total[-1]
        mean = total[:c] / count
        var = total[c:2 * c] / count - mean * mean                                # biased, as BN
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))      # unbiased
            self.num_batches_tracked += 1
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def synced_batch_norm(model: nn.Module) -> nn.Module:
    """Swap every BatchNorm1d for a cross-rank one: nn.SyncBatchNorm on CUDA, ours on CPU."""
    if worker_device().type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for name, child in model.named_children():
        if isinstance(child, nn.BatchNorm1d):
            synced = CrossRankBatchNorm1d(child.num_features, child.eps, child.momentum)
            synced.load_state_dict(child.state_dict())
            setattr(model, name, synced.to(child.weight.device, child.weight.dtype))
        else:
            synced_batch_norm(child)
    return model


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
    # drop my own rows by slicing (shapes known without the data: runs on fake tensors too)
    negatives = torch.cat([part for every in (every1, every2)
                           for part in (every[:rank * b], every[(rank + 1) * b:])])   # 2(n-1)B×d
    return nt_xent_loss(z1, z2, temperature=temperature, extra_negatives=negatives)
