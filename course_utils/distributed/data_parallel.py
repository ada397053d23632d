"""Data parallel: n ranks see different data and keep one set of parameters (lesson 07).

Every function taking ``(rank, world_size, cfg=None)`` is a worker for ``launch`` (or torchrun);
``cfg`` is a dict overriding ``DEFAULTS``. Each returns plain CPU values.

The claim checked here: with the global batch X (nB rows) split into n shards X_r of B rows,

    grad of mean-loss on X  =  (1/n) Σ_r  grad of mean-loss on X_r          (equal B)

so DDP (local backward, then all-reduce-average the gradients) takes the *same* optimizer step
as one process on the concatenated batch, whatever the optimizer. Only the summation order
differs, so fp32 agrees to rounding (about 1e-7 relative), fp64 to about 1e-15.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils.distributed.comm_count import CollectiveCounter, allreduce_mean_hook
from course_utils.distributed.gather import (all_gather_no_grad, all_gather_with_grad,
                                             all_reduce_with_grad,
                                             nt_xent_local_with_global_negatives)
from course_utils.distributed.launcher import worker_device

DEFAULTS = dict(in_dim=16, hidden=32, out_dim=4, batch=16, steps=4, lr=0.05, seed=0,
                dtype="float32", accumulation=2, temperature=0.5, queue_size=64)


def settings(cfg: dict | None, defaults: dict = DEFAULTS) -> SimpleNamespace:
    """Merge a worker's ``cfg`` dict over its defaults; unknown keys are an error, not a no-op."""
    cfg = dict(cfg or {})
    unknown = set(cfg) - set(defaults)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(defaults)}")
    return SimpleNamespace(**{**defaults, **cfg})


def make_mlp(in_dim: int, hidden: int, out_dim: int, seed: int, batch_norm: bool = False,
             dtype=torch.float32) -> nn.Sequential:
    """Linear-(BN)-Tanh-Linear-Tanh-Linear, initialised from ``seed`` (tanh: smooth, no dead units)."""
    torch.manual_seed(seed)
    norm = [nn.BatchNorm1d(hidden)] if batch_norm else []
    return nn.Sequential(nn.Linear(in_dim, hidden), *norm, nn.Tanh(),
                         nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, out_dim)).to(dtype)


def global_batch(step: int, rows: int, in_dim: int, out_dim: int, seed: int = 0,
                 dtype=torch.float32, device="cpu"):
    """The step's whole batch (x: rows×in_dim, y: rows×out_dim), identical on every rank."""
    g = torch.Generator().manual_seed(10_000 * seed + step)
    x = torch.randn(rows, in_dim, generator=g, dtype=dtype)
    y = torch.randn(rows, out_dim, generator=g, dtype=dtype)
    return x.to(device), y.to(device)


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank r's contiguous slice of the batch: rows [r·B, (r+1)·B)."""
    if t.shape[0] % world_size:
        raise ValueError(f"batch of {t.shape[0]} rows does not split evenly over {world_size} ranks")
    return t.chunk(world_size)[rank]


def make_optimizer(name: str, params, lr: float):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr / 10, weight_decay=0.01)
    raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {name!r}")


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def _wrap(model: nn.Module) -> DDP:
    device = worker_device()
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def average_gradients(model: nn.Module) -> None:
    """What DDP does, by hand: every grad becomes the mean over ranks (divide first, then sum)."""
    n = dist.get_world_size()
    for p in model.parameters():
        p.grad.div_(n)
        dist.all_reduce(p.grad)  # SUM over ranks, in place, same result everywhere


# ---------------------------------------------------------------------------------------------
# DDP == one process on the concatenated batch
# ---------------------------------------------------------------------------------------------
def ddp_equivalence(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Train DDP (n ranks, B rows each) and a single-process copy (nB rows) side by side.

    Ranks start from *different* seeds: DDP's constructor broadcasts rank 0's parameters, so the
    copies agree before step 1. Returns, per optimizer, max |θ_DDP − θ_single| after each step.
    """
    c = settings(cfg)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    out = {}
    for opt_name in ("sgd", "adamw"):
        model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed + rank, dtype=dtype).to(device)
        before = flat_params(model).sum().item()        # differs per rank: different seeds
        ddp = _wrap(model)
        after = flat_params(model).sum().item()         # rank 0's value everywhere
        single = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
        opt = make_optimizer(opt_name, ddp.parameters(), c.lr)
        single_opt = make_optimizer(opt_name, single.parameters(), c.lr)
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
                         "param_scale": flat_params(single).abs().max().item()}
    return out


def ddp_no_sync_accumulation(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """k micro-batches per rank, all-reduce only on the last (``no_sync``) == one nkB-row step."""
    c = settings(cfg)
    device, dtype, k = worker_device(), getattr(torch, c.dtype), c.accumulation
    model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    ddp = _wrap(model)
    hook_log: dict = {}
    ddp.register_comm_hook(hook_log, allreduce_mean_hook)
    single = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    opt = make_optimizer("sgd", ddp.parameters(), c.lr)
    single_opt = make_optimizer("sgd", single.parameters(), c.lr)
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
    c = settings(cfg)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    psi = sum(p.numel() * p.element_size() for p in model.parameters())  # Ψ bytes
    ddp = _wrap(model)
    hook_log: dict = {}
    ddp.register_comm_hook(hook_log, allreduce_mean_hook)
    opt = make_optimizer("sgd", ddp.parameters(), c.lr)
    x, y = global_batch(0, c.batch * world_size, c.in_dim, c.out_dim, c.seed, dtype, device)
    xs, ys = shard(x, rank, world_size), shard(y, rank, world_size)
    F.mse_loss(ddp(xs), ys).backward()   # warm-up step: DDP builds its buckets on the first one
    opt.step()
    opt.zero_grad()
    dist.barrier()
    with CollectiveCounter() as comm:
        for _ in range(c.steps):
            F.mse_loss(ddp(xs), ys).backward()
            opt.step()
            opt.zero_grad()
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
            "payload_per_step": comm.payload["all_reduce"] / steps,
            "calls_per_step": comm.calls["all_reduce"] / steps,
            "bucket_bytes": hook_log["bucket_bytes"][-comm.calls["all_reduce"] // steps:],
            "ring_sent_per_step": comm.ring_bytes_sent(world_size) / steps,
            "ring_formula": 2 * (world_size - 1) / world_size * psi,
            "wire_per_step": None if comm.wire is None else comm.wire / steps,
            "manual_equals_ddp_bitwise": bool(torch.equal(flat_grads(manual), ddp_grads))}


# ---------------------------------------------------------------------------------------------
# Boundaries: what is *not* automatically one large batch
# ---------------------------------------------------------------------------------------------
class CrossRankBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d whose training statistics are over the *global* batch (all ranks).

    What ``nn.SyncBatchNorm`` does on GPUs (it refuses CPU tensors): all-reduce per-channel
    Σx, Σx² and the row count (2C+1 numbers), then mean = Σx/N, var = Σx²/N − mean². The
    all-reduce is differentiable (torch.distributed.nn), so gradients also see the global batch.
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


def batchnorm_boundary(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Per-rank BatchNorm statistics make DDP differ from the large batch; synced BN does not.

    Each rank's shard is drawn with a rank-dependent shift (as when shards are not i.i.d.), so the
    per-rank batch means differ visibly from the global one.
    """
    c = settings(cfg)
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


def simclr_negatives(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """SimCLR with negatives per rank vs gathered from all ranks (with gradient) vs one process.

    Encoder f = the MLP; two "views" = two noisy copies of the inputs. Returns the losses and the
    max |grad − grad_single| for both variants; the gathered one equals the large batch.
    """
    from course_utils.objectives.simclr import nt_xent_loss
    c = settings(cfg)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    n, b = world_size, c.batch
    x, _ = global_batch(0, b * n, c.in_dim, c.out_dim, c.seed, dtype, device)
    g = torch.Generator().manual_seed(c.seed + 1)
    view1 = x + 0.1 * torch.randn(x.shape, generator=g, dtype=dtype).to(device)
    view2 = x + 0.1 * torch.randn(x.shape, generator=g, dtype=dtype).to(device)

    def make():
        return make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)

    single = make()
    loss_single = nt_xent_loss(single(view1), single(view2), c.temperature)
    loss_single.backward()
    result = {"loss_single": loss_single.item(), "candidates_single": 2 * n * b - 1,
              "candidates_per_rank": 2 * b - 1}
    v1, v2 = shard(view1, rank, n), shard(view2, rank, n)
    for variant in ("per_rank", "gathered"):
        model = make()
        z1, z2 = model(v1), model(v2)
        if variant == "gathered":
            loss = nt_xent_local_with_global_negatives(z1, z2, c.temperature)
        else:
            loss = nt_xent_loss(z1, z2, c.temperature)
        loss.backward()
        average_gradients(model)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        result[variant] = {"loss": (mean_loss / n).item(),
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
    from course_utils.objectives.moco import FeatureQueue
    c = settings(cfg)
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
