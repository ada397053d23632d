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
parameters resident during the step). Activations are not sharded by any of them.

Workers take ``(rank, world_size, cfg=None)`` and return plain CPU values.
"""
from __future__ import annotations

import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils.distributed.comm_count import CollectiveCounter, allreduce_mean_hook, state_bytes
from course_utils.distributed.data_parallel import global_batch, settings, shard
from course_utils.distributed.launcher import worker_device

try:  # torch >= 2.6 public path; 2.4-2.5 kept FSDP2 under _composable
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._composable.fsdp import fully_shard

DEFAULTS = dict(width=64, depth=4, batch=8, steps=3, lr=1e-3, seed=0)
STAGES = ("ddp", "zero1", "zero2", "zero3")


# ---------------------------------------------------------------------------------------------
# Predictions (pure arithmetic: the table and plot for 1..64 ranks)
# ---------------------------------------------------------------------------------------------
def predicted_state_bytes(n_params: int, world_size: int, stage: str,
                          param_bytes: int = 4, grad_bytes: int = 4, optim_bytes: int = 8) -> dict:
    """Bytes per rank of params / grads / optimizer state for a ZeRO stage (table above).

    n_params: Ψ (number of parameters). optim_bytes: per parameter (Adam fp32 m and v: 8).
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n = world_size
    level = STAGES.index(stage)
    return {"params": n_params * param_bytes / (n if level >= 3 else 1),
            "grads": n_params * grad_bytes / (n if level >= 2 else 1),
            "optimizer": n_params * optim_bytes / (n if level >= 1 else 1)}


def predicted_comm_bytes(param_bytes: float, world_size: int, stage: str) -> float:
    """Bytes each rank sends per step with ring collectives: 2(n-1)/n·Ψ, or 3(n-1)/n·Ψ for stage 3."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    n = world_size
    return (3 if stage == "zero3" else 2) * (n - 1) / n * param_bytes


# ---------------------------------------------------------------------------------------------
# The model and the three ways of training it
# ---------------------------------------------------------------------------------------------
def make_stack(width: int, depth: int, seed: int) -> nn.Sequential:
    """``depth`` equal blocks Linear(width, width) + Tanh: like transformer blocks, equal sizes, so
    ZeRO-1's whole-parameter partition and FSDP2's row shards both split evenly."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def _adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)


def _mesh(world_size: int):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(worker_device().type, (world_size,))


def build(strategy: str, c, world_size: int):
    """(model, module to call, optimizer) for 'ddp', 'zero1', 'fsdp' or 'fsdp_keep'."""
    device = worker_device()
    model = make_stack(c.width, c.depth, c.seed).to(device)
    if strategy in ("ddp", "zero1"):
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        ddp.register_comm_hook(None, allreduce_mean_hook)  # visible to CollectiveCounter
        if strategy == "ddp":
            return model, ddp, _adamw(ddp.parameters(), c.lr)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=c.lr, weight_decay=0.01)
        return model, ddp, opt
    if strategy in ("fsdp", "fsdp_keep"):
        mesh = _mesh(world_size)
        keep = strategy == "fsdp_keep"
        for block in model:
            if isinstance(block, nn.Linear):
                fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
        fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
        return model, model, _adamw(model.parameters(), c.lr)
    raise ValueError(f"strategy must be 'ddp', 'zero1', 'fsdp' or 'fsdp_keep', got {strategy!r}")


def full_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one flat vector, gathering FSDP2 shards (DTensor.full_tensor)."""
    parts = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
             for p in model.parameters()]
    return torch.cat(parts)


def _local_param_bytes(model) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
               for p in model.parameters())


def train_and_measure(rank: int, world_size: int, strategy: str, c) -> dict:
    """``c.steps`` AdamW steps; the last one counted. Returns params, state and comm per rank."""
    model, module, opt = build(strategy, c, world_size)
    n_params = sum(p.numel() for p in make_stack(c.width, c.depth, c.seed).parameters())
    held_after_forward = None
    for step in range(c.steps):
        x, y = global_batch(step, c.batch * world_size, c.width, c.width, c.seed,
                            device=worker_device())
        counting = step == c.steps - 1
        dist.barrier()
        with CollectiveCounter() if counting else _null() as comm:
            opt.zero_grad()
            out = module(shard(x, rank, world_size))
            if counting:  # parameter bytes this rank holds between forward and backward
                held_after_forward = _local_param_bytes(model)
            F.mse_loss(out, shard(y, rank, world_size)).backward()
            opt.step()
        if counting:
            resident = state_bytes(model, opt)
    return {"strategy": strategy, "n_params": n_params, "param_bytes": 4 * n_params,
            "params": full_params(model), "state": resident,
            "held_after_forward": held_after_forward, "comm": comm.summary(world_size)}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def compare_strategies(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """DDP, ZeRO-1, FSDP2 (ZeRO-3) and FSDP2 without reshard-after-forward, same data and init."""
    c = settings(cfg, DEFAULTS)
    results = {}
    for strategy in ("ddp", "zero1", "fsdp", "fsdp_keep"):
        start = time.perf_counter()
        results[strategy] = train_and_measure(rank, world_size, strategy, c)
        results[strategy]["seconds"] = time.perf_counter() - start
    return results


# ---------------------------------------------------------------------------------------------
# Distributed checkpoint of a sharded model
# ---------------------------------------------------------------------------------------------
def _local_state(model, opt) -> dict:
    """Every local shard this rank holds: parameters and Adam state, as plain tensors."""
    def local(t):
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()
    state = {f"param.{name}": local(p) for name, p in model.named_parameters()}
    for i, per_param in enumerate(opt.state.values()):
        for key, value in per_param.items():
            state[f"optim.{i}.{key}"] = local(value) if isinstance(value, torch.Tensor) else value
    return state


def checkpoint_roundtrip(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Save a sharded FSDP2 model + AdamW state with torch.distributed.checkpoint, load it into a
    fresh sharded model, and compare every local shard bitwise; then one more step on both."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    c = settings(cfg, DEFAULTS)
    device = worker_device()
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)  # every rank writes its own shards into one folder

    def step(model, opt, i):
        x, y = global_batch(i, c.batch * world_size, c.width, c.width, c.seed, device=device)
        opt.zero_grad()
        F.mse_loss(model(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
        opt.step()

    model, _, opt = build("fsdp", c, world_size)
    for i in range(c.steps):
        step(model, opt, i)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path[0])
    files = sorted(p.name for p in __import__("pathlib").Path(path[0]).iterdir())

    fresh, _, fresh_opt = build("fsdp", settings({**(cfg or {}), "seed": c.seed + 1}, DEFAULTS),
                                world_size)  # different init: the load must overwrite it
    fresh_model_sd, fresh_optim_sd = get_state_dict(fresh, fresh_opt)
    loaded = {"model": fresh_model_sd, "optim": fresh_optim_sd}
    dcp.load(loaded, checkpoint_id=path[0])
    set_state_dict(fresh, fresh_opt, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"])

    saved, restored = _local_state(model, opt), _local_state(fresh, fresh_opt)
    exact = all(torch.equal(torch.as_tensor(saved[k]), torch.as_tensor(restored[k])) for k in saved)
    step(model, opt, c.steps)
    step(fresh, fresh_opt, c.steps)
    next_step_equal = torch.equal(full_params(model), full_params(fresh))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path[0], ignore_errors=True)
    return {"keys_match": sorted(saved) == sorted(restored), "exact": exact,
            "next_step_equal": bool(next_step_equal), "files": files,
            "local_shard_bytes": sum(v.numel() * v.element_size() for v in saved.values()
                                     if isinstance(v, torch.Tensor))}


def suite(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Every lesson-08 check in one launch."""
    return {"strategies": compare_strategies(rank, world_size, cfg),
            "checkpoint": checkpoint_roundtrip(rank, world_size, cfg)}
