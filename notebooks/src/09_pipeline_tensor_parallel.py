# %% [markdown]
# # 09 · Pipeline and tensor parallel: split the model, not the batch
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/09_pipeline_tensor_parallel.ipynb)
#
# Lessons 07–08 split the batch and the resident state. Here the model itself is cut: by layers
# across devices (pipeline parallel, which costs idle time — *bubbles*) or inside each layer's
# matrices (tensor parallel, which costs an all-reduce per column→row pair of layers, in forward
# and again in backward). A schedule simulator checks
# the bubble formulas, down to DeepSeek-V3's bidirectional DualPipe; then both splits run for real
# on two ranks and must give the unsplit model's gradients. Last, the sequence itself is split
# (context parallel, ring attention), for inputs too long for one device's activations.

# %%
# On Colab, install the kit with one pip command (Colab's own torch is kept); elsewhere this does nothing.
# Scale: a GPU runtime runs SCALE="gpu", any other "default"; to choose, run %env COURSE_SCALE=ci first.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "git+https://github.com/training-ledger/course-kit.git@main"], check=True)

# %% tags=["parameters"]
import os
from course_utils.scales import auto_scale
SCALE = os.environ.get("COURSE_SCALE") or auto_scale()  # "gpu" on a CUDA runtime, else "default"
STUDENT_ID = os.environ.get("COURSE_STUDENT_ID", "")  # your name or ID: your exercises' numbers are drawn from it

# %%
import matplotlib.pyplot as plt

from course_utils.distributed import launch
from course_utils.distributed import context_parallel
from course_utils.distributed import pipeline
from course_utils.distributed import pipeline_orders
from course_utils.distributed.tensor_parallel import ColumnRowMLP
from course_utils.experiments import pipeline_tensor_parallel as lesson
from course_utils.exercises import check_close, check_equal
from course_utils.plots import plot_bars, plot_timeline
from course_utils.report import headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config

cfg = config(
    SCALE,
    ci=dict(seed=0, ranks=2, stages=4, microbatches=[1, 2, 4, 8], sweep_stages=[2, 4],
            real=dict(pipeline=dict(width=32, depth=4, batch=16, microbatches=4),
                      tensor_parallel=dict(hidden=32, batch=8),
                      context_parallel=dict(batch=2, sequence=32, dim=16))),
    default=dict(seed=0, ranks=2, stages=4, microbatches=[1, 2, 4, 8, 16, 32, 64],
                 sweep_stages=[2, 4, 8],
                 real=dict(pipeline=dict(width=128, depth=8, batch=64, microbatches=8),
                           tensor_parallel=dict(hidden=128, batch=32),
                           context_parallel=dict(batch=4, sequence=256, dim=32))),
    gpu=dict(seed=0, ranks=2, stages=4, microbatches=[1, 2, 4, 8, 16, 32, 64],
             sweep_stages=[2, 4, 8],
             real=dict(pipeline=dict(width=512, depth=8, batch=128, microbatches=8),
                       tensor_parallel=dict(hidden=512, batch=64),
                       context_parallel=dict(batch=8, sequence=2048, dim=64))),
)
device = setup(SCALE, seed=cfg.seed)
print(device, "| simulated stages:", cfg.stages)

# %% [markdown]
# ## 1 · The problem: a model too big for one device, even sharded
#
# ZeRO-3 (lesson 08) gathers each layer's full parameters when it runs, and keeps every
# activation of the local batch. When one layer's matrices, or one device's activations, are
# already too much, the computation itself has to be divided: by layers (**pipeline**) or inside
# each matrix product (**tensor parallel**). Neither changes the arithmetic — the gradients equal
# the unsplit model's up to fp32 rounding (asserted below 1e-6 of their scale) — and both have
# a price the ledger must show: idle devices, or all-reduces (one in forward and one in backward
# per column→row pair: two per transformer block in forward, attention and MLP, four per step).

# %% [markdown]
# ## 2 · The mechanism
#
# **Pipeline.** p devices hold one stage each (consecutive layers). The batch is cut into m
# micro-batches; stage s can run micro-batch j's forward F only after stage s−1 has, and its
# backward B only after stage s+1 has. A schedule is the order each device runs its F and B:
#
# - **GPipe**: all forwards, then all backwards. Every device idles (p−1)(F+B) in total, so the
#   bubble fraction is (p−1)/(m+p−1), and each device holds all m micro-batches' activations.
# - **1F1B**: after p−s−1 warm-up forwards, alternate one F and one B. Same bubble, but a stage
#   holds at most p−s micro-batches.
# - **Interleaved 1F1B**: each device holds v non-consecutive chunks; bubble (p−1)/(v·m+p−1),
#   paid in more point-to-point messages (v× as many, Narayanan et al. 2021 §2.2; not measured
#   here) and in memory: the first stage holds p·(1 + (p−1)/(p·v)) micro-batches' activations
#   instead of 1F1B's p (Korthikanti et al. 2022; the simulator's peaks, printed below).
# - **Zero bubble**: split B into B_input (gradient for the previous stage, on the critical path)
#   and W (weight gradient, nobody waits for it). W can fill idle slots.
# - **DualPipe** (DeepSeek-V3): every device holds two stages, d and p−1−d; half the
#   micro-batches enter at device 0, half at device p−1, so both ends of the pipe start at once.
#   In the main phase a device runs a forward of one direction overlapped with a backward of the
#   other (an "F&B" chunk): one's all-to-all and pipeline sends hide behind the other's compute.
#
# **Context parallel (ring attention).** A sequence of S tokens is cut across n ranks. Attention
# needs every query against every key, so key/value blocks travel round a ring while each rank
# folds one block at a time into its output with an *online softmax* (a running log-sum-exp), so
# no rank ever holds an S×S score matrix: the largest score block is one query chunk against one
# key chunk. While it computes, a rank holds its own K/V block and the visiting one, 2S/n keys:
# all of them at n = 2, a shrinking share as n grows. The backward runs the ring again, each K/V
# block travelling with its dK/dV accumulator.
#
# **Tensor parallel (Megatron).** An MLP y = GeLU(x W1ᵀ) W2ᵀ splits W1 by rows (output units,
# "column parallel") and W2 by the matching columns ("row parallel"). GeLU acts per unit, so
# each rank computes its slice of the hidden layer alone; the two halves of y are partial sums,
# added by **one all-reduce** in forward, and one more for the input gradient in backward.

# %% [markdown]
# ## 3 · Worked example: four schedules on four stages
#
# Unit costs F = 1, B = 2 (backward is about twice forward). Throughout the lesson B is the
# *full* backward of a micro-batch; zero bubble splits it as B = B_input + W, here B_input = W = 1.
# Interleaved uses v = 2 chunks per device, each chunk costing what a whole stage costs in the
# other arms (F = 1, B = 2 per chunk): its devices do twice the work, as a model twice as deep
# would, so compare its bubble *fraction* with the others', not its timeline's length.

# %%
p, m = cfg.stages, 8
timelines = {
    "gpipe": pipeline.simulate("gpipe", p, m),
    "1f1b": pipeline.simulate("1f1b", p, m),
    "interleaved": pipeline.simulate("interleaved", p, m, forward=2, backward=4, chunks=2),
    "zero_bubble": pipeline.simulate("zero_bubble", p, m),
    "zero_bubble (1F1B memory)": pipeline.simulate("zero_bubble", p, m, max_in_flight="1f1b"),
}
fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.0 * len(timelines)))
for ax, (name, t) in zip(axes, timelines.items()):
    plot_timeline(t, ax)
    ax.set_title(f"{name}: bubble {t.bubble_fraction:.1%}, peak activations on device 0: "
                 f"{t.peak_activations(0):g} micro-batches", fontsize=9)
plt.tight_layout()
plt.show()
formulas = {"gpipe": pipeline.bubble_formula(p, m), "1f1b": pipeline.bubble_formula(p, m),
            "interleaved": pipeline.bubble_formula(p, m, chunks=2), "zero_bubble": pipeline.zero_bubble_formula(p, m)}
show_table([{"schedule": name, "bubble (simulated)": t.bubble_fraction,
             "bubble (formula)": formulas.get(name, "none: greedy under a cap"),
             "peak activations per stage": [t.peak_activations(d) for d in range(p)]}
            for name, t in timelines.items()])

# %% [markdown]
# How much memory does zero bubble need? The simulator holds a micro-batch's activations from its
# F until its W (the weight gradient still needs the layer inputs), and its greedy zero-bubble
# schedule takes a cap on how many micro-batches a device may hold. Sweep the cap on p = 4
# stages and m = 16 micro-batches, from 1F1B's p up to 2p − 1 (ZB-H2's peak in Qi et al.), and
# find the smallest cap at which the bubble reaches the formula:

# %%
zb_m = 16
caps = {f"cap {c}" + (" (1F1B's peak p)" if c == p else " (2p − 1)" if c == 2 * p - 1 else ""): c
        for c in range(p, 2 * p)}
caps["no cap (up to m)"] = None
zb = {name: pipeline.simulate("zero_bubble", p, zb_m, max_in_flight=cap) for name, cap in caps.items()}
zb_formula = pipeline.zero_bubble_formula(p, zb_m)
zb_min_cap = min(c for name, c in caps.items()
                 if c is not None and abs(zb[name].bubble_fraction - zb_formula) < 1e-12)
print(f"smallest cap that reaches (p−1)(F+B_input−W): {zb_min_cap} micro-batches = p + {zb_min_cap - p} "
      f"(1F1B holds p = {p}; 2p − 1 = {2 * p - 1})")
show_table([{"cap on held micro-batches": name, "bubble": t.bubble_fraction,
             "(p−1)(F+B_input−W) formula": zb_formula, "1F1B bubble": pipeline.bubble_formula(p, zb_m),
             "peak held (device 0)": t.peak_activations(0)} for name, t in zb.items()])

# %% [markdown]
# The formula (p−1)(F+B_input−W) idle per device is reached with only a little more than 1F1B's
# activations (the smallest cap printed above), well under 2p and far under GPipe's m: letting
# W wait longer buys nothing more, *for this greedy rule*, which starts forwards as soon as the
# cap allows. At
# 1F1B's peak (cap p), W still fills part of 1F1B's bubble, and the gain is smaller. The paper's
# hand-written ZB-H1 (Qi et al., 2023) does better at that same peak by choosing *which* W to
# delay: device d lets its W's lag d micro-batches behind. The next section writes that order out
# and it reaches (p−1)(F+B_input−W) holding p micro-batches, in this same accounting (held until W).

# %% [markdown]
# **Hand-written orders: 1F1B, ZB-H1, ZB-H2 and DualPipe at the same p and m.** Here every device
# runs an explicit list of operations in order (`pipeline_orders.simulate_order`), each starting
# as soon as the device is free and its inputs have arrived. Costs are in the DeepSeek-V3 report's
# own notation (its Table 2): **F** a forward chunk, **B** the *full* backward of that chunk
# (the kit's `backward`, B_input + W), **W** its weight-gradient part (so the kit's B_input is
# B − W), and **F&B** one forward and one backward chunk run overlapped. The report's bubbles per
# device: 1F1B (p−1)(F+B); ZB-H1 (p−1)(F+B−2W), which is (p−1)(F+B_input−W); DualPipe
# (p/2−1)(F&B+B−3W). The report lists no ZB-H2; the column gives Qi et al.'s own figure for it,
# (p−1)(F+B_input−2W), which assumes what the paper calls post-validation: the synchronisation
# before the optimizer step is bypassed, so the next iteration's forwards fill the pipe's edges.
# The simulator runs one iteration with that synchronisation, so it cannot reach that figure (the
# cell after the boundary shows where the order does gain). With communication free, overlapping
# buys nothing: F&B = F + B.

# %%
costs = dict(forward=1, backward=2, weight=1)          # F = 1, B = 2, W = 1 (B_input = 1)
# Qi et al. (2023) give ZB-H2 an idle time of (p−1)(T_F + T_B − 2·T_W), their T_B being our B_input,
# with 2p − 1 micro-batches held and the optimizer step's synchronisation bypassed
zb_h2_published = (p - 1) * max(costs["forward"] + (costs["backward"] - costs["weight"]) - 2 * costs["weight"], 0)
dp_m = 2 * p                                           # DualPipe needs m even and >= 2p
orders = {s: pipeline_orders.simulate_order(s, p, dp_m, **costs) for s in pipeline_orders.ORDERS}
fig, axes = plt.subplots(len(orders), 1, figsize=(11, 2.0 * len(orders)))
for ax, (name, t) in zip(axes, orders.items()):
    plot_timeline(t, ax)
    ax.set_title(f"{name}: idle {t.idle(0):g} per device, peak activations "
                 f"{max(t.peak_activations(d) for d in range(p)):g} (hatched: second direction; "
                 f"half-height pairs: overlapped F&B)", fontsize=9)
plt.tight_layout()
plt.show()
stages_held = {s: max(len({(op.direction, pipeline_orders.stage_of(op.device, op.direction, p))
                           for op in t.ops if op.device == d}) for d in range(p)) for s, t in orders.items()}
show_table([{"schedule": s, "idle per device (simulated)": [t.idle(d) for d in range(p)],
             "published formula": pipeline_orders.report_bubble(s, p, **costs) if s != "zb_h2" else zb_h2_published,
             "peak activations per device": [t.peak_activations(d) for d in range(p)],
             "stages (parameters) per device": stages_held[s]} for s, t in orders.items()])

# %% [markdown]
# DualPipe halves the number of devices that wait for the pipe to fill, so its bubble has p/2−1
# where the others have p−1; the price is two stages' parameters per device and p+1 micro-batches
# of activations at peak. The same check with an overlapped chunk cheaper than F+B (F&B = 4 with
# F = 2, B = 3, W = 1), where devices differ and the formula is the worst device's bubble:

# %%
overlap_costs = dict(forward=2, backward=3, weight=1, overlapped=4)
dual_overlap = pipeline_orders.simulate_order("dualpipe", 8, 16, **overlap_costs)
print("p = 8, m = 16, F&B = 4: idle per device", [dual_overlap.idle(d) for d in range(8)],
      "| formula", pipeline_orders.report_bubble("dualpipe", 8, **overlap_costs))

# %% [markdown]
# ## 4 · The evidence
#
# The simulator is an independent check of the formula: it knows nothing but dependencies and
# per-device order. Bubble vs micro-batches, simulated (dots) against (p−1)/(m+p−1) (lines):

# %%
sweep = {}
for s in ("gpipe", "1f1b"):
    for p_ in cfg.sweep_stages:
        for m_ in cfg.microbatches:
            sweep[(s, p_, m_)] = pipeline.simulate(s, p_, m_).bubble_fraction
fig, ax = plt.subplots(figsize=(6, 3.5))
for p_ in cfg.sweep_stages:
    ax.plot(cfg.microbatches, [pipeline.bubble_formula(p_, m_) for m_ in cfg.microbatches], label=f"formula p={p_}")
    ax.plot(cfg.microbatches, [sweep[("gpipe", p_, m_)] for m_ in cfg.microbatches], "o", color="k", ms=4)
ax.set_xscale("log", base=2)
ax.set_xlabel("micro-batches m")
ax.set_ylabel("bubble fraction")
ax.set_title("GPipe / 1F1B: simulated (dots) vs (p−1)/(m+p−1)")
ax.legend()
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
for (s, p_, m_), bubble in sweep.items():
    assert abs(bubble - pipeline.bubble_formula(p_, m_)) < 1e-12, (s, p_, m_, bubble)
t = timelines
assert abs(t["interleaved"].bubble_fraction - pipeline.bubble_formula(p, m, chunks=2)) < 1e-12
# interleaving's memory price on the first stage, in micro-batches (Korthikanti et al. 2022)
assert t["interleaved"].peak_activations(0) == p * (1 + (p - 1) / (p * 2)), t["interleaved"].peak_activations(0)
assert abs(t["zero_bubble"].bubble_fraction - pipeline.zero_bubble_formula(p, m)) < 1e-12
assert t["zero_bubble"].bubble_fraction <= t["zero_bubble (1F1B memory)"].bubble_fraction < t["1f1b"].bubble_fraction
assert [t["gpipe"].peak_activations(d) for d in range(p)] == [m] * p
assert [t["1f1b"].peak_activations(d) for d in range(p)] == [p - d for d in range(p)]
assert [t["zero_bubble (1F1B memory)"].peak_activations(d) for d in range(p)] == [p - d for d in range(p)]
# Zero bubble's memory price (p = 4, m = 16): a little more than 1F1B's p, well under 2p. Every
# cap from the smallest one up reaches the formula, one less does not, and no cap buys nothing.
assert p < zb_min_cap <= p + 2 and zb_min_cap < 2 * p - 1
assert all(abs(zb[n].bubble_fraction - zb_formula) < 1e-12 for n, c in caps.items() if c is None or c >= zb_min_cap)
assert zb[next(n for n, c in caps.items() if c == zb_min_cap - 1)].bubble_fraction > zb_formula + 1e-9
assert zb_formula < zb[next(n for n, c in caps.items() if c == p)].bubble_fraction < pipeline.bubble_formula(p, zb_m)
assert zb[next(n for n, c in caps.items() if c == p)].peak_activations(0) == p
# Hand-written orders vs DeepSeek-V3 Table 2, in the report's notation, on every device.
for s in ("1f1b", "zb_h1", "dualpipe"):
    assert all(orders[s].idle(d) == pipeline_orders.report_bubble(s, p, **costs) for d in range(p)), s
assert [orders["zb_h1"].peak_activations(d) for d in range(p)] == [p] * p           # 1F1B's peak
assert max(orders["zb_h2"].peak_activations(d) for d in range(p)) == 2 * p - 1
assert [orders["dualpipe"].peak_activations(d) for d in range(p)] == [p + 1] * p    # PP + 1
assert stages_held["dualpipe"] == 2 and stages_held["1f1b"] == 1                   # 2x parameters
assert orders["dualpipe"].idle(0) < orders["zb_h1"].idle(0) < orders["1f1b"].idle(0)
assert max(dual_overlap.idle(d) for d in range(8)) == pipeline_orders.report_bubble("dualpipe", 8, **overlap_costs)

# %% [markdown]
# **The real thing.** `torch.distributed.pipelining` on two ranks: rank 0 holds the first half of
# a deep MLP as a `PipelineStage`, rank 1 the second; `ScheduleGPipe` and `Schedule1F1B` run
# m micro-batches and send activations (forward) and their gradients (backward) between ranks.
# The worker builds each rank's `PipelineStage` and schedule; the tensor-parallel layer below it
# is the whole of Megatron's MLP split (`copy_to_ranks` is f, `sum_from_ranks` is g).
# Then the Megatron MLP on the same two ranks, with its all-reduces counted; and torch's own
# DTensor version (`ColwiseParallel` then `RowwiseParallel`) as a cross-check.
#
# The memory claim of section 2 (GPipe holds m micro-batches on every stage, 1F1B p − s on stage
# s) is measured here, not assumed: `StageTrace` wraps the schedule's step in
# `torch.autograd.graph.saved_tensors_hooks`, tags every tensor autograd saves for backward with
# the stage and micro-batch whose forward saved it (parameters left out), and sees it die when
# autograd frees it. A micro-batch is *alive* on a stage while any of its saved tensors is.

# %%
import inspect
print(inspect.getsource(lesson.pipeline_two_stages))
print(inspect.getsource(ColumnRowMLP))

# %%
real = launch(lesson.suite, cfg.ranks, cfg.real, timeout=300)
real_m = cfg.real["pipeline"]["microbatches"]
simulated_peak = {s: [pipeline.simulate(s, cfg.ranks, real_m).peak_activations(d) for d in range(cfg.ranks)]
                  for s in ("gpipe", "1f1b")}
show_table([{"rank": r, "schedule": s, "params on stage": real[r]["pipeline"][s]["params_on_this_stage"],
             "max |grad − unsplit|": real[r]["pipeline"][s]["grad_diff"],
             "loss": real[r]["pipeline"][s]["loss"],
             "peak micro-batches alive (measured)": real[r]["pipeline"][s]["peak_microbatches_alive"],
             "(simulator)": simulated_peak[s][r]} for r in range(cfg.ranks) for s in ("gpipe", "1f1b")])
tpr = real[0]["tensor_parallel"]
print(f"tensor parallel: max |y − y_unsplit| {tpr['output_diff']:.1e}, max grad gap "
      f"{max(tpr['grad_diff'].values()):.1e}, all-reduces {tpr['allreduce_calls']}, "
      f"{tpr['allreduce_bytes']} bytes (predicted {tpr['predicted_bytes']}); weights on this rank "
      f"{tpr['weights_on_this_rank']} of {tpr['weights_unsplit']}; torch DTensor gap {tpr['torch_dtensor_output_diff']}")

# %%
# NBVAL_CHECK_OUTPUT
for r in real:
    for s in ("gpipe", "1f1b"):
        assert r["pipeline"][s]["grad_diff"] < 1e-6 * r["pipeline"]["grad_scale"]   # relative to their scale
    x = r["tensor_parallel"]
    assert x["output_diff"] < 1e-5
    assert all(x["grad_diff"][k] < 1e-6 * max(x["grad_scale"][k], 1e-12) for k in x["grad_diff"]), \
        (x["grad_diff"], x["grad_scale"])   # relative to each unsplit gradient's size
    assert x["allreduce_calls"] == {"forward": 1, "backward": 1} and x["allreduce_bytes"] == x["predicted_bytes"]
    assert x["torch_dtensor_output_diff"] is None or x["torch_dtensor_output_diff"] < 1e-5
for s in ("gpipe", "1f1b"):   # both schedules compute the unsplit model's loss
    assert abs(real[-1]["pipeline"][s]["loss"] - real[-1]["pipeline"]["loss_unsplit"]) < 1e-5, s
# 1F1B's memory, measured: live micro-batches per stage equal the simulator's, exactly (m; p − s)
for s in ("gpipe", "1f1b"):
    assert [r["pipeline"][s]["peak_microbatches_alive"] for r in real] == simulated_peak[s], s
    assert all(r["pipeline"][s]["alive_after_step"] == 0 for r in real)

# %% [markdown]
# **Zero bubble, for real.** torch ships the paper's schedules. `ScheduleInterleavedZeroBubble`
# with one stage per rank is ZB-H1 (torch's "ZB1P"); `ScheduleZBVZeroBubble` is ZB-V, which puts
# two stages on each rank in a V (rank 0 holds the first and the last stage, rank 1 the middle
# two). Both split each backward into **I** (`backward_one_chunk(full_backward=False)`: the
# gradient the previous stage waits for) and **W** (`backward_weight_one_chunk`: the weight
# gradient, run later). The same launch ran one step of each in float64 on the two ranks; the
# trace recorded every action each rank executed and its live activations.

# %%
print(inspect.getsource(lesson.zero_bubble_stages))
print(inspect.getsource(lesson._pipeline_step))
zbr = {r: real[r]["zero_bubble"] for r in range(cfg.ranks)}


def action_names(actions):
    """("F", stage, mb) tuples as torch writes actions: 1F0 = stage 1, forward, micro-batch 0."""
    return [f"{stage}{kind}{mb}" for kind, stage, mb in actions]


simulated_h1 = [action_names((k, r, j) for k, _, j in order)      # one stage per device: stage = rank
                for r, order in enumerate(pipeline_orders.orders("zb_h1", cfg.ranks, real_m))]
show_table([{"rank": r, "simulator's ZB-H1 (pipeline_orders)": " ".join(simulated_h1[r]),
             "torch's pipeline_order (− idle slot)": " ".join(zbr[r]["zb_h1"]["order"]),
             "executed (traced)": " ".join(action_names(zbr[r]["zb_h1"]["executed"]))}
            for r in zbr])
show_table([{"rank": r, "stages held": zbr[r]["zbv"]["stages"],
             "torch's ZB-V pipeline_order": " ".join(zbr[r]["zbv"]["order"]),
             "executed = order": action_names(zbr[r]["zbv"]["executed"]) ==
                                 [a for a in zbr[r]["zbv"]["order"] if a != "-"]} for r in zbr])
zb_sim_peak = [pipeline_orders.simulate_order("zb_h1", cfg.ranks, real_m).peak_activations(d) for d in range(cfg.ranks)]
show_table([{"schedule": name, "rank": r, "stage": stage,
             "max |grad − unsplit| on the rank (fp64)": zbr[r][name]["grad_diff"],
             "peak micro-batches alive (measured)": zbr[r][name]["peak_microbatches_alive"][stage],
             "(simulator)": zb_sim_peak[r] if name == "zb_h1" else "no V order simulated",
             "peak on the rank, all its stages": zbr[r][name]["peak_on_rank"]}
            for name in lesson.ZERO_BUBBLE_SCHEDULES for r in zbr for stage in zbr[r][name]["stages"]])
zb_gap = max(zbr[r][name]["grad_diff"] for r in zbr for name in lesson.ZERO_BUBBLE_SCHEDULES)
zb_loss = {name: next(zbr[r][name]["loss"] for r in zbr if zbr[r][name]["loss"] is not None)
           for name in lesson.ZERO_BUBBLE_SCHEDULES}
print(f"largest gradient gap to the unsplit model (fp64): {zb_gap:.1e}; mean loss ZB-H1 "
      f"{zb_loss['zb_h1']:.15f}, ZB-V {zb_loss['zbv']:.15f}, unsplit {zbr[0]['loss_unsplit']:.15f}")

# %% [markdown]
# How they correspond. Drop torch's idle slots (`-`) and each rank's ZB-H1 order *is* the
# simulator's hand-written ZB-H1, action for action: device d starts with p − 1 − d forwards,
# then repeats F, I and a W per micro-batch, its W's lagging d micro-batches behind their I's
# (device 0 runs each W right after its I; the last device clears its late W's in the tail).
# The traced actions equal the schedule's order, so that order is what ran. Memory follows the
# lag: every rank holds exactly the simulator's ZB-H1 peak, p micro-batches on every stage where
# 1F1B holds p − s, measured from autograd's saved tensors. ZB-V has no
# counterpart in the simulator (its orders put one stage per device, or DualPipe's two
# directions); measured, each rank holds at most 2p (stage, micro-batch) pairs at once, each on
# one of its two chunks, which is the ZB-V paper's memory claim counted in pairs (if the chunks
# were equal halves of a device's layers, p micro-batches of them, 1F1B's first-stage peak; our
# last stage also carries the head, so the chunks are not equal and the bytes are not asserted). Gradients equal the unsplit model's to fp64 rounding and the
# mean of the per-micro-batch losses equals the unsplit loss, for both.

# %%
# NBVAL_CHECK_OUTPUT
for r in zbr:
    for name in lesson.ZERO_BUBBLE_SCHEDULES:
        x = zbr[r][name]
        assert x["grad_diff"] < 1e-12 * zbr[r]["grad_scale"], (name, x["grad_diff"])
        assert action_names(x["executed"]) == [a for a in x["order"] if a != "-"], name
        assert x["alive_after_step"] == 0                     # nothing outlives the step
    assert [a for a in zbr[r]["zb_h1"]["order"] if a != "-"] == simulated_h1[r]
    assert zbr[r]["zb_h1"]["peak_microbatches_alive"] == {r: zb_sim_peak[r]}
    assert zbr[r]["zbv"]["peak_on_rank"] == 2 * cfg.ranks    # 2p (stage, micro-batch) pairs
    assert {k for k, _, _ in zbr[r]["zbv"]["executed"]} == {"F", "I", "W"}   # B really split
assert zb_sim_peak == [cfg.ranks] * cfg.ranks
for name in lesson.ZERO_BUBBLE_SCHEDULES:
    assert abs(zb_loss[name] - zbr[0]["loss_unsplit"]) < 1e-12

# %% [markdown]
# **Context parallel, for real.** The same launch ran ring attention
# (`course_utils.distributed.context_parallel`) on a float64 sequence cut in two: each rank holds
# half the queries, keys and values, passes its K/V block to the next rank with
# `torch.distributed.batch_isend_irecv`, and folds each block in with the online softmax. The
# backward is written out (a custom `autograd.Function`): it sends every K/V block round the ring
# again together with its dK/dV accumulator, and one last hop brings each finished dK/dV home.
# Three arms: full attention, causal with a contiguous split (rank r holds chunks 2r, 2r+1 of 2n),
# and causal with the zig-zag split (chunks r and 2n−1−r). The reference is unsplit attention
# written out and differentiated by autograd; the memory baseline is the same Function on one
# process holding the whole sequence, measured by the ledger.

# %%
print(inspect.getsource(context_parallel._RingAttention.forward))
print(inspect.getsource(context_parallel.ring_pass))
ctx = {r: real[r]["context_parallel"] for r in range(cfg.ranks)}
seq = cfg.real["context_parallel"]["sequence"]   # S, the whole sequence
show_table([{"rank": r, "arm": arm, "max |out − unsplit|": x["gaps"]["output"],
             "max |dQ,dK,dV − unsplit|": max(x["gaps"][g] for g in ("dq", "dk", "dv")),
             "kept for backward (split / unsplit)": f"{x['kept_split']} / {x['kept_unsplit']}",
             "bytes sent (counted / formula)": f"{x['sent_bytes']} / {x['predicted_bytes']}",
             "score blocks": x["score_blocks"],
             "largest score block / S²": f"{x['largest_score_block']} / {seq ** 2}",
             "keys held at once / S": f"{x['most_keys_held']} / {seq}"} for r in ctx for arm, x in ctx[r].items()])
ring_gap = max(max(x["gaps"].values()) for r in ctx for x in ctx[r].values())
kept_ratio = max(x["kept_split"] / x["kept_unsplit"] for r in ctx for x in ctx[r].values())
blocks = {f"{arm}, rank {r}": ctx[r][arm]["score_blocks"] for arm in ("causal", "causal zig-zag")
          for r in ctx}
plot_bars(blocks, title="causal attention: score blocks each rank computes", ylabel="blocks")
plt.show()
cp = cfg.real["context_parallel"]
kv_bytes = cp["batch"] * (cp["sequence"] // cfg.ranks) * cp["dim"] * 8   # one rank's fp64 K block
print(f"largest gap to unsplit attention (fp64): {ring_gap:.1e}; kept-for-backward split/unsplit "
      f"{kept_ratio:.3f}; bytes sent per rank per step {ctx[0]['full']['sent_bytes']} = "
      f"(6(n−1)+2)·{kv_bytes} (one rank's K block); bytes this process really wrote (gloo): "
      f"{ctx[0]['full']['wire_bytes']}")

# %%
# NBVAL_CHECK_OUTPUT
for r in ctx:
    for arm, x in ctx[r].items():
        assert max(x["gaps"].values()) < 1e-12, (arm, x["gaps"])      # fp64: equal to rounding
        assert x["kept_split"] * cfg.ranks == x["kept_unsplit"]       # 1/n of the unsplit (n = 2)
        assert x["sent_bytes"] == x["predicted_bytes"] == context_parallel.ring_bytes_per_step(kv_bytes, cfg.ranks)
        assert x["wire_bytes"] is None or x["wire_bytes"] >= x["sent_bytes"]
        assert x["score_blocks"] == x["predicted_blocks"]
        # by construction of the zig-zag chunks (identities, shown for the reading): scores, one
        # chunk of S/2n queries against one of S/2n keys at a time, never S×S; keys, its own S/n
        # and the visiting S/n while it computes (at n = 2: all S of them)
        assert x["largest_score_block"] == (cp["sequence"] // (2 * cfg.ranks)) ** 2 < cp["sequence"] ** 2
        assert x["most_keys_held"] == 2 * cp["sequence"] // cfg.ranks
plain = [ctx[r]["causal"]["score_blocks"] for r in ctx]
zigzag = [ctx[r]["causal zig-zag"]["score_blocks"] for r in ctx]
assert plain[-1] > plain[0] and len(set(zigzag)) == 1 and sum(zigzag) == sum(plain)
# the same balance in the work the ledger counts, apart from the ring's own counter: every rank,
# every arm, the same matmul FLOPs per predicted score block (a block computed and then masked
# away would cost FLOPs the formula does not predict)
flops_per_block = {ctx[r][arm]["flops_split"] / ctx[r][arm]["predicted_blocks"] for r in ctx for arm in ctx[r]}
assert max(flops_per_block) == min(flops_per_block), flops_per_block
plain_flops = [ctx[r]["causal"]["flops_split"] for r in ctx]
zigzag_flops = [ctx[r]["causal zig-zag"]["flops_split"] for r in ctx]
assert plain_flops[-1] > plain_flops[0] and len(set(zigzag_flops)) == 1

# %% [markdown]
# ## 5 · The boundary
#
# - The simulator's costs are uniform and communication is free. Real stages are never
#   perfectly balanced (the slowest sets the pace) and every micro-batch boundary is a
#   point-to-point transfer of activations; more micro-batches shrink the bubble but make each
#   matrix product smaller and less efficient.
# - Zero-bubble schedules remove idle time only if W can be deferred, which keeps activations
#   alive longer: for the greedy rule, the smallest cap found above (a little more than 1F1B's
#   p) on the first stage; the hand-written ZB-H1 order reaches it at p itself. torch's
#   `ScheduleInterleavedZeroBubble` and `ScheduleZBVZeroBubble` ran above on two CPU ranks with exact gradients; on two processes sharing two cores their speed says nothing,
#   so the lesson checks their order and memory, not their bubble. In one iteration that ends
#   with the synchronisation before the optimizer step, no order with one stage per device and
#   one direction idles less than (p−1)F per device: the last device cannot start before p−1
#   forwards have passed, and every device does the same work. DualPipe escapes that floor
#   because its last device starts at once on the reverse direction (asserted below). The hand-written ZB-H2-style order here holds 2p − 1 micro-batches and gains
#   over ZB-H1 exactly where ZB-H1 idles above that floor; at F = B_input = W ZB-H1 already sits
#   on it, so ZB-H2 gains nothing there (the cell below checks both over a grid of costs). Its
#   published figure lies below the floor because the paper bypasses that synchronisation
#   (post-validation), letting the next iteration's forwards fill the edges.
# - DualPipe's gain assumes what its overlap needs: the forward of one direction and the backward
#   of the other are independent, so the communication of each (expert all-to-all, pipeline
#   sends) can run while the other computes — the report dedicates some SMs to communication for
#   this. The simulator makes communication free and instant, so it checks only the ordering; a
#   real F&B chunk costs max(compute, communication) of the pair at best. The formula
#   (p/2−1)(F&B+B−3W) also assumes the forward and the input-backward of a chunk take the same
#   time (F = B − W): the cell below shows it missing otherwise. And every device stores two
#   stages' parameters (and their gradients and optimizer state), so it pays when activations and
#   bubbles, not parameters, are what binds (DeepSeek-V3 uses large expert parallelism, which
#   keeps each device's share of parameters small).
# - Ring attention sends, per rank and step, 2(n−1) K/V blocks forward and 4(n−1)+2 backward,
#   whatever n is (the total, 6(n−1)+2 blocks, is asserted here at n = 2, and at 3 and 4 ranks,
#   where a ring turning the wrong way would also show, in `tests/test_context_parallel.py`); it hides behind the block computation only when one block's attention takes
#   longer than one block's transfer (long sequences). With a causal mask a contiguous split
#   leaves the last rank the most score blocks (the bars above), and the whole ring waits for
#   it; the zig-zag split gives every rank one early and one late chunk and equal work.

# %%
unequal = dict(forward=2, backward=2, weight=1)       # F = 2, B_input = 1: F ≠ B − W
dual_unequal = pipeline_orders.simulate_order("dualpipe", p, dp_m, **unequal)
h2_gain_costs = dict(forward=1, backward=3, weight=1)  # B_input = 2 > F
h1_h2 = {s: pipeline_orders.simulate_order(s, p, 4 * p, **h2_gain_costs).idle(0) for s in ("zb_h1", "zb_h2")}
# ZB-H1 and ZB-H2 over a grid of (F, B, W), against the (p−1)F floor of one synchronised iteration
h2_grid = []
for f_, b_, w_ in [(1, 2, 1), (2, 2, 1), (1, 3, 1), (2, 3, 1), (3, 3, 1), (1, 4, 2), (2, 4, 1), (3, 4, 1)]:
    c_ = dict(forward=f_, backward=b_, weight=w_)
    h2_grid.append({"F": f_, "B": b_, "W": w_, "floor (p−1)F": (p - 1) * f_,
                    "ZB-H1 idle": pipeline_orders.simulate_order("zb_h1", p, 4 * p, **c_).idle(0),
                    "ZB-H2 idle": pipeline_orders.simulate_order("zb_h2", p, 4 * p, **c_).idle(0)})
show_table(h2_grid)
print(f"DualPipe at F=2, B=2, W=1: idle {dual_unequal.idle(0):g} per device vs formula "
      f"{pipeline_orders.report_bubble('dualpipe', p, **unequal):g}")
print(f"ZB-H1 vs ZB-H2-style at F=B_input=W: idle {orders['zb_h1'].idle(0):g} vs "
      f"{orders['zb_h2'].idle(0):g}; at B_input=2F: {h1_h2['zb_h1']:g} vs {h1_h2['zb_h2']:g}")

# %%
# NBVAL_CHECK_OUTPUT
assert dual_unequal.idle(0) != pipeline_orders.report_bubble("dualpipe", p, **unequal)
assert orders["zb_h2"].idle(0) == orders["zb_h1"].idle(0) and h1_h2["zb_h2"] < h1_h2["zb_h1"]
assert orders["dualpipe"].idle(0) < (p - 1) * costs["forward"]   # two directions: below the one-direction floor
# the floor holds for every one-direction order here, on every device
assert all(orders[s].idle(d) >= (p - 1) * costs["forward"] for s in ("1f1b", "zb_h1", "zb_h2") for d in range(p))
# at the lesson's costs ZB-H2 idles exactly the floor on every device: the whole gap to the
# paper's post-validated figure is the synchronisation this simulator keeps
assert all(orders["zb_h2"].idle(d) == (p - 1) * costs["forward"] for d in range(p)) and zb_h2_published < (p - 1) * costs["forward"]
for r in h2_grid:
    assert r["ZB-H2 idle"] >= r["floor (p−1)F"] and r["ZB-H1 idle"] >= r["floor (p−1)F"], r
    assert (r["ZB-H2 idle"] < r["ZB-H1 idle"]) == (r["ZB-H1 idle"] > r["floor (p−1)F"]), r

# %% [markdown]
# - Tensor parallel's all-reduces (per block: two in forward, after attention and after the MLP,
#   and two in backward; measured here for the MLP only) sit on the critical path, with
#   activations of size batch × sequence × hidden: fine inside one NVLink node, slow across
#   nodes. Tensor parallelism shards only the inner 4h activations and the weights: the block's
#   B×S×h input and output, its LayerNorms and residuals, stay whole on every rank. Megatron's
#   *sequence parallelism* (Korthikanti et al. 2022; torch's `SequenceParallel` in
#   `parallelize_module`) shards those along the sequence and replaces each all-reduce by a
#   reduce-scatter and an all-gather, the same bytes; it is not the context parallelism above,
#   which splits attention itself along the sequence. That is why large runs combine them: TP inside a node, pipeline across nodes,
#   data parallel / ZeRO over replicas.
# - Wall-clock speed-ups cannot be judged on two CPU processes sharing two cores; this lesson
#   checks exactness and counts, not time.

# %% [markdown]
# ## Exercises
#
# Your exercises' configuration, drawn from `STUDENT_ID`: a pipeline of `task.stages` stages run
# with `task.microbatches` micro-batches (F = 1, B = 2, as in section 3), and a bubble target.
# The checks run the schedule simulator for your configuration: what it measures is the answer.
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.

# %%
from course_utils.variants import exercise_variant

task = exercise_variant("09_pipeline_tensor_parallel", STUDENT_ID, stages=(4, 2, 3, 5, 6, 8),
                        microbatches=(8, 3, 4, 6, 12, 16), bubble_target=(0.2, 0.1, 0.15, 0.25, 0.3))
task

# %% [raw]
# # BEGIN QUESTION
# name: q1_bubble_fraction
# points: 1

# %% [markdown]
# **Exercise 1 — predict, then measure.** Before running anything: 1F1B runs `task.microbatches`
# micro-batches on `task.stages` stages with F = 1 and B = 2. How long is the whole step, from the
# first stage's first F to the last B anywhere (in units of one F)? And what fraction of the
# device time is idle? Set `predicted_step_time` and `predicted_bubble` to numbers (work them out
# from p and m: the time the last micro-batch needs to get through, and the ramp before it; do not
# call the simulator). The check simulates that schedule and compares with its measured step time
# (exactly) and idle fraction.

# %% [raw]
# # BEGIN SOLUTION

# %%
predicted_step_time = 3 * (task.microbatches + task.stages - 1)  # SOLUTION
predicted_bubble = (task.stages - 1) / (task.microbatches + task.stages - 1)  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
check_close(predicted_step_time, pipeline.simulate("1f1b", task.stages, task.microbatches).makespan, rtol=0,
            what=f"1F1B step time (units of F, B = 2F) on {task.stages} stages, {task.microbatches} micro-batches (simulated)")
check_close(predicted_bubble, pipeline.simulate("1f1b", task.stages, task.microbatches).bubble_fraction,
            rtol=1e-9, what=f"1F1B bubble fraction on {task.stages} stages, {task.microbatches} micro-batches (simulated)")

# %%
# HIDDEN
check_close(predicted_step_time, pipeline.simulate("gpipe", task.stages, task.microbatches).makespan, rtol=0,
            what="GPipe step time at your p and m (the same as 1F1B's)")
check_close(predicted_bubble, pipeline.simulate("gpipe", task.stages, task.microbatches).bubble_fraction,
            rtol=1e-9, what="GPipe bubble fraction at your p and m (the same as 1F1B's)")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_peak_activations
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** 1F1B holds at most p − s micro-batches' activations on
# stage s — when there are that many. Write `peak_activations_1f1b(p, m)`: the list, one entry per
# stage, of the most micro-batches whose activations that stage holds at once under 1F1B with p
# stages and m micro-batches, for *any* m, including fewer micro-batches than stages. The check
# runs 1F1B in the simulator for your `task` (and, hidden, for other p and m) and reads the peak
# each device holds (from a micro-batch's F until its B ends).

# %% [raw]
# # BEGIN SOLUTION

# %%
def peak_activations_1f1b(p, m):
    # BEGIN SOLUTION
    # Stage s runs p − s − 1 warm-up forwards, then one more before its first backward; it can
    # never hold more micro-batches than there are.
    return [min(p - s, m) for s in range(p)]
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_t = pipeline.simulate("1f1b", task.stages, task.microbatches)
check_equal(list(peak_activations_1f1b(task.stages, task.microbatches)),
            [_t.peak_activations(s) for s in range(task.stages)],
            what=f"1F1B peak micro-batches held per stage, p={task.stages}, m={task.microbatches} (simulated)")
_t = pipeline.simulate("1f1b", 5, 2)  # fewer micro-batches than stages: does your answer depend on m?
check_equal(list(peak_activations_1f1b(5, 2)), [_t.peak_activations(s) for s in range(5)],
            what="1F1B peak micro-batches held per stage, p=5, m=2 (simulated)")

# %%
# HIDDEN
for _p, _m in ((8, 3), (5, 1), (1, 4), (6, 6), (3, 20)):
    _sim = pipeline.simulate("1f1b", _p, _m)
    check_equal(list(peak_activations_1f1b(_p, _m)), [_sim.peak_activations(s) for s in range(_p)],
                what=f"1F1B peak micro-batches held per stage, p={_p}, m={_m} (simulated)")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_microbatches_needed
# points: 1

# %% [markdown]
# **Exercise 3 — the other way round.** The lesson computed the bubble from m; a plan starts from
# the bubble it can afford. Write `microbatches_for(p, target)`: the smallest number of
# micro-batches m that keeps the GPipe/1F1B bubble at or below `target` (a fraction) on p stages.
# The check simulates 1F1B on `task.stages` stages at your m and at m − 1 with your
# `task.bubble_target`: the first must meet the target, the second must miss it (both up to
# floating-point rounding: a bubble of exactly the target, e.g. 3/20 for 0.15, meets it).

# %% [raw]
# # BEGIN SOLUTION

# %%
def microbatches_for(p, target):
    # BEGIN SOLUTION
    # (p−1)/(m+p−1) <= target  ⇔  m >= (p−1)(1−target)/target; step m up rather than trust the
    # rounding of a ceiling.
    m = 1
    while (p - 1) / (m + p - 1) > target:
        m += 1
    return m
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_m = microbatches_for(task.stages, task.bubble_target)
assert isinstance(_m, int) and _m >= 1, f"microbatches_for must return a whole number >= 1, got {_m!r}"
# 1e-9: the simulator's 1 − busy/total and (p−1)/(m+p−1) round differently (3/20 vs 0.15)
assert pipeline.simulate("1f1b", task.stages, _m).bubble_fraction <= task.bubble_target + 1e-9, \
    f"with m={_m} the simulated bubble on {task.stages} stages is above {task.bubble_target}: m is too small"
assert _m == 1 or pipeline.simulate("1f1b", task.stages, _m - 1).bubble_fraction > task.bubble_target + 1e-9, \
    f"m={_m - 1} already meets {task.bubble_target} on {task.stages} stages: m is not the smallest"

# %%
# HIDDEN
for _p, _target in ((8, 0.05), (1, 0.0), (2, 0.5), (7, 0.4), (4, 0.15), (4, 0.3)):  # 3/20, 3/10: on the target
    _mb = microbatches_for(_p, _target)
    assert isinstance(_mb, int) and _mb >= 1, f"microbatches_for({_p}, {_target}) returned {_mb!r}"
    assert pipeline.simulate("1f1b", _p, _mb).bubble_fraction <= _target + 1e-9, \
        f"microbatches_for({_p}, {_target}) = {_mb}: the simulated bubble is above the target"
    assert _mb == 1 or pipeline.simulate("1f1b", _p, _mb - 1).bubble_fraction > _target + 1e-9, \
        f"microbatches_for({_p}, {_target}) = {_mb}: {_mb - 1} already meets the target"

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q4_zero_bubble_step
# points: 1

# %% [markdown]
# **Exercise 4 — predict, then measure: what splitting the backward buys.** Zero bubble splits
# each backward into B_input (the input gradient, which the previous stage waits for) and W (the
# weight gradient, which nothing waits for), and lets W fill the idle slots. Write
# `zero_bubble_step_time(p, m, forward, backward)`: the step time of the zero-bubble schedule
# (no cap on held micro-batches) on p stages and m ≥ 2p micro-batches, with an even `backward`
# split into B_input = W = `backward // 2` (the simulator's split) and W ≤ F (ZB-H1's
# condition). Outside that range the answer changes: with an odd backward W = B_input + 1 and
# the idle time cannot fall below the (p − 1)F floor of section 5, and with W > F or m close to p
# the schedule has too little W, or too few slots, to fill the ramp.
# Work it out from the busy time each device has and the idle time section 3 measured for the
# zero-bubble schedule; do not call the simulator. The check simulates your `task.stages` stages
# with 2·`task.stages` micro-batches at F = 2, backward = 2, and compares the step times exactly;
# then it checks that your step is shorter than 1F1B's at the same costs by exactly the time W
# filled.

# %% [raw]
# # BEGIN SOLUTION

# %%
def zero_bubble_step_time(p, m, forward, backward):
    # BEGIN SOLUTION
    b_input = backward // 2
    w = backward - b_input
    # every device is busy m(F + B_input + W) and idles (p−1)(F + B_input − W): the ramp of
    # 1F1B, (p−1)(F + B), less the W that fills it
    return m * (forward + b_input + w) + (p - 1) * (forward + b_input - w)
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_p, _m = task.stages, 2 * task.stages
_zb = pipeline.simulate("zero_bubble", _p, _m, forward=2, backward=2)
_ofob = pipeline.simulate("1f1b", _p, _m, forward=2, backward=2)
check_close(zero_bubble_step_time(_p, _m, 2, 2), _zb.makespan, rtol=0,
            what=f"zero-bubble step time on {_p} stages, {_m} micro-batches, F = 2, B_input = W = 1 (simulated)")
check_close(_ofob.makespan - zero_bubble_step_time(_p, _m, 2, 2), 2 * (_p - 1), rtol=0,
            what="what zero bubble saves over 1F1B at these costs: (p − 1)·2W, 1F1B's ramp (p − 1)(F + B) less zero bubble's idle (p − 1)(F + B_input − W)")

# %%
# HIDDEN
for _p, _m, _f, _b in ((4, 8, 1, 2), (8, 16, 2, 4), (3, 9, 3, 2), (2, 5, 1, 2), (6, 12, 2, 2), (5, 10, 3, 6)):
    check_close(zero_bubble_step_time(_p, _m, _f, _b),
                pipeline.simulate("zero_bubble", _p, _m, forward=_f, backward=_b).makespan, rtol=0,
                what=f"zero-bubble step time, p={_p}, m={_m}, F={_f}, backward={_b} (simulated)")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(
    gpipe_bubble_p4_m8=timelines["gpipe"].bubble_fraction,
    interleaved_bubble_p4_m8=timelines["interleaved"].bubble_fraction,
    zero_bubble_p4_m8=timelines["zero_bubble"].bubble_fraction,
    zero_bubble_1f1b_memory_p4_m8=timelines["zero_bubble (1F1B memory)"].bubble_fraction,
    pipeline_max_grad_gap=max(r["pipeline"][s]["grad_diff"] for r in real for s in ("gpipe", "1f1b")),
    pipeline_peak_alive_gpipe=[r["pipeline"]["gpipe"]["peak_microbatches_alive"] for r in real],
    pipeline_peak_alive_1f1b=[r["pipeline"]["1f1b"]["peak_microbatches_alive"] for r in real],
    torch_zero_bubble_max_grad_gap=zb_gap,
    torch_zb_h1_peak_alive=[zbr[r]["zb_h1"]["peak_microbatches_alive"][r] for r in zbr],
    torch_zbv_peak_on_rank=[zbr[r]["zbv"]["peak_on_rank"] for r in zbr],
    tp_max_grad_gap=max(max(r["tensor_parallel"]["grad_diff"].values()) for r in real),
    tp_allreduce_bytes_over_predicted=tpr["allreduce_bytes"] / tpr["predicted_bytes"],
    dualpipe_idle_p4=orders["dualpipe"].idle(0),
    dualpipe_formula_p4=pipeline_orders.report_bubble("dualpipe", p, **costs),
    zb_h1_idle_p4=orders["zb_h1"].idle(0),
    one_f_one_b_idle_p4=orders["1f1b"].idle(0),
    dualpipe_peak_activations=max(orders["dualpipe"].peak_activations(d) for d in range(p)),
    ring_attention_max_gap=ring_gap,
    ring_kept_split_over_unsplit=kept_ratio,
    ring_bytes_over_formula=ctx[0]["full"]["sent_bytes"] / ctx[0]["full"]["predicted_bytes"],
    causal_blocks_plain=plain,
    causal_blocks_zigzag=zigzag,
)
