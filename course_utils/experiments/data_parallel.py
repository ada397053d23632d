"""Lesson 07's experiments: the launcher at work, then DDP as one large-batch update and its limits.

Every function taking ``(rank, world_size, ...)`` is a worker for ``launch`` (or torchrun); it
lives in a module, not a notebook, because each rank re-imports its worker by module and name.
The data-parallel workers take ``cfg``, a dict overriding ``DEFAULTS``, and return plain CPU values.
The mechanisms they exercise are in ``course_utils.distributed.data_parallel``.

Optimizers come from ``course_utils.optim`` by name: "sgd-momentum" (SGD, momentum 0.9) at
``lr``, and "adamw" at lr/10 with weight decay 0.01; ``ddp_equivalence`` runs both.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from course_utils.distributed.collectives import all_gather_no_grad, all_gather_with_grad
from course_utils.ledger.comm_count import allreduce_mean_hook
from course_utils.distributed.data_parallel import (average_gradients,
                                                    nt_xent_local_with_global_negatives,
                                                    synced_batch_norm, wrap_ddp)
from course_utils.distributed.devices import worker_device
from course_utils.distributed.train import full_parameters, params_sha256
from course_utils.experiments.toys import (flat_grads, flat_params, global_batch, make_mlp, noisy_views,
                                           settings, shard)
from course_utils.ledger import measure
from course_utils.objectives.moco import FeatureQueue
from course_utils.objectives.simclr import nt_xent_loss
from course_utils.optim import make_optimizer

DEFAULTS = dict(in_dim=16, hidden=32, out_dim=4, batch=16, steps=4, lr=0.05, seed=0,
                dtype="float32", accumulation=2, temperature=0.5, queue_size=64)
EQUIVALENCE_OPTIMIZERS = ("sgd-momentum", "adamw")   # the result keys of ddp_equivalence


def _optimizer(name: str, params, lr: float):
    """``make_optimizer(name)``; AdamW at a tenth of the lr, with weight decay 0.01."""
    if name == "adamw":
        return make_optimizer("adamw", params, lr / 10, weight_decay=0.01)
    return make_optimizer(name, params, lr)


# ---------------------------------------------------------------------------------------------
# The launcher at work, including when things go wrong
# ---------------------------------------------------------------------------------------------
def hello_all_reduce(rank: int, world_size: int) -> dict:
    """Each rank contributes rank + 1; all-reduce (sum) gives every rank n(n+1)/2."""
    # On this rank's device: NCCL only takes CUDA tensors, gloo CPU ones.
    value = torch.tensor([float(rank + 1)], device=worker_device())
    dist.all_reduce(value)  # default op: SUM, result written in place on every rank
    return {"rank": rank, "world_size": world_size, "sum": value.item(),
            "backend": dist.get_backend(), "pid": os.getpid()}


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` raises; the others wait in a collective that can never complete."""
    if rank == bad_rank:
        raise ValueError(f"rank {rank} found a NaN in its shard (on purpose)")
    dist.barrier()
    return rank


def sampler_epochs(rank: int, world_size: int, dataset_size: int = 20, epochs: int = 3,
                   batch: int = 4) -> dict:
    """Which examples this rank sees each epoch, through DistributedSampler + DataLoader.

    ``set_epoch(e)`` reseeds the shuffle: without it every epoch repeats epoch 0's order."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    data = TensorDataset(torch.arange(dataset_size))          # example i is the number i
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    seen, seen_without_set_epoch = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)                               # forget this and epochs repeat
        seen.append([i for (ids,) in loader for i in ids.tolist()])
    frozen = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    for epoch in range(epochs):                                # no set_epoch
        seen_without_set_epoch.append(list(frozen))
    return {"seen": seen, "seen_without_set_epoch": seen_without_set_epoch}


# ---------------------------------------------------------------------------------------------
# DDP == one process on the concatenated batch
# ---------------------------------------------------------------------------------------------
def ddp_equivalence(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Train DDP (n ranks, B rows each) and a single-process copy (nB rows) side by side.

    Ranks start from *different* seeds: DDP's constructor broadcasts rank 0's parameters, so the
    copies agree before step 1. Returns, per optimizer, max |θ_DDP − θ_single| after each step
    and a SHA-256 of this rank's final parameters (equal on every rank when the copies end the
    run bit-identical).
    """
    c = settings(cfg, DEFAULTS)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    out = {}
    for opt_name in EQUIVALENCE_OPTIMIZERS:
        model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed + rank, dtype=dtype).to(device)
        before = flat_params(model).sum().item()        # differs per rank: different seeds
        ddp = wrap_ddp(model)
        after = flat_params(model).sum().item()         # rank 0's value everywhere
        single = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
        opt = _optimizer(opt_name, ddp.parameters(), c.lr)
        single_opt = _optimizer(opt_name, single.parameters(), c.lr)
        diffs, bitwise = [], []
        for step in range(c.steps):
            x, y = global_batch(step, c.batch * world_size, c.in_dim, c.out_dim, c.seed, dtype, device)
            opt.zero_grad()
            F.mse_loss(ddp(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
            opt.step()
            single_opt.zero_grad()
            F.mse_loss(single(x), y).backward()
            single_opt.step()
            d = flat_params(model) - flat_params(single)
            diffs.append(d.abs().max().item())
            bitwise.append(bool((d == 0).all()))
        out[opt_name] = {"checksum_before_broadcast": before, "checksum_after_broadcast": after,
                         "max_abs_diff": diffs, "bitwise_equal": bitwise,
                         "param_scale": flat_params(single).abs().max().item(),
                         # every bit of this rank's final parameters, to compare across ranks
                         "final_params_sha256": params_sha256(full_parameters(model))}
    return out


def ddp_no_sync_accumulation(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """k micro-batches per rank, all-reduce only on the last (``no_sync``) == one nkB-row step."""
    c = settings(cfg, DEFAULTS)
    device, dtype, k = worker_device(), getattr(torch, c.dtype), c.accumulation
    model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    ddp = wrap_ddp(model)
    hook_log: dict = {}
    ddp.register_comm_hook(hook_log, allreduce_mean_hook)
    single = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    opt = _optimizer("sgd-momentum", ddp.parameters(), c.lr)
    single_opt = _optimizer("sgd-momentum", single.parameters(), c.lr)
    diffs, buckets_per_step = [], []
    for step in range(c.steps):
        x, y = global_batch(step, c.batch * world_size * k, c.in_dim, c.out_dim, c.seed, dtype, device)
        xs, ys = shard(x, rank, world_size).chunk(k), shard(y, rank, world_size).chunk(k)
        opt.zero_grad()
        before = len(hook_log.get("bucket_bytes", []))
        for i in range(k):
            sync_now = i == k - 1   # only the last micro-batch's backward all-reduces
            with contextlib.nullcontext() if sync_now else ddp.no_sync():
                (F.mse_loss(ddp(xs[i]), ys[i]) / k).backward()  # /k: mean over k micro-batches
        buckets_per_step.append(len(hook_log["bucket_bytes"]) - before)
        opt.step()
        single_opt.zero_grad()
        F.mse_loss(single(x), y).backward()
        single_opt.step()
        diffs.append((flat_params(model) - flat_params(single)).abs().max().item())
    return {"max_abs_diff": diffs, "allreduce_buckets_per_step": buckets_per_step,
            "micro_batches": k}


def ddp_comm_bytes(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Bytes per step of DDP's gradient all-reduce: payload counted, ring formula, wire measured.

    Also checks that averaging by hand (``average_gradients``) gives DDP's gradients bitwise.
    """
    c = settings(cfg, DEFAULTS)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    psi = sum(p.numel() * p.element_size() for p in model.parameters())  # 4Ψ: gradient bytes of Ψ fp32 parameters
    ddp = wrap_ddp(model)
    hook_log: dict = {}
    ddp.register_comm_hook(hook_log, allreduce_mean_hook)
    opt = _optimizer("sgd-momentum", ddp.parameters(), c.lr)
    x, y = global_batch(0, c.batch * world_size, c.in_dim, c.out_dim, c.seed, dtype, device)
    xs, ys = shard(x, rank, world_size), shard(y, rank, world_size)
    F.mse_loss(ddp(xs), ys).backward()   # warm-up step: DDP builds its buckets on the first one
    opt.step()
    opt.zero_grad()
    dist.barrier()
    def steps():
        for _ in range(c.steps):
            F.mse_loss(ddp(xs), ys).backward()
            opt.step()
            opt.zero_grad()
    record = measure(steps, model=ddp, optimizer=opt)   # the ledger's communicated line
    all_reduce = record.comm["all_reduce"]
    # Same step by hand on a plain copy: local backward, then average_gradients.
    manual = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    manual.load_state_dict(model.state_dict())
    opt.zero_grad()
    F.mse_loss(ddp(xs), ys).backward()
    ddp_grads = flat_grads(model)
    F.mse_loss(manual(xs), ys).backward()
    average_gradients(manual)
    steps = c.steps
    return {"param_bytes": psi, "world_size": world_size,
            "payload_per_step": all_reduce["payload_bytes"] / steps,
            "calls_per_step": all_reduce["calls"] / steps,
            "bucket_bytes": hook_log["bucket_bytes"][-all_reduce["calls"] // steps:],
            "ring_sent_per_step": record.comm_bytes / steps,
            "ring_formula": 2 * (world_size - 1) / world_size * psi,
            "wire_per_step": None if record.wire_bytes is None else record.wire_bytes / steps,
            "manual_equals_ddp_bitwise": bool(torch.equal(flat_grads(manual), ddp_grads))}


# ---------------------------------------------------------------------------------------------
# Boundaries: what is *not* automatically one large batch
# ---------------------------------------------------------------------------------------------
def batchnorm_boundary(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Per-rank BatchNorm statistics make DDP differ from the large batch; synced BN does not.

    Each rank's shard is drawn with a rank-dependent shift (as when shards are not i.i.d.), so the
    per-rank batch means differ visibly from the global one.
    """
    c = settings(cfg, DEFAULTS)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    x, y = global_batch(0, c.batch * world_size, c.in_dim, c.out_dim, c.seed, dtype, device)
    x = x + torch.arange(world_size, device=device, dtype=dtype).repeat_interleave(c.batch)[:, None]
    xs, ys = shard(x, rank, world_size), shard(y, rank, world_size)

    def make():
        return make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, batch_norm=True,
                        dtype=dtype).to(device)

    single = make()
    out = single(x)   # one forward only: each forward in train mode moves the running stats
    F.mse_loss(out, y).backward()
    ref_out, ref_grad = out[rank * c.batch:(rank + 1) * c.batch].detach(), flat_grads(single)
    result = {}
    for variant, model in (("per_rank_bn", make()), ("synced_bn", synced_batch_norm(make()))):
        out = model(xs)
        F.mse_loss(out, ys).backward()
        average_gradients(model)
        bn = model[1]
        result[variant] = {"output_diff": (out.detach() - ref_out).abs().max().item(),
                           "grad_diff": (flat_grads(model) - ref_grad).abs().max().item(),
                           "running_mean_diff": (bn.running_mean - single[1].running_mean)
                           .abs().max().item()}
    first = single[0](x).detach()           # pre-BN features of the whole batch
    result["batch_mean_gap"] = (first[rank * c.batch:(rank + 1) * c.batch].mean(0)
                                - first.mean(0)).abs().max().item()
    return result


class _CrossEntropyLogits(TorchFunctionMode):
    """Keeps the logits ``F.cross_entropy`` was called with, so that a worker can count the
    candidates each anchor was actually scored against, not restate the formula."""

    def __init__(self):
        super().__init__()
        self.logits: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.cross_entropy:
            self.logits = args[0].detach()
        return func(*args, **(kwargs or {}))


def _loss_and_candidates(loss_fn, *args, **kwargs) -> tuple[torch.Tensor, int]:
    """``loss_fn(*args)`` and the number of candidates anchor 0 was scored against: the finite
    entries of its row of logits (its positive and its negatives; itself is masked to −inf)."""
    with _CrossEntropyLogits() as seen:
        loss = loss_fn(*args, **kwargs)
    return loss, int(torch.isfinite(seen.logits[0]).sum().item())


def simclr_negatives(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """SimCLR with negatives per rank vs gathered from all ranks (with gradient) vs one process.

    Encoder f = the MLP; two "views" = two noisy copies of the inputs. Returns the losses, the
    max |grad − grad_single| and the candidates per anchor (counted from the logits each loss
    scored) for both variants; the gathered one equals the large batch.
    """
    c = settings(cfg, DEFAULTS)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    n, b = world_size, c.batch
    view1, view2 = noisy_views(b * n, c.in_dim, c.out_dim, c.seed, dtype, device)

    def make():
        return make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)

    single = make()
    loss_single, candidates_single = _loss_and_candidates(nt_xent_loss, single(view1),
                                                          single(view2), c.temperature)
    loss_single.backward()
    result = {"loss_single": loss_single.item(), "candidates_single": candidates_single}
    v1, v2 = shard(view1, rank, n), shard(view2, rank, n)
    for variant, loss_fn in (("per_rank", nt_xent_loss),
                             ("gathered", nt_xent_local_with_global_negatives)):
        model = make()
        loss, candidates = _loss_and_candidates(loss_fn, model(v1), model(v2), c.temperature)
        loss.backward()
        average_gradients(model)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        result[variant] = {"loss": (mean_loss / n).item(), "candidates": candidates,
                           "grad_diff": (flat_grads(model) - flat_grads(single)).abs().max().item(),
                           "grad_scale": flat_grads(single).abs().max().item()}
    # Our all-gather-with-grad agrees with torch's own differentiable all_gather.
    w = torch.randn(b, c.out_dim, generator=torch.Generator().manual_seed(rank), dtype=dtype)
    w = w.to(device).requires_grad_()
    weights = torch.arange(n * b * c.out_dim, dtype=dtype, device=device).reshape(n * b, -1)
    (all_gather_with_grad(w) * weights).sum().backward()
    ours = w.grad.clone()
    w.grad = None
    with warnings.catch_warnings():  # deprecated in new torch for a private replacement
        warnings.simplefilter("ignore", FutureWarning)
        (torch.cat(dist_nn.all_gather(w)) * weights).sum().backward()
    result["matches_torch_all_gather"] = bool(torch.allclose(ours, w.grad))
    return result


def moco_queue_from_all_ranks(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """MoCo's queue under DDP: enqueue the keys of *all* ranks, so every rank holds the same queue.

    Keys carry global ids (rank·1000 + row) so the test can see whose keys are in whose queue.
    """
    c = settings(cfg, DEFAULTS)
    device = worker_device()
    gen = torch.Generator().manual_seed(c.seed)
    shared = FeatureQueue(c.queue_size, c.out_dim, generator=gen).to(device)
    own = FeatureQueue(c.queue_size, c.out_dim,
                       generator=torch.Generator().manual_seed(c.seed)).to(device)
    for step in range(c.steps):
        keys = F.normalize(torch.randn(c.batch, c.out_dim,
                                       generator=torch.Generator().manual_seed(100 * step + rank)), dim=1)
        ids = rank * 1000 + step * c.batch + torch.arange(c.batch)
        keys, ids = keys.to(device), ids.to(device)
        shared.enqueue(all_gather_no_grad(keys), all_gather_no_grad(ids))  # nB keys per step
        own.enqueue(keys, ids)                                               # B keys per step
    return {"shared_keys": shared.keys, "shared_ids": shared.ids, "own_ids": own.ids,
            "own_keys": own.keys, "ptr": int(shared.ptr)}


def suite(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Every lesson-07 check in one launch (start-up costs seconds; the checks milliseconds)."""
    checks = {"equivalence": (ddp_equivalence, cfg),
              "equivalence_fp64": (ddp_equivalence, {**(cfg or {}), "dtype": "float64"}),
              "no_sync": (ddp_no_sync_accumulation, cfg), "comm": (ddp_comm_bytes, cfg),
              "batchnorm": (batchnorm_boundary, cfg), "simclr": (simclr_negatives, cfg),
              "moco": (moco_queue_from_all_ranks, cfg)}
    results, seconds = {}, {}
    for name, (check, check_cfg) in checks.items():
        start = time.perf_counter()
        results[name] = check(rank, world_size, check_cfg)
        seconds[name] = time.perf_counter() - start
    results["seconds"] = seconds
    return results
