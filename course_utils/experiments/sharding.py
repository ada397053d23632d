"""Lesson 08's experiments: one model trained four ways, measured against the ZeRO predictions.

DDP, torch's ZeRO-1 (``ZeroRedundancyOptimizer``), FSDP2 (ZeRO-3) and FSDP2 without
reshard-after-forward train the same toy stack on the same data with AdamW (weight decay 0.01);
each reports the bytes it holds per rank and the collectives of its last step. Then a sharded
model and its optimizer state go through ``torch.distributed.checkpoint`` and back
(``checkpoint_roundtrip``), and across world sizes: ``dcp_save`` on n ranks, ``dcp_load`` on m
(DCP reshards), both returning the whole state (``full_state``) so the two can be compared. The
checkpoint folder is a parameter: on several nodes it must be on a file system they all share.

Workers take ``(rank, world_size, cfg=None)`` (``cfg`` overrides ``DEFAULTS``) and return plain
CPU values. The mechanisms and the predictions are in ``course_utils.distributed.sharding``.
"""
from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils.distributed.data_parallel import grad_storages
from course_utils.distributed.devices import worker_device
from course_utils.distributed.sharding import (STRATEGIES, full_params, local_param_bytes,
                                               local_shards, parallelize)
from course_utils.experiments.toys import global_batch, make_stack, settings, shard
from course_utils.ledger import measure
from course_utils.ledger.measured import state_bytes
from course_utils.ledger.fake import to_device

DEFAULTS = dict(width=64, depth=4, batch=8, steps=3, lr=1e-3, seed=0)


def build(strategy: str, c, world_size: int, mesh=None):
    """(model, module to call, optimizer): the toy stack on this rank's device, wrapped for
    ``strategy`` (see ``parallelize``), trained with AdamW, weight decay 0.01."""
    model = to_device(make_stack(c.width, c.depth, c.seed), worker_device())
    module, optimizer = parallelize(model, strategy, world_size, optimizer="adamw", lr=c.lr,
                                    mesh=mesh, weight_decay=0.01)
    return model, module, optimizer


def train_and_measure(rank: int, world_size: int, strategy: str, c, mesh=None) -> dict:
    """``c.steps`` AdamW steps; the last one measured by the ledger (``measure``: its
    ``comm_bytes`` and per-collective ``comm``). Returns params, state and comm per rank.

    Runs unchanged in a fake world (``course_utils.ledger.fake_world``, pass its ``mesh``, and
    ``fake_mode``): rank 0 of ``world_size`` ranks, no data moved, the same collectives issued.
    """
    model, module, opt = build(strategy, c, world_size, mesh)
    n_params = c.depth * (c.width * c.width + c.width)   # the unsharded stack
    held = {}

    def step(x, y):
        opt.zero_grad()
        out = module(shard(x, rank, world_size))
        held["after_forward"] = local_param_bytes(model)  # parameter bytes held fwd -> bwd
        F.mse_loss(out, shard(y, rank, world_size)).backward()
        opt.step()

    for i in range(c.steps):
        x, y = global_batch(i, c.batch * world_size, c.width, c.width, c.seed, device=worker_device())
        dist.barrier()
        if i < c.steps - 1:
            step(x, y)
        else:
            record = measure(lambda: step(x, y), model=model, optimizer=opt)
    comm = {"payload": {k: v["payload_bytes"] for k, v in record.comm.items()},
            "calls": {k: v["calls"] for k, v in record.comm.items()},
            "ring_bytes_sent": record.comm_bytes, "wire_bytes": record.wire_bytes}
    return {"strategy": strategy, "n_params": n_params, "param_bytes": 4 * n_params,
            "params": None if record.fake else full_params(model), "state": state_bytes(model, opt),
            "held_after_forward": held["after_forward"], "comm": comm, "record": record,
            "grad_layout": grad_storages(model) if strategy in ("ddp", "zero1") else None}


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
def _shared_folder(rank: int, path):
    """(folder, made_here): ``path`` as given, or a temp folder rank 0 makes, which every rank can
    reach only when all ranks run on one machine, so that case alone is allowed."""
    if path is not None:
        return str(path), False
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) > 1:
        raise ValueError(f"ranks run on several machines ({sorted(set(hosts))}): pass path=, a folder "
                         "on a file system every node shares, for the distributed checkpoint")
    folder = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    return folder[0], True


def _train_fsdp(rank: int, world_size: int, c, seed: int, steps: int):
    """FSDP2 toy stack with AdamW from ``seed``, trained ``steps`` steps on the global batches."""
    model, _, opt = build("fsdp", settings({**vars(c), "seed": seed}, DEFAULTS), world_size)
    for i in range(steps):
        _step(model, opt, i, rank, world_size, c)
    return model, opt


def _step(model, opt, i, rank, world_size, c):
    x, y = global_batch(i, c.batch * world_size, c.width, c.width, c.seed, device=worker_device())
    opt.zero_grad()
    F.mse_loss(model(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
    opt.step()


def _dcp_save(model, opt, path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def _dcp_load(model, opt, path) -> None:
    """Load ``path`` into this run's (possibly differently sharded) model and optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, opt)   # this run's layout: what DCP fills in
    loaded = {"model": model_sd, "optim": optim_sd}
    dcp.load(loaded, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])


def full_state(model, opt) -> dict:
    """Every parameter and AdamW state tensor, whole (FSDP2 shards gathered), by parameter name:
    the same dict whatever the number of ranks, so runs of different sizes can be compared."""
    def whole(t):
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()
    out = {}
    for name, p in model.named_parameters():
        out[f"param.{name}"] = whole(p)
        for key, value in opt.state.get(p, {}).items():   # .get: reading must not create state
            out[f"optim.{name}.{key}"] = whole(value) if torch.is_tensor(value) else value
    return out


def checkpoint_roundtrip(rank: int, world_size: int, cfg: dict | None = None, path=None) -> dict:
    """Save a sharded FSDP2 model + AdamW state with torch.distributed.checkpoint, load it into a
    fresh sharded model, and compare every local shard bitwise; then one more step on both.

    ``path``: the checkpoint folder, one that every rank can write (on several nodes: a shared file
    system); the caller owns it and deletes it. ``None``: a temporary folder, allowed only when all
    ranks run on one machine, deleted at the end.
    """
    c = settings(cfg, DEFAULTS)
    folder, made_here = _shared_folder(rank, path)
    model, opt = _train_fsdp(rank, world_size, c, c.seed, c.steps)
    _dcp_save(model, opt, folder)
    files = sorted(p.name for p in Path(folder).iterdir())
    fresh, fresh_opt = _train_fsdp(rank, world_size, c, c.seed + 1, 0)  # other init: load must overwrite
    _dcp_load(fresh, fresh_opt, folder)
    saved, restored = local_shards(model, opt), local_shards(fresh, fresh_opt)
    exact = all(torch.equal(torch.as_tensor(saved[k]), torch.as_tensor(restored[k])) for k in saved)
    _step(model, opt, c.steps, rank, world_size, c)
    _step(fresh, fresh_opt, c.steps, rank, world_size, c)
    next_step_equal = torch.equal(full_params(model), full_params(fresh))
    dist.barrier()
    if made_here and rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return {"keys_match": sorted(saved) == sorted(restored), "exact": exact,
            "next_step_equal": bool(next_step_equal), "files": files,
            "local_shard_bytes": sum(v.numel() * v.element_size() for v in saved.values()
                                     if isinstance(v, torch.Tensor))}


def dcp_save(rank: int, world_size: int, path, cfg: dict | None = None) -> dict:
    """Resharding, part 1: train ``c.steps`` steps sharded over ``world_size`` ranks and save with
    DCP into ``path`` (a folder every rank can write). Returns the whole state (``full_state``)."""
    c = settings(cfg, DEFAULTS)
    model, opt = _train_fsdp(rank, world_size, c, c.seed, c.steps)
    _dcp_save(model, opt, str(path))
    return full_state(model, opt)


def dcp_load(rank: int, world_size: int, path, cfg: dict | None = None, with_before: bool = False) -> dict:
    """Resharding, part 2: a fresh model (other initial weights) sharded over ``world_size`` ranks,
    which need not be the number that saved ``path``, loads it. Returns the whole state, or with
    ``with_before`` {"before": the state before the load, "after": after it}."""
    c = settings(cfg, DEFAULTS)
    model, opt = _train_fsdp(rank, world_size, c, c.seed + 1, 0)
    before = full_state(model, opt) if with_before else None
    _dcp_load(model, opt, str(path))
    return {"before": before, "after": full_state(model, opt)} if with_before else full_state(model, opt)


def suite(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Every lesson-08 check in one launch."""
    return {"strategies": compare_strategies(rank, world_size, cfg),
            "checkpoint": checkpoint_roundtrip(rank, world_size, cfg)}
