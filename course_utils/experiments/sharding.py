"""Lesson 08's experiments: one model trained four ways, measured against the ZeRO predictions.

DDP, torch's ZeRO-1 (``ZeroRedundancyOptimizer``), FSDP2 (ZeRO-3) and FSDP2 without
reshard-after-forward train the same toy stack on the same data with AdamW (weight decay 0.01);
each reports the bytes it holds per rank and the collectives of its last step. Then a sharded
model and its optimizer state go through ``torch.distributed.checkpoint`` and back.

Workers take ``(rank, world_size, cfg=None)`` (``cfg`` overrides ``DEFAULTS``) and return plain
CPU values. The mechanisms and the predictions are in ``course_utils.distributed.sharding``.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils.distributed.comm_count import CollectiveCounter, state_bytes
from course_utils.distributed.data_parallel import grad_storages
from course_utils.distributed.launcher import worker_device
from course_utils.distributed.sharding import (STRATEGIES, full_params, local_param_bytes,
                                               local_shards, parallelize)
from course_utils.experiments.toys import global_batch, make_stack, settings, shard

DEFAULTS = dict(width=64, depth=4, batch=8, steps=3, lr=1e-3, seed=0)


def build(strategy: str, c, world_size: int):
    """(model, module to call, optimizer): the toy stack on this rank's device, wrapped for
    ``strategy`` (see ``parallelize``), trained with AdamW, weight decay 0.01."""
    model = make_stack(c.width, c.depth, c.seed).to(worker_device())
    module, optimizer = parallelize(model, strategy, world_size, optimizer="adamw", lr=c.lr,
                                    weight_decay=0.01)
    return model, module, optimizer


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
        with CollectiveCounter() if counting else contextlib.nullcontext() as comm:
            opt.zero_grad()
            out = module(shard(x, rank, world_size))
            if counting:  # parameter bytes this rank holds between forward and backward
                held_after_forward = local_param_bytes(model)
            F.mse_loss(out, shard(y, rank, world_size)).backward()
            opt.step()
        if counting:
            resident = state_bytes(model, opt)
            layout = grad_storages(model) if strategy in ("ddp", "zero1") else None
    return {"strategy": strategy, "n_params": n_params, "param_bytes": 4 * n_params,
            "params": full_params(model), "state": resident,
            "held_after_forward": held_after_forward, "comm": comm.summary(world_size),
            "grad_layout": layout}


def compare_strategies(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """DDP, ZeRO-1, FSDP2 (ZeRO-3) and FSDP2 without reshard-after-forward, same data and init."""
    c = settings(cfg, DEFAULTS)
    results = {}
    for strategy in STRATEGIES:
        start = time.perf_counter()
        results[strategy] = train_and_measure(rank, world_size, strategy, c)
        results[strategy]["seconds"] = time.perf_counter() - start
    return results


# ---------------------------------------------------------------------------------------------
# Distributed checkpoint of a sharded model
# ---------------------------------------------------------------------------------------------
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
    files = sorted(p.name for p in Path(path[0]).iterdir())

    fresh, _, fresh_opt = build("fsdp", settings({**(cfg or {}), "seed": c.seed + 1}, DEFAULTS),
                                world_size)  # different init: the load must overwrite it
    fresh_model_sd, fresh_optim_sd = get_state_dict(fresh, fresh_opt)
    loaded = {"model": fresh_model_sd, "optim": fresh_optim_sd}
    dcp.load(loaded, checkpoint_id=path[0])
    set_state_dict(fresh, fresh_opt, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"])

    saved, restored = local_shards(model, opt), local_shards(fresh, fresh_opt)
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
