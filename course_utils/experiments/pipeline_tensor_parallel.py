"""Lesson 09's experiments: a real pipeline and a real tensor-parallel MLP, against the unsplit model.

- ``pipeline_two_stages``: torch.distributed.pipelining runs GPipe and 1F1B over ``world_size``
  stages of a deep MLP (``distributed.pipeline.stage_slice``); each stage's gradients are compared
  with the unsplit model's, and the micro-batches whose activations it holds at once are counted
  (``distributed.pipeline_trace.StageTrace``).
- ``pipeline_zero_bubble``: torch's zero-bubble schedules (ZB-H1 and ZB-V, backward split into
  input and weight parts) in fp64, with the action order each rank ran and its live activations.
- ``tensor_parallel_mlp``: the Megatron column-then-row MLP (``distributed.tensor_parallel``)
  against the unsplit MLP and against torch's own DTensor version, all-reduces counted.
- ``context_parallel``: ring attention (``distributed.context_parallel``) on a sequence split
  across the ranks, against unsplit attention in fp64: outputs, dQ/dK/dV, kept-for-backward
  bytes (ledger), point-to-point bytes (counted) and causal score blocks per rank.

Workers take ``(rank, world_size, cfg=None)`` and return plain CPU values; ``suite`` runs both in
one launch. The schedule simulator (no ranks needed) is ``distributed.pipeline.simulate``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils import checks
from course_utils.ledger.comm_count import CollectiveCounter
from course_utils.distributed.context_parallel import (Ring, ring_attention, ring_bytes_per_step,
                                                       score_blocks, split_sequence)
from course_utils.distributed.devices import worker_device
from course_utils.distributed.pipeline import stage_slice
from course_utils.distributed.pipeline_compat import no_handshake_with_self
from course_utils.distributed.pipeline_trace import StageTrace
from course_utils.distributed.tensor_parallel import ColumnRowMLP
from course_utils.experiments.toys import make_stack, make_transformer_mlp, random_pair, settings
from course_utils.ledger import measure

ZERO_BUBBLE_SCHEDULES = ("zb_h1", "zbv")
PIPELINE_DEFAULTS = dict(width=32, depth=4, batch=16, microbatches=4, seed=0)
TENSOR_PARALLEL_DEFAULTS = dict(hidden=32, batch=8, seed=0)
CONTEXT_DEFAULTS = dict(batch=2, sequence=32, dim=16, seed=0)
CONTEXT_ARMS = {"full": (False, False), "causal": (True, False), "causal zig-zag": (True, True)}


def _pipeline_step(schedule_class, stage_ids, num_stages, c, x, y, dtype):
    """Build this rank's stages ``stage_ids`` (of ``num_stages``) of the toy stack and run one
    ``schedule_class`` step on them, traced; return (parts, trace, losses, schedule)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle
    device = x.device
    parts = [stage_slice(make_stack(c.width, c.depth, c.seed, head=True).to(dtype), s, num_stages)
             .to(device) for s in stage_ids]
    stages = [PipelineStage(part, stage_index=s, num_stages=num_stages, device=device)
              for s, part in zip(stage_ids, parts)]
    single = issubclass(schedule_class, PipelineScheduleSingle)
    # loss_fn per micro-batch; the schedule divides the summed grads by m (scale_grads)
    schedule = schedule_class(stages[0] if single else stages, n_microbatches=c.microbatches,
                              loss_fn=F.mse_loss)
    losses: list = []
    inputs = (x,) if 0 in stage_ids else ()
    targets = dict(target=y, losses=losses) if num_stages - 1 in stage_ids else {}
    with StageTrace(stages) as trace, no_handshake_with_self():
        schedule.step(*inputs, **targets)
    return parts, trace, losses, schedule


def _grad_gap(parts, stage_ids, num_stages, full) -> float:
    """max |grad - unsplit model's grad| over this rank's stages."""
    return max((p.grad - r.grad).abs().max().item() for part, s in zip(parts, stage_ids)
               for p, r in zip(part.parameters(), stage_slice(full, s, num_stages).parameters()))


def pipeline_two_stages(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Train one step with GPipe and with 1F1B (torch.distributed.pipelining) on world_size stages;
    return each stage's max gradient difference from the unsplit model's, and the most
    micro-batches whose activations the stage held at once (``pipeline_trace.StageTrace``)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    if world_size < 2:
        raise ValueError(f"a pipeline needs at least 2 stages (ranks), got world_size={world_size}; "
                         "launch it with 2 or more ranks")
    c = settings(cfg, PIPELINE_DEFAULTS)
    device = worker_device()
    x, y = random_pair(c.batch, c.width, c.width, c.seed, device=device)
    full = make_stack(c.width, c.depth, c.seed, head=True).to(device)
    F.mse_loss(full(x), y).backward()   # the reference: one process, whole batch
    result = {}
    for name, schedule_class in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        parts, trace, losses, _ = _pipeline_step(schedule_class, [rank], world_size, c, x, y,
                                                 torch.float32)
        result[name] = {"grad_diff": _grad_gap(parts, [rank], world_size, full),
                        "loss": torch.stack(losses).mean().item() if losses else None,
                        "params_on_this_stage": sum(p.numel() for p in parts[0].parameters()),
                        "peak_microbatches_alive": trace.peak[rank],
                        "alive_after_step": trace.alive()}
        dist.barrier()
    result["loss_unsplit"] = F.mse_loss(full(x), y).item()
    result["grad_scale"] = max(p.grad.abs().max().item() for p in full.parameters())
    return result


def zero_bubble_stages(schedule: str, rank: int, world_size: int) -> list[int]:
    """The stages rank holds: "zb_h1" one (stage = rank); "zbv" two in a V, rank and 2p-1-rank,
    so rank 0 holds the first and the last stage (the ZB-V paper's placement)."""
    checks.choice(schedule, "schedule", ZERO_BUBBLE_SCHEDULES)
    return [rank] if schedule == "zb_h1" else [rank, 2 * world_size - 1 - rank]


def pipeline_zero_bubble(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """torch's own zero-bubble schedules, one fp64 step each, traced: "zb_h1" is
    ``ScheduleInterleavedZeroBubble`` with one stage per rank (the paper's ZB-H1 / torch's ZB1P),
    "zbv" ``ScheduleZBVZeroBubble`` with two stages per rank in a V. Per schedule: max gradient
    gap to the unsplit model, mean loss (last-stage rank), the schedule's own ``pipeline_order``
    for this rank ("-" an idle slot), the actions it executed, peak live micro-batches per stage."""
    from torch.distributed.pipelining import ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble
    if world_size < 2:
        raise ValueError(f"a pipeline needs at least 2 ranks, got world_size={world_size}")
    c = settings(cfg, PIPELINE_DEFAULTS)
    device = worker_device()
    x, y = random_pair(c.batch, c.width, c.width, c.seed, dtype=torch.float64, device=device)
    full = make_stack(c.width, c.depth, c.seed, head=True).to(torch.float64).to(device)
    F.mse_loss(full(x), y).backward()
    result = {"loss_unsplit": F.mse_loss(full(x), y).item(),
              "grad_scale": max(p.grad.abs().max().item() for p in full.parameters())}
    classes = {"zb_h1": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble}
    for name in ZERO_BUBBLE_SCHEDULES:
        ids = zero_bubble_stages(name, rank, world_size)
        num_stages = len(ids) * world_size
        parts, trace, losses, schedule = _pipeline_step(classes[name], ids, num_stages, c, x, y,
                                                        torch.float64)
        result[name] = {"stages": ids, "grad_diff": _grad_gap(parts, ids, num_stages, full),
                        "loss": torch.stack(losses).mean().item() if losses else None,
                        "order": [str(a) if a is not None else "-" for a in schedule.pipeline_order[rank]],
                        "executed": trace.executed, "peak_microbatches_alive": trace.peak,
                        "peak_on_rank": trace.peak_rank, "alive_after_step": trace.alive()}
        dist.barrier()
    return result


def tensor_parallel_mlp(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Column-then-row MLP vs the unsplit one: outputs, gradients, all-reduces counted.

    Also runs torch's own DTensor version (parallelize_module with ColwiseParallel then
    RowwiseParallel) on the same weights and reports whether it agrees.
    """
    c = settings(cfg, TENSOR_PARALLEL_DEFAULTS)
    device = worker_device()
    full = make_transformer_mlp(c.hidden, c.seed).to(device)
    x, target = random_pair(c.batch, c.hidden, c.hidden, c.seed + 1, device=device)
    x_full = x.clone().requires_grad_()
    y_full = full(x_full)
    F.mse_loss(y_full, target).backward()

    tp = ColumnRowMLP(full, rank, world_size).to(device)
    x_tp = x.clone().requires_grad_()
    with CollectiveCounter() as comm:
        y_tp = tp(x_tp)
        forward_calls = comm.calls["all_reduce"]
        F.mse_loss(y_tp, target).backward()
    part = tp.part
    unsplit = {"w1": full[0].weight.grad, "b1": full[0].bias.grad, "w2": full[2].weight.grad,
               "b2": full[2].bias.grad, "x": x_full.grad}
    grad_diffs = {
        "w1": (tp.w1.grad - unsplit["w1"][part]).abs().max().item(),
        "b1": (tp.b1.grad - unsplit["b1"][part]).abs().max().item(),
        "w2": (tp.w2.grad - unsplit["w2"][:, part]).abs().max().item(),
        "b2": (tp.b2.grad - unsplit["b2"]).abs().max().item(),
        "x": (x_tp.grad - unsplit["x"]).abs().max().item()}
    # the unsplit gradients' size, per tensor: the gaps are judged against it (a fixed bound would
    # pass a wrong gradient wherever the gradients are small)
    grad_scale = {name: g.abs().max().item() for name, g in unsplit.items()}
    result = {"output_diff": (y_tp - y_full).abs().max().item(), "grad_diff": grad_diffs,
              "grad_scale": grad_scale,
              "allreduce_calls": dict(forward=forward_calls,
                                      backward=comm.calls["all_reduce"] - forward_calls),
              "allreduce_bytes": comm.payload["all_reduce"],
              "predicted_bytes": 2 * c.batch * c.hidden * 4,   # two B×h fp32 all-reduces
              "weights_on_this_rank": sum(p.numel() for p in tp.parameters()),
              "weights_unsplit": sum(p.numel() for p in full.parameters())}
    result["torch_dtensor_output_diff"] = _dtensor_version(full, x, world_size, c.seed, device)
    return result


def _dtensor_version(full, x, world_size, seed, device):
    """torch.distributed.tensor.parallel on a copy of ``full``; max |y - y_full| (or None)."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
    except ImportError:  # pragma: no cover - very old torch
        return None
    copy = make_transformer_mlp(full[0].in_features, seed).to(device)
    copy.load_state_dict(full.state_dict())
    mesh = init_device_mesh(device.type, (world_size,))
    parallelize_module(copy, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    with torch.no_grad():
        y = copy(x)
        return (y - full(x)).abs().max().item()


def _attention_unsplit(q, k, v, causal):
    """softmax(q kᵀ/√d) v written out (the reference autograd differentiates)."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def context_parallel(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Ring attention on this rank's part of a fp64 sequence vs unsplit attention, per arm
    (full, causal, causal zig-zag): max |difference| of output and dQ/dK/dV, kept-for-backward
    bytes of the split and of the same Function on one unsplit process, bytes sent, score blocks
    (the ring's counter and the formula's) and the matmul FLOPs the ledger counts on this rank."""
    c = settings(cfg, CONTEXT_DEFAULTS)
    device, ring = worker_device(), Ring.of()
    generator = torch.Generator().manual_seed(c.seed)
    q, k, v, weight = (torch.randn(c.batch, c.sequence, c.dim, dtype=torch.float64,
                                   generator=generator).to(device) for _ in range(4))
    result = {}
    for arm, (causal, zigzag) in CONTEXT_ARMS.items():
        def leaves(*tensors):
            return [t.detach().clone().requires_grad_() for t in tensors]

        def local(x):
            return split_sequence(x, ring, zigzag)

        full = leaves(q, k, v)
        reference = _attention_unsplit(*full, causal)
        (reference * weight).sum().backward()
        mine, counts = leaves(local(q), local(k), local(v)), {}
        with CollectiveCounter() as comm:
            out = ring_attention(*mine, ring, causal=causal, zigzag=zigzag, counts=counts)
            (out * local(weight)).sum().backward()
        gaps = {"output": (out - local(reference)).abs().max().item()}
        for name, ours, theirs in zip("qkv", mine, full):
            gaps[f"d{name}"] = (ours.grad - local(theirs.grad)).abs().max().item()

        def step_record(ring_, *tensors):
            ts = leaves(*tensors)
            return measure(lambda: (ring_attention(*ts[:3], ring_, causal=causal, zigzag=zigzag)
                                    * ts[3]).sum().backward())
        block_bytes = mine[1].numel() * mine[1].element_size()
        split = step_record(ring, local(q), local(k), local(v), local(weight))
        result[arm] = {"gaps": gaps, "sent_bytes": comm.payload["send"], "wire_bytes": comm.wire,
                       "predicted_bytes": ring_bytes_per_step(block_bytes, world_size),
                       "kept_split": split.activation_bytes,
                       "kept_unsplit": step_record(Ring(), q, k, v, weight).activation_bytes,
                       # the ledger's own FLOP count of this rank's forward and backward: work
                       # counted apart from the ring's block counter
                       "flops_split": split.flops,
                       "score_blocks": counts["forward_blocks"],
                       "largest_score_block": counts["largest_score_block"],
                       "most_keys_held": counts["most_keys_held"],
                       "predicted_blocks": score_blocks(rank, world_size, causal, zigzag)}
    return result


pipeline_two_stages.min_world_size = 2      # tools/gpu_check.py skips these on one GPU
pipeline_zero_bubble.min_world_size = 2


def suite(rank: int, world_size: int, cfg: dict | None = None) -> dict:
    """Lesson 09's real runs in one launch: the 2-stage pipeline, the tensor-parallel MLP and
    ring attention (context parallel)."""
    cfg = cfg or {}
    return {"pipeline": pipeline_two_stages(rank, world_size, cfg.get("pipeline")),
            "zero_bubble": pipeline_zero_bubble(rank, world_size, cfg.get("pipeline")),
            "tensor_parallel": tensor_parallel_mlp(rank, world_size, cfg.get("tensor_parallel")),
            "context_parallel": context_parallel(rank, world_size, cfg.get("context_parallel"))}


suite.min_world_size = 2
