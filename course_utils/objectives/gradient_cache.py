"""Gradient caching (Gao et al., 2021): every candidate of a big batch, the activations of a chunk.

A contrastive loss couples the images of a batch only through their embeddings z (2N×d). So the
full-batch gradient can be taken in three passes:

    1. z = embed(views) chunk by chunk, without a graph              (nothing kept for backward)
    2. loss(z) and g = ∂loss/∂z with z as a leaf                       (the loss's own graph only)
    3. for each chunk: embed(views_chunk) again, with a graph, and backward(g_chunk)

Pass 3 accumulates Σ_chunks (∂z_chunk/∂θ)ᵀ g_chunk = (∂z/∂θ)ᵀ g, the full-batch gradient: every
anchor still sees all 2N−1 candidates (unlike gradient accumulation), while the encoder keeps for
backward what one chunk needs. The price is one extra forward pass of the encoder.

BatchNorm: a chunk is normalised with its own statistics (both views of its N/chunks images, the
composition of a smaller SimCLR batch), so with BN the update equals that of the same chunks'
statistics, not of one 2N-view batch; passes 1 and 3 use identical chunks, so the cached
embeddings match the recomputed ones. Pass 1 runs in train mode (it must see batch statistics),
and its running-statistics updates are undone, so running statistics move once per chunk, in
pass 3. Without batch-dependent layers the update equals the full batch's (tested in fp64).
"""
from __future__ import annotations

import torch


def gradient_cache_backward(module, embed, view1: torch.Tensor, view2: torch.Tensor, loss_fn, *,
                            chunks: int, scale=lambda loss: loss) -> torch.Tensor:
    """Back-propagate ``loss_fn(embed(view1), embed(view2))`` over the whole batch with the encoder
    run ``chunks`` pieces at a time; returns the detached loss.

    module: the nn.Module whose buffers pass 1 must not move (BatchNorm running statistics);
    embed: views B×... -> B×d; loss_fn(z1, z2) -> scalar (SimCLR's ``loss``, or the gathered-negatives
    loss of data parallel: its backward then also carries the other ranks' gradients to these rows);
    scale wraps the loss before its backward (a GradScaler's ``scale``).
    """
    if view1.shape[0] % chunks:
        raise ValueError(f"batch of {view1.shape[0]} images is not divisible into {chunks} chunks; "
                         "pick a batch size that is a multiple of chunks")
    pieces = [torch.cat(pair) for pair in zip(view1.chunk(chunks), view2.chunk(chunks))]
    # the pieces are the one copy of the views the passes need: drop these references, so that what
    # the step holds through pass 3 is the 2N views once, z and z.grad (lesson 02 budgets exactly
    # that; a caller that keeps its own reference to the views holds them twice)
    del view1, view2

    running = {name: buf.clone() for name, buf in module.named_buffers()}
    with torch.no_grad():
        cached = [embed(piece) for piece in pieces]                 # pass 1: no graph
    for name, buf in module.named_buffers():                         # undo pass 1's BN updates
        buf.copy_(running[name])
    del running

    cached = [z.detach().requires_grad_() for z in cached]
    halves = [z.chunk(2) for z in cached]                            # (view 1, view 2) per chunk
    # z1, z2 are concatenated copies only the loss's graph holds, freed with it by the backward
    loss = loss_fn(torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves]))  # pass 2
    scale(loss).backward()
    loss = loss.detach()
    for piece, z in zip(pieces, cached):                             # pass 3: one chunk at a time
        embed(piece).backward(z.grad)
    return loss
