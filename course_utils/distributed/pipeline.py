"""Pipeline parallel: a schedule simulator, then a real 2-stage pipeline (lesson 09).

p devices each hold one stage (a slice of the layers); the batch is cut into m micro-batches.
A stage can only run micro-batch j's forward after the previous stage has, and its backward after
the next stage has: the idle time is the *bubble*. Costs in time units: F (forward of one
micro-batch on one stage), B (backward), and for zero-bubble schedules B is split into
B_input (gradient w.r.t. the stage input, on the critical path) and W (weight gradient, which
nobody downstream waits for, so it can fill idle slots).

    GPipe  all F, then all B          bubble = (p-1)/(m+p-1)      activations held: m
    1F1B   warm-up, then alternate    bubble = (p-1)/(m+p-1)      activations held: p - stage
    interleaved 1F1B, v chunks/device bubble = (p-1)/(v·m+p-1)    (more point-to-point traffic)
    zero-bubble (B/W split)           W fills idle slots: bubble (p-1)(F+B_in-W) per device once a
                                      device may hold a little more than 1F1B's p micro-batches
                                      until their W (p+1 at p=4, p+2 at p=8 for the greedy rule;
                                      lesson 09 sweeps it); at 1F1B's p, a smaller gain

``simulate`` executes a schedule tick by tick (integer costs): each device, when idle, starts the
next operation its schedule allows whose inputs are ready. ``stage_slice`` cuts a Sequential into
the stages a real pipeline (torch.distributed.pipelining) runs; the lesson's experiment with it is
in ``course_utils.experiments.pipeline_tensor_parallel``, the Gantt chart in
``course_utils.plots.plot_timeline``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn as nn

from course_utils import checks

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")


@dataclass
class Op:
    kind: str      # "F", "B" (full backward, or B_input when split) or "W" (weight gradient)
    device: int
    microbatch: int
    chunk: int = 0  # virtual stage = chunk · p + device (interleaved); 0 otherwise
    start: float = -1
    end: float = -1
    direction: int = 0  # DualPipe: 0 enters at device 0, 1 at device p-1 (pipeline_orders)


@dataclass
class Timeline:
    schedule: str
    devices: int
    microbatches: int
    chunks: int
    ops: list[Op] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(op.end for op in self.ops)

    def busy(self, device: int) -> float:
        """Time ``device`` computes: the union of its ops' intervals (an overlapped F&B chunk is
        two ops sharing one interval, counted once)."""
        busy, reach = 0, float("-inf")
        for start, end in sorted((op.start, op.end) for op in self.ops if op.device == device):
            busy += max(end - max(start, reach), 0)
            reach = max(reach, end)
        return busy

    def idle(self, device: int) -> float:
        """Bubble of ``device`` in time units: makespan - busy (DeepSeek-V3 Table 2's "bubble")."""
        return self.makespan - self.busy(device)

    @property
    def bubble_fraction(self) -> float:
        """Idle device-time / total device-time = 1 - Σ busy / (p · makespan)."""
        return 1 - sum(self.busy(d) for d in range(self.devices)) / (self.devices * self.makespan)

    def peak_activations(self, device: int) -> float:
        """Most micro-batch activations held at once on ``device`` (a chunk holds 1/v of one).

        Held from the start of F until the end of its backward (of its W when that micro-batch's
        B/W are split: the weight gradient still needs the layer inputs)."""
        mine = [op for op in self.ops if op.device == device]
        split = {(op.chunk, op.direction, op.microbatch) for op in mine if op.kind == "W"}
        events = []
        for op in mine:
            key = (op.chunk, op.direction, op.microbatch)
            if op.kind == "F":
                events.append((op.start, 1 / self.chunks))
            elif op.kind == ("W" if key in split else "B"):
                events.append((op.end, -1 / self.chunks))
        held = peak = 0.0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # frees before allocs at a tie
            held += delta
            peak = max(peak, held)
        return peak


def bubble_formula(devices: int, microbatches: int, chunks: int = 1) -> float:
    """(p-1)/(v·m + p - 1): GPipe and 1F1B with v = 1, interleaved 1F1B with v chunks."""
    return (devices - 1) / (chunks * microbatches + devices - 1)


def _orders(schedule: str, p: int, m: int, v: int) -> list[list[tuple]]:
    """Per device, the ordered list of (kind, microbatch, chunk) it executes."""
    orders = []
    for d in range(p):
        if schedule == "gpipe":
            order = [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
        elif schedule == "1f1b":
            warm = min(p - d - 1, m)
            order = [("F", j, 0) for j in range(warm)]
            for i in range(m - warm):
                order += [("F", warm + i, 0), ("B", i, 0)]
            order += [("B", j, 0) for j in range(m - warm, m)]
        elif schedule == "interleaved":
            total = m * v

            def fwd(k):  # Megatron order: p micro-batches through chunk 0, then chunk 1, ...
                return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

            def bwd(k):
                return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)
            warm = min((p - d - 1) * 2 + (v - 1) * p, total)
            order = [fwd(k) for k in range(warm)]
            for i in range(total - warm):
                order += [fwd(warm + i), bwd(i)]
            order += [bwd(k) for k in range(total - warm, total)]
        else:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        orders.append(order)
    return orders


def zero_bubble_formula(devices: int, microbatches: int, forward: int = 1, backward: int = 2) -> float:
    """Bubble of the B/W split when W may be deferred freely: idle (p-1)(F+B_in-W) per device.
    The simulator reaches it for an even ``backward`` (W = B_in) with W <= F (ZB-H1's condition)
    and enough micro-batches (m >= 2p; lesson 09 finds the smallest cap); an odd one makes
    W = B_in + 1, and then the idle time stays at the (p-1)F floor of one synchronised iteration.

    fraction = (p-1)(F+B_in-W) / ((p-1)(F+B_in-W) + m(F+B_in+W)), with B_in = backward//2."""
    b_in, w = backward // 2, backward - backward // 2
    idle = (devices - 1) * max(forward + b_in - w, 0)
    return idle / (idle + microbatches * (forward + b_in + w))


def simulate(schedule: str, devices: int, microbatches: int, *, forward: int = 1,
             backward: int = 2, chunks: int = 2, max_in_flight: int | str | None = None) -> Timeline:
    """Run ``schedule`` on p=devices stages and m micro-batches; return the Timeline.

    forward, backward: integer time units per micro-batch per stage (for interleaved, per device
    over all its chunks: each chunk costs 1/v of it). zero_bubble splits backward into
    B_input = backward // 2 and W = backward - B_input. chunks: v, used only by interleaved.
    max_in_flight (zero_bubble only): cap on micro-batches whose activations a device holds;
    None = no cap; "1f1b" = p - d (1F1B's memory: a smaller gain). A cap a little above p
    (p + 1 at p = 4, m = 16; lesson 09 finds the smallest) reaches ``zero_bubble_formula``; more
    memory buys nothing.
    """
    checks.choice(schedule, "schedule", SCHEDULES)
    p, m = devices, microbatches
    for name, value in (("devices", p), ("microbatches", m), ("forward", forward),
                        ("backward", backward), ("chunks", chunks)):
        checks.positive_int(value, name)
    v = chunks if schedule == "interleaved" else 1
    if schedule == "interleaved":
        if m % p:
            raise ValueError(f"interleaved 1F1B needs microbatches divisible by devices, got m={m}, p={p}")
        if forward % v or backward % v:
            raise ValueError(f"interleaved: forward and backward must divide by chunks={v}")
    if schedule == "zero_bubble" and backward < 2:
        raise ValueError("zero_bubble splits backward into B and W: pass backward >= 2")
    if max_in_flight not in (None, "1f1b"):
        checks.positive_int(max_in_flight, "max_in_flight", hint="or None (no cap), or '1f1b'")
    cost = {"F": forward // v, "B": backward // v}
    if schedule == "zero_bubble":
        cost = {"F": forward, "B": backward // 2, "W": backward - backward // 2}
    stages = p * v                                    # virtual stages
    done: dict[tuple, int] = {}                       # (kind, virtual stage, mb) -> end tick
    timeline = Timeline(schedule, p, m, v)
    pending = ([list(o) for o in _orders(schedule, p, m, v)] if schedule != "zero_bubble"
               else [[(k, j, 0) for j in range(m) for k in ("F", "B", "W")] for _ in range(p)])
    free_at = [0] * p

    def ready(kind, j, chunk, d, t):
        s = chunk * p + d                              # virtual stage of this op
        if kind == "F":
            return s == 0 or done.get(("F", s - 1, j), t + 1) <= t
        if kind == "B":
            after = ("F", s, j) if s == stages - 1 else ("B", s + 1, j)
            return done.get(("F", s, j), t + 1) <= t and done.get(after, t + 1) <= t
        return done.get(("B", s, j), t + 1) <= t      # W after its own B_input

    def pick(d, t):
        if schedule != "zero_bubble":
            head = pending[d][0] if pending[d] else None
            return head if head and ready(*head, d, t) else None
        # Zero-bubble, greedy: critical-path B first; then F (unless the memory cap is reached);
        # a deferred W fills any slot left.
        cap = p - d if max_in_flight == "1f1b" else (max_in_flight or m)
        in_flight = sum(1 for (k, s, _) in done if k == "F" and s == d) - \
            sum(1 for (k, s, _) in done if k == "W" and s == d)
        candidates = [op for op in pending[d] if ready(*op, d, t)]
        for kind in ("B", "F", "W"):
            for op in candidates:
                if op[0] == kind and (kind != "F" or in_flight < cap):
                    return op
        return None

    t = 0
    while any(pending):
        for d in range(p):
            if free_at[d] > t or not pending[d]:
                continue
            op = pick(d, t)
            if op is None:
                continue
            kind, j, chunk = op
            pending[d].remove(op)
            end = t + cost[kind]
            done[(kind, chunk * p + d, j)] = end
            free_at[d] = end
            timeline.ops.append(Op(kind, d, j, chunk, t, end))
        t += 1
        if t > 100 * (m + p) * (forward + backward):
            raise RuntimeError(f"{schedule} deadlocked: an operation waits for one never scheduled")
    return timeline


# ---------------------------------------------------------------------------------------------
# The real thing: the stages torch.distributed.pipelining runs
# ---------------------------------------------------------------------------------------------
def stage_slice(model: nn.Sequential, rank: int, world_size: int) -> nn.Sequential:
    """Contiguous block of layers for ``rank``: stage r gets layers [r·L/n, (r+1)·L/n)."""
    bounds = [round(i * len(model) / world_size) for i in range(world_size + 1)]
    return model[bounds[rank]:bounds[rank + 1]]
