"""Sharding: spread the resident training state over n ranks, pay in communication (lesson 08).

Resident state per rank for Ψ fp32 parameters trained with Adam (bytes; ZeRO paper stages):

    stage          params    grads     Adam m, v     communication sent per rank per step
    0  DDP         4Ψ        4Ψ        8Ψ            all-reduce grads:           2(n-1)/n · 4Ψ
    1  ZeRO-1      4Ψ        4Ψ        8Ψ/n          reduce-scatter + all-gather: 2(n-1)/n · 4Ψ
    2  ZeRO-2      4Ψ        4Ψ/n      8Ψ/n          same as ZeRO-1
    3  ZeRO-3/FSDP 4Ψ/n      4Ψ/n      8Ψ/n          all-gather fwd + bwd, reduce-scatter: 3(n-1)/n · 4Ψ

torch implements stage 1 as ``ZeroRedundancyOptimizer`` on top of DDP (all-reduce, then each
owner broadcasts its updated parameters: 3(n-1)/n · 4Ψ, more than the ideal) and stage 3 as
FSDP2 ``fully_shard``; with ``reshard_after_forward=False`` FSDP2 keeps the gathered parameters
from forward to backward (one all-gather saved, ZeRO-2-like traffic 2(n-1)/n · 4Ψ, full
parameters resident during the step). Activations are not sharded by any of them. DDP's row
assumes ``gradient_as_bucket_view=True`` (``wrap_ddp``); by default DDP adds 4Ψ of buckets.

``parallelize`` wraps a model for one of these strategies; the predictions are the table above.
The lesson's experiments (all four strategies trained side by side, a distributed checkpoint
round trip) are in ``course_utils.experiments.sharding``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from course_utils import checks
from course_utils.ledger.comm_count import allreduce_mean_hook
from course_utils.distributed.data_parallel import wrap_ddp
from course_utils.distributed.devices import worker_device
from course_utils.optim import OPTIMIZERS, make_optimizer, state_copies


STAGES = ("ddp", "zero1", "zero2", "zero3")
STRATEGIES = ("ddp", "zero1", "fsdp", "fsdp_keep")   # what torch implements; fsdp_keep: no reshard


# ---------------------------------------------------------------------------------------------
# Predictions (pure arithmetic: the table and plot for 1..64 ranks)
# ---------------------------------------------------------------------------------------------
def predicted_state_bytes(n_params: int, world_size: int, stage: str, optimizer: str = "adamw",
                          param_bytes: int = 4, grad_bytes: int = 4) -> dict:
    """Bytes per rank of params / grads / optimizer state for a ZeRO stage (table above).

    n_params: Ψ (number of parameters). The optimizer keeps fp32 state copies per parameter as
    the kit's one optimizer table says (``optim.state_copies``: Adam's m and v, 8 bytes).
    """
    level = STAGES.index(checks.choice(stage, "stage", STAGES))
    n = checks.positive_int(world_size, "world_size")
    optim_bytes = 4 * state_copies(optimizer)
    return {"params": n_params * param_bytes / (n if level >= 3 else 1),
            "grads": n_params * grad_bytes / (n if level >= 2 else 1),
            "optimizer": n_params * optim_bytes / (n if level >= 1 else 1)}


def predicted_comm_bytes(param_bytes: float, world_size: int, stage: str) -> float:
    """Bytes each rank sends per step with ring collectives, for ``param_bytes`` = 4Ψ (fp32):
    2(n-1)/n·4Ψ, or 3(n-1)/n·4Ψ for stage 3."""
    checks.choice(stage, "stage", STAGES)
    n = world_size
    return (3 if stage == "zero3" else 2) * (n - 1) / n * param_bytes


# ---------------------------------------------------------------------------------------------
# The mechanisms: one model, wrapped for each strategy
# ---------------------------------------------------------------------------------------------
def _mesh(world_size: int):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(worker_device().type, (world_size,))


def parallelize(model: nn.Module, strategy: str, world_size: int, *, optimizer: str = "adamw",
                lr: float = 1e-3, mesh=None, **optimizer_overrides):
    """(module to call, optimizer) for ``model`` (already on this rank's device) under
    'ddp', 'zero1' (ZeroRedundancyOptimizer), 'fsdp' (FSDP2, ZeRO-3) or 'fsdp_keep' (FSDP2 with
    ``reshard_after_forward=False``). ``optimizer`` names a row of ``course_utils.optim``.

    FSDP2 shards each Linear on its own (so gathers happen layer by layer), then the root, over
    ``mesh`` (default: a 1-D mesh of ``world_size`` ranks; ``course_utils.ledger.fake_world``
    yields one built before fake tensors exist, as it must be).
    DDP's all-reduce goes through ``allreduce_mean_hook`` so that ``CollectiveCounter`` sees it.
    """
    checks.choice(strategy, "strategy", STRATEGIES)
    if strategy in ("ddp", "zero1"):
        ddp = wrap_ddp(model)
        ddp.register_comm_hook(None, allreduce_mean_hook)  # visible to CollectiveCounter
        if strategy == "ddp":
            return ddp, make_optimizer(optimizer, ddp.parameters(), lr, **optimizer_overrides)
        spec = OPTIMIZERS[checks.choice(optimizer, "optimizer", OPTIMIZERS)]
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=spec.cls, lr=lr,
                                            **{**spec.defaults, **optimizer_overrides})
    mesh = _mesh(world_size) if mesh is None else mesh
    reshard = strategy == "fsdp"
    for block in model:
        if isinstance(block, nn.Linear):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model, make_optimizer(optimizer, model.parameters(), lr, **optimizer_overrides)


def _local(t):
    """This rank's shard of ``t`` (a DTensor under FSDP2), or ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def full_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one flat vector, gathering FSDP2 shards (DTensor.full_tensor)."""
    parts = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
             for p in model.parameters()]
    return torch.cat(parts)


def local_param_bytes(model: nn.Module) -> int:
    """Parameter bytes this rank holds right now (FSDP2: its shards, or the gathered whole)."""
    return sum(_local(p).numel() * p.element_size() for p in model.parameters())


def local_shards(model: nn.Module, optimizer) -> dict:
    """Every local shard this rank holds: parameters and optimizer state, as plain tensors."""
    def local(t):
        return _local(t).detach().clone()
    state = {f"param.{name}": local(p) for name, p in model.named_parameters()}
    for i, per_param in enumerate(optimizer.state.values()):
        for key, value in per_param.items():
            state[f"optim.{i}.{key}"] = local(value) if isinstance(value, torch.Tensor) else value
    return state
