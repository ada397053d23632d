"""One workaround for older torch's pipeline schedules, so that lesson 09 runs on the torch a
Colab runtime ships as well as on the one this kit pins.

torch 2.11's schedules (``_initialize_stages``) open a stage's links to its neighbour stages with
a dummy send/recv, also where the neighbour sits on the same rank: ZB-V's V puts stages 1 and 2
on rank 1 of two. NCCL can send to itself; gloo cannot ("Pair is not connected ... <--> [none]"),
so ``ScheduleZBVZeroBubble`` died on two CPU ranks (seen on the first GPU run, where lesson 09's
two ranks share one GPU and fall back to gloo, and reproduced on a CPU with torch 2.11). Later
torch versions warm the links up another way and no longer call the method patched here, so the
patch is inert there. It is hand-written because torch has no public switch for it, and it
touches one private method, ``_PipelineStageBase._get_init_p2p_neighbors_ops`` (listed with the
kit's other private torch APIs in docs/authoring.md).
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist


@contextlib.contextmanager
def no_handshake_with_self():
    """Within the block, a pipeline stage's link-opening handshake skips neighbours on its own
    rank (they exchange tensors in memory, never over the process group)."""
    from torch.distributed.pipelining import stage as stage_module
    base = getattr(stage_module, "_PipelineStageBase", None)
    original = getattr(base, "_get_init_p2p_neighbors_ops", None)
    if original is None:  # a torch without this method needs no workaround
        yield
        return

    def without_self(stage):
        me = dist.get_rank(stage.group)
        return [op for op in original(stage) if getattr(op, "group_peer", None) != me]

    base._get_init_p2p_neighbors_ops = without_self
    try:
        yield
    finally:
        base._get_init_p2p_neighbors_ops = original
