"""Hand-written pipeline orders run as written: 1F1B, ZB-H1, ZB-H2 and DeepSeek-V3's DualPipe.

``pipeline.simulate`` lets a greedy rule pick each device's next operation; here each device runs
an explicit list of operations in order, each starting as soon as the device is free and its
inputs have arrived (communication free and instant), with real-valued costs in the notation of
the DeepSeek-V3 report (arXiv 2412.19437, Table 2):

    F    forward of one micro-batch through one stage (1/p of the layers)
    B    the *full* backward of that chunk = B_input + W   (the kit's ``backward``)
    W    its weight-gradient part (nobody downstream waits for it); B_input = B - W
    F&B  one forward chunk and one backward chunk run overlapped (DualPipe's main step)

Bubbles per device, in time units (``Timeline.idle``), as the report states them:

    1F1B      (p-1)(F+B)                 p micro-batches of activations on device 0
    ZB-H1     (p-1)(F+B-2W)              the same peak (W of device d lags d micro-batches)
    DualPipe  (p/2-1)(F&B+B-3W)          2 stages' parameters per device, p+1 activations

ZB-H1/H2 are Qi et al. 2023 ("Zero Bubble Pipeline Parallelism"); ZB-H2 warms up with
2(p-1-d)+1 forwards on device d (about twice 1F1B's memory) and keeps one F, B_input, W per
micro-batch after that. DualPipe (DeepSeek-AI 2024): every device holds stage d of the model for
micro-batches entering at device 0 (direction 0) and stage p-1-d for those entering at device
p-1 (direction 1); the main phase pairs a forward of one direction with a backward of the other,
so one's communication can hide behind the other's computation. Its order follows the eight
steps of deepseek-ai/DualPipe's ``DualPipe.step`` (W's deferred first in, first out).
"""
from __future__ import annotations

from collections import deque

from course_utils import checks
from course_utils.distributed.pipeline import Op, Timeline

ORDERS = ("1f1b", "zb_h1", "zb_h2", "dualpipe")


def report_bubble(schedule: str, devices: int, *, forward: float, backward: float, weight: float,
                  overlapped: float | None = None) -> float:
    """Idle time per device in DeepSeek-V3 Table 2 (B = full backward, W its weight part)."""
    checks.choice(schedule, "schedule", ("1f1b", "zb_h1", "dualpipe"))
    p, f, b, w = devices, forward, backward, weight
    if schedule == "1f1b":
        return (p - 1) * (f + b)
    if schedule == "zb_h1":
        return (p - 1) * (f + b - 2 * w)
    fb = f + b if overlapped is None else overlapped
    return (p // 2 - 1) * (fb + b - 3 * w)


def stage_of(device: int, direction: int, devices: int) -> int:
    """Position along its direction's path of the stage ``device`` runs (DualPipe: d or p-1-d)."""
    return device if direction == 0 else devices - 1 - device


def _zero_bubble_order(p: int, m: int, warmup: int, lag: int, backward_first: bool) -> list[tuple]:
    """``warmup`` forwards, then per micro-batch F and B_input with its W ``lag`` micro-batches
    behind (ZB-H1, F first as 1F1B), or B_input, W, F (ZB-H2, whose longer warm-up already holds
    the next forwards) with W also ``lag`` behind and the last ``lag`` W's left for the tail."""
    order = [("F", 0, j) for j in range(warmup)]
    waiting = deque()
    for i in range(m):
        forward = [("F", 0, warmup + i)] if warmup + i < m else []
        order += ([] if backward_first else forward) + [("I", 0, i)]
        waiting.append(i)
        if lag <= i < (m - lag if backward_first else m):
            order.append(("W", 0, waiting.popleft()))
        order += forward if backward_first else []
    return order + [("W", 0, j) for j in waiting]


def _dualpipe_order(rank: int, p: int, m: int) -> list[tuple]:
    """One device's DualPipe order (the eight steps of ``DualPipe.step``, m/2 per direction).

    "phase 0" is the direction in whose first half this device sits, "phase 1" the other."""
    half, h, n = p // 2, min(rank, p - 1 - rank), m // 2
    flip = int(rank >= half)                      # second-half devices: phase 0 = direction 1
    middle = h == half - 1
    next_f, next_b, deferred, order = [0, 0], [0, 0], deque(), []

    def f(phase):
        order.append(("F", phase ^ flip, next_f[phase]))
        next_f[phase] += 1

    def b(phase, zero_bubble=False):
        direction, j = phase ^ flip, next_b[phase]
        next_b[phase] += 1
        order.append(("I" if zero_bubble else "B", direction, j))
        if zero_bubble:
            deferred.append((direction, j))

    def w():
        order.append(("W", *deferred.popleft()))

    def fb(phase_f, phase_b):                      # one overlapped chunk: F of one, full B of other
        order.append(("FB", (phase_f ^ flip, next_f[phase_f]), (phase_b ^ flip, next_b[phase_b])))
        next_f[phase_f] += 1
        next_b[phase_b] += 1

    for _ in range((half - h - 1) * 2):           # 1: forwards of phase 0 only
        f(0)
    for _ in range(h + 1):                        # 2: both directions' forwards
        f(0)
        f(1)
    for _ in range(half - h - 1):                 # 3: B_input, W, F of phase 1 (zero bubble)
        b(1, zero_bubble=True)
        w()
        f(1)
    for i in range(n - p + h + 1):                # 4: main step, overlapped F&B chunks
        if i == 0 and middle:                     # (the report keeps these two apart)
            f(0)
            b(1)
        else:
            fb(0, 1)
        fb(1, 0)
    for _ in range(half - h - 1):                 # 5
        b(1)
        fb(1, 0)
    zero_bubble = False
    for i in range(h + 1):                        # 6: second half of these backwards defer W
        if i == (h + 1) // 2 and h % 2 == 1:
            zero_bubble = True
        b(1, zero_bubble)
        if i == (h + 1) // 2 and h % 2 == 0:
            zero_bubble = True
        b(0, zero_bubble)
    for _ in range(half - h - 1):                 # 7
        w()
        b(0, zero_bubble=True)
    while deferred:                               # 8: the remaining W's
        w()
    return order


def orders(schedule: str, devices: int, microbatches: int) -> list[list[tuple]]:
    """Per device, the (kind, direction, microbatch) entries it runs in order.

    kind: "F", "B" (full backward), "I" (B_input, its W later), "W", and for DualPipe "FB"
    ((direction, mb) forward, (direction, mb) full backward) run overlapped."""
    p, m = devices, microbatches
    if schedule == "1f1b":
        def one(d):
            warm = min(p - d - 1, m)
            order = [("F", 0, j) for j in range(warm)]
            for i in range(m):
                order += ([("F", 0, warm + i)] if warm + i < m else []) + [("B", 0, i)]
            return order
        return [one(d) for d in range(p)]
    if schedule == "zb_h1":
        return [_zero_bubble_order(p, m, min(p - d - 1, m), lag=d, backward_first=False)
                for d in range(p)]
    if schedule == "zb_h2":
        return [_zero_bubble_order(p, m, min(2 * (p - d - 1) + 1, m), lag=d, backward_first=True)
                for d in range(p)]
    return [_dualpipe_order(d, p, m) for d in range(p)]


def _dependencies(kind: str, direction: int, j: int, device: int, p: int) -> list[tuple]:
    s = stage_of(device, direction, p)
    if kind == "F":
        return [("F", direction, s - 1, j)] if s > 0 else []
    if kind in ("B", "I"):
        return [("F", direction, s, j)] + ([("B", direction, s + 1, j)] if s < p - 1 else [])
    return [("B", direction, s, j)]                          # W after its own B_input


def simulate_order(schedule: str, devices: int, microbatches: int, *, forward: float = 1,
                   backward: float = 2, weight: float = 1, overlapped: float | None = None) -> Timeline:
    """Run ``schedule``'s explicit orders on p devices and m micro-batches; return the Timeline.

    Costs per micro-batch per stage: ``forward`` F, ``backward`` the full B (B_input + W),
    ``weight`` W, ``overlapped`` F&B (default F + B: overlap hides communication, and the
    simulator's communication is free). DualPipe needs p even and m even with m >= 2p (half of
    the micro-batches enter from each end), as deepseek-ai/DualPipe does.
    """
    checks.choice(schedule, "schedule", ORDERS)
    p, m = checks.positive_int(devices, "devices"), checks.positive_int(microbatches, "microbatches")
    for name, value in (("forward", forward), ("backward", backward), ("weight", weight)):
        checks.positive_float(value, name)
    if weight >= backward:
        raise ValueError(f"weight (W={weight}) must be less than the full backward (B={backward}): "
                         "B = B_input + W with B_input > 0")
    overlapped = forward + backward if overlapped is None else checks.positive_float(overlapped, "overlapped")
    if schedule == "dualpipe" and (p % 2 or m % 2 or m < 2 * p):
        raise ValueError(f"DualPipe needs an even number of devices and an even m >= 2p "
                         f"(half the micro-batches from each end), got p={p}, m={m}")
    cost = {"F": forward, "B": backward, "I": backward - weight, "W": weight, "FB": overlapped}
    timeline = Timeline(schedule, p, m, 1)
    todo = [deque(o) for o in orders(schedule, p, m)]
    done: dict[tuple, float] = {}                 # (kind F|B|W, direction, stage, mb) -> end
    free = [0.0] * p
    progress = True
    while progress:
        progress = False
        for d in range(p):
            while todo[d]:
                kind, *what = todo[d][0]
                parts = ([("F", *what[0]), ("B", *what[1])] if kind == "FB" else [(kind, *what)])
                needs = [dep for part in parts for dep in _dependencies(*part, d, p)]
                if any(dep not in done for dep in needs):
                    break
                start = max([free[d]] + [done[dep] for dep in needs])
                end = start + cost[kind]
                for part_kind, direction, j in parts:
                    op_kind = "B" if part_kind == "I" else part_kind
                    done[(op_kind, direction, stage_of(d, direction, p), j)] = end
                    timeline.ops.append(Op(op_kind, d, j, 0, start, end, direction))
                free[d] = end
                todo[d].popleft()
                progress = True
    if any(todo):
        raise RuntimeError(f"{schedule} deadlocked: an operation waits for one never scheduled")
    return timeline
