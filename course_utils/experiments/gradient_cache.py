"""Gradient caching composed with data parallel: each rank caches its own chunks, the loss sees
every rank's candidates, and the update equals one large batch on one process.

Per rank: pass 1 embeds the rank's views without a graph; pass 2 is the gathered-negatives loss
(``distributed.data_parallel.nt_xent_local_with_global_negatives``), whose backward through the
all-gather carries every rank's gradient to the rows it owns; pass 3 back-propagates those cached
gradients chunk by chunk; DDP's averaging then gives the mean over ranks of the local means, i.e.
the large-batch loss's gradient. Launched with ``distributed.launch`` by
tests/test_gradient_cache.py, which lesson 02 cites for the distributed case.
"""
from __future__ import annotations

import torch

from course_utils.distributed.data_parallel import average_gradients, nt_xent_local_with_global_negatives
from course_utils.distributed.devices import worker_device
from course_utils.experiments.toys import flat_grads, make_mlp, noisy_views, settings, shard
from course_utils.objectives.gradient_cache import gradient_cache_backward
from course_utils.objectives.simclr import nt_xent_loss

DEFAULTS = dict(in_dim=16, hidden=32, out_dim=4, batch=16, chunks=4, seed=0, dtype="float64",
                temperature=0.5)


def simclr_gradient_cache(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Gradient caching on every rank with gathered negatives vs one process on the whole batch.
    Returns max |grad − grad_single| and the gradient's scale; cached embeddings per chunk."""
    c = settings(cfg, DEFAULTS)
    device, dtype = worker_device(), getattr(torch, c.dtype)
    n, b = world_size, c.batch
    view1, view2 = noisy_views(b * n, c.in_dim, c.out_dim, c.seed, dtype, device)

    single = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    nt_xent_loss(single(view1), single(view2), c.temperature).backward()

    model = make_mlp(c.in_dim, c.hidden, c.out_dim, seed=c.seed, dtype=dtype).to(device)
    gradient_cache_backward(model, model, shard(view1, rank, n), shard(view2, rank, n),
                            lambda z1, z2: nt_xent_local_with_global_negatives(z1, z2, c.temperature),
                            chunks=c.chunks)
    average_gradients(model)
    return {"grad_diff": (flat_grads(model) - flat_grads(single)).abs().max().item(),
            "grad_scale": flat_grads(single).abs().max().item(),
            "images_per_chunk": b // c.chunks, "candidates_per_anchor": 2 * n * b - 1}
