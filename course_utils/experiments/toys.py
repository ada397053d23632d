"""The toy models and batches every distributed experiment trains (lessons 07-09), written once.

Every factory seeds torch's global RNG itself, so each rank (each process) builds bit-identical
weights from the same seed; every batch comes from its own ``torch.Generator``, so every rank sees
the same global batch and takes its slice with ``shard``.

    make_mlp(in_dim, hidden, out_dim)    Linear-(BN)-Tanh-Linear-Tanh-Linear      (lesson 07)
    make_stack(width, depth, head=...)   depth × (Linear(width, width) + Tanh) [+ Linear]  (08, 09)
    make_transformer_mlp(hidden)         Linear(h, 4h)-GELU-Linear(4h, h)          (09, tensor parallel)
    random_pair / global_batch           x: rows×in_dim, y: rows×out_dim, standard normal
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn


def settings(cfg: dict | None, defaults: dict) -> SimpleNamespace:
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


def make_stack(width: int, depth: int, seed: int, head: bool = False) -> nn.Sequential:
    """``depth`` equal blocks Linear(width, width) + Tanh (then a Linear ``head`` if asked): like
    transformer blocks, equal sizes, so ZeRO-1's whole-parameter partition, FSDP2's row shards and
    a pipeline's stages all split evenly."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    if head:
        layers.append(nn.Linear(width, width))
    return nn.Sequential(*layers)


def make_transformer_mlp(hidden: int, seed: int) -> nn.Sequential:
    """A transformer block's MLP, Linear(h, 4h)-GELU-Linear(4h, h): what tensor parallel splits."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))


def random_pair(rows: int, in_dim: int, out_dim: int, generator_seed: int, dtype=torch.float32,
                device="cpu"):
    """(x: rows×in_dim, y: rows×out_dim), standard normal, drawn from one generator in that order,
    in fp32 and then cast to ``dtype``: the same seed gives the same data at every precision, so
    arms that differ in dtype differ in nothing else (torch draws other numbers in fp64)."""
    g = torch.Generator().manual_seed(generator_seed)
    x = torch.randn(rows, in_dim, generator=g)
    y = torch.randn(rows, out_dim, generator=g)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def global_batch(step: int, rows: int, in_dim: int, out_dim: int, seed: int = 0,
                 dtype=torch.float32, device="cpu"):
    """The step's whole batch (x: rows×in_dim, y: rows×out_dim), identical on every rank."""
    return random_pair(rows, in_dim, out_dim, 10_000 * seed + step, dtype, device)


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank r's contiguous slice of the batch: rows [r·B, (r+1)·B)."""
    if t.shape[0] % world_size:
        raise ValueError(f"batch of {t.shape[0]} rows does not split evenly over {world_size} ranks")
    return t.chunk(world_size)[rank]


def flat_params(model: nn.Module) -> torch.Tensor:
    """Every parameter, detached, as one vector (to compare two models' weights)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """Every parameter's gradient, detached, as one vector."""
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def noisy_views(rows: int, in_dim: int, out_dim: int, seed: int, dtype=torch.float32, device="cpu"):
    """Two "views" of step 0's global batch for the SimCLR workers: the inputs plus two draws of
    noise (std 0.1), identical on every rank."""
    x, _ = global_batch(0, rows, in_dim, out_dim, seed, dtype, device)
    g = torch.Generator().manual_seed(seed + 1)
    return tuple(x + 0.1 * torch.randn(x.shape, generator=g, dtype=dtype).to(device) for _ in range(2))
