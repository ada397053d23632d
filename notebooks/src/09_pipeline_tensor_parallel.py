# %% [markdown]
# # 09 · Pipeline and tensor parallel: split the model, not the batch
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/09_pipeline_tensor_parallel.ipynb)
#
# Lessons 07–08 split the batch and the resident state. Here the model itself is cut: by layers
# across devices (pipeline parallel, which costs idle time — *bubbles*) or inside each layer's
# matrices (tensor parallel, which costs an all-reduce per layer). A schedule simulator checks
# the bubble formulas; then both splits run for real on two ranks and must give the unsplit
# model's gradients.

# %%
# On Colab, install the kit with one pip command (Colab's own torch is kept); elsewhere this does nothing.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "git+https://github.com/training-ledger/course-kit.git@main"], check=True)

# %% tags=["parameters"]
import os
SCALE = os.environ.get("COURSE_SCALE", "default")

# %%
import matplotlib.pyplot as plt

from course_utils.distributed import launch
from course_utils.distributed import pipeline as pp
from course_utils.distributed.tensor_parallel import ColumnRowMLP
from course_utils.experiments import pipeline_tensor_parallel as lesson
from course_utils.exercises import check_close, check_equal
from course_utils.plots import plot_timeline
from course_utils.report import headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config

cfg = config(
    SCALE,
    ci=dict(seed=0, ranks=2, stages=4, microbatches=[1, 2, 4, 8], sweep_stages=[2, 4],
            real=dict(pipeline=dict(width=32, depth=4, batch=16, microbatches=4),
                      tensor_parallel=dict(hidden=32, batch=8))),
    default=dict(seed=0, ranks=2, stages=4, microbatches=[1, 2, 4, 8, 16, 32, 64],
                 sweep_stages=[2, 4, 8],
                 real=dict(pipeline=dict(width=128, depth=8, batch=64, microbatches=8),
                           tensor_parallel=dict(hidden=128, batch=32))),
    gpu=dict(seed=0, ranks=2, stages=4, microbatches=[1, 2, 4, 8, 16, 32, 64],
             sweep_stages=[2, 4, 8],
             real=dict(pipeline=dict(width=512, depth=8, batch=128, microbatches=8),
                       tensor_parallel=dict(hidden=512, batch=64))),
)
device = setup(SCALE, seed=cfg.seed)
print(device, "| simulated stages:", cfg.stages)

# %% [markdown]
# ## 1 · The problem: a model too big for one device, even sharded
#
# ZeRO-3 (lesson 08) gathers each layer's full parameters when it runs, and keeps every
# activation of the local batch. When one layer's matrices, or one device's activations, are
# already too much, the computation itself has to be divided: by layers (**pipeline**) or inside
# each matrix product (**tensor parallel**). Both are exact — same gradients as the unsplit model —
# and both have a price the ledger must show: idle devices, or an all-reduce per layer.

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
#   paid in v× more point-to-point messages.
# - **Zero bubble**: split B into B_input (gradient for the previous stage, on the critical path)
#   and W (weight gradient, nobody waits for it). W can fill idle slots.
#
# **Tensor parallel (Megatron).** An MLP y = GeLU(x W1ᵀ) W2ᵀ splits W1 by rows (output units,
# "column parallel") and W2 by the matching columns ("row parallel"). GeLU acts per unit, so
# each rank computes its slice of the hidden layer alone; the two halves of y are partial sums,
# added by **one all-reduce** in forward, and one more for the input gradient in backward.

# %% [markdown]
# ## 3 · Worked example: four schedules on four stages
#
# Unit costs F = 1, B = 2 (backward is about twice forward); for zero bubble B_input = W = 1.
# Interleaved uses v = 2 chunks per device (each chunk costs half).

# %%
p, m = cfg.stages, 8
timelines = {
    "gpipe": pp.simulate("gpipe", p, m),
    "1f1b": pp.simulate("1f1b", p, m),
    "interleaved": pp.simulate("interleaved", p, m, forward=2, backward=4, chunks=2),
    "zero_bubble": pp.simulate("zero_bubble", p, m),
    "zero_bubble (1F1B memory)": pp.simulate("zero_bubble", p, m, max_in_flight="1f1b"),
}
fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.0 * len(timelines)))
for ax, (name, t) in zip(axes, timelines.items()):
    plot_timeline(t, ax)
    ax.set_title(f"{name}: bubble {t.bubble_fraction:.1%}, peak activations on device 0: "
                 f"{t.peak_activations(0):g} micro-batches", fontsize=9)
plt.tight_layout()
plt.show()
formulas = {"gpipe": pp.bubble_formula(p, m), "1f1b": pp.bubble_formula(p, m),
            "interleaved": pp.bubble_formula(p, m, chunks=2), "zero_bubble": pp.zero_bubble_formula(p, m)}
show_table([{"schedule": name, "bubble (simulated)": t.bubble_fraction,
             "bubble (formula)": formulas.get(name, "none: greedy under a cap"),
             "peak activations per stage": [t.peak_activations(d) for d in range(p)]}
            for name, t in timelines.items()])

# %% [markdown]
# How much memory does zero bubble need? The simulator holds a micro-batch's activations from its
# F until its W (the weight gradient still needs the layer inputs), and its greedy zero-bubble
# schedule takes a cap on how many micro-batches a device may hold. Sweep the cap on p = 4
# stages and m = 16 micro-batches (more than 2p, so "all m", GPipe's memory, is a different
# point from "about 2p"):

# %%
zb_m = 16
caps = {"1F1B's peak (p)": p, "2p − 1": 2 * p - 1, "no cap (up to m)": None}
zb = {name: pp.simulate("zero_bubble", p, zb_m, max_in_flight=cap) for name, cap in caps.items()}
zb_formula = pp.zero_bubble_formula(p, zb_m)
show_table([{"cap on held micro-batches": name, "bubble": t.bubble_fraction,
             "(p−1)(F+B−W) formula": zb_formula, "1F1B bubble": pp.bubble_formula(p, zb_m),
             "peak held (device 0)": t.peak_activations(0)} for name, t in zb.items()])

# %% [markdown]
# The formula (p−1)(F+B−W) idle per device is reached with about **twice** 1F1B's activations
# (2p − 1 micro-batches on the first device), not with GPipe's m: letting W wait longer buys
# nothing more. This is the trade the zero-bubble paper (Qi et al., 2023) names ZB-H2; at 1F1B's
# peak (cap p), W still fills part of 1F1B's bubble, and the gain is smaller. (The paper's ZB-H1
# reaches (p−1)(F+B−W) at 1F1B's peak because it counts memory differently: after B_input only
# W's inputs are kept, not the whole activation. In this simulator a micro-batch counts fully
# until its W, so the cap-p row is what its accounting allows. These are greedy schedules under a
# memory cap, not the paper's hand-written H1/H2 orders.)

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
            sweep[(s, p_, m_)] = pp.simulate(s, p_, m_).bubble_fraction
fig, ax = plt.subplots(figsize=(6, 3.5))
for p_ in cfg.sweep_stages:
    ax.plot(cfg.microbatches, [pp.bubble_formula(p_, m_) for m_ in cfg.microbatches], label=f"formula p={p_}")
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
    assert abs(bubble - pp.bubble_formula(p_, m_)) < 1e-12, (s, p_, m_, bubble)
t = timelines
assert abs(t["interleaved"].bubble_fraction - pp.bubble_formula(p, m, chunks=2)) < 1e-12
assert abs(t["zero_bubble"].bubble_fraction - pp.zero_bubble_formula(p, m)) < 1e-12
assert t["zero_bubble"].bubble_fraction <= t["zero_bubble (1F1B memory)"].bubble_fraction < t["1f1b"].bubble_fraction
assert [t["gpipe"].peak_activations(d) for d in range(p)] == [m] * p
assert [t["1f1b"].peak_activations(d) for d in range(p)] == [p - d for d in range(p)]
assert [t["zero_bubble (1F1B memory)"].peak_activations(d) for d in range(p)] == [p - d for d in range(p)]
# Zero bubble's memory price (p = 4, m = 16): the formula needs about 2p held, no more, no less.
assert abs(zb["2p − 1"].bubble_fraction - zb_formula) < 1e-12 and zb["2p − 1"].peak_activations(0) == 2 * p - 1
assert abs(zb["no cap (up to m)"].bubble_fraction - zb_formula) < 1e-12          # more memory: no gain
assert zb_formula < zb["1F1B's peak (p)"].bubble_fraction < pp.bubble_formula(p, zb_m)
assert zb["1F1B's peak (p)"].peak_activations(0) == p

# %% [markdown]
# **The real thing.** `torch.distributed.pipelining` on two ranks: rank 0 holds the first half of
# a deep MLP as a `PipelineStage`, rank 1 the second; `ScheduleGPipe` and `Schedule1F1B` run
# m micro-batches and send activations (forward) and their gradients (backward) between ranks.
# The worker builds each rank's `PipelineStage` and schedule; the tensor-parallel layer below it
# is the whole of Megatron's MLP split (`copy_to_ranks` is f, `sum_from_ranks` is g).
# Then the Megatron MLP on the same two ranks, with its all-reduces counted; and torch's own
# DTensor version (`ColwiseParallel` then `RowwiseParallel`) as a cross-check.

# %%
import inspect
print(inspect.getsource(lesson.pipeline_two_stages))
print(inspect.getsource(ColumnRowMLP))

# %%
real = launch(lesson.suite, cfg.ranks, cfg.real, timeout=300)
show_table([{"rank": r, "schedule": s, "params on stage": real[r]["pipeline"][s]["params_on_this_stage"],
             "max |grad − unsplit|": real[r]["pipeline"][s]["grad_diff"],
             "loss": real[r]["pipeline"][s]["loss"]} for r in range(cfg.ranks) for s in ("gpipe", "1f1b")])
tpr = real[0]["tensor_parallel"]
print(f"tensor parallel: max |y − y_unsplit| {tpr['output_diff']:.1e}, max grad gap "
      f"{max(tpr['grad_diff'].values()):.1e}, all-reduces {tpr['allreduce_calls']}, "
      f"{tpr['allreduce_bytes']} bytes (predicted {tpr['predicted_bytes']}); weights on this rank "
      f"{tpr['weights_on_this_rank']} of {tpr['weights_unsplit']}; torch DTensor gap {tpr['torch_dtensor_output_diff']}")

# %%
# NBVAL_CHECK_OUTPUT
for r in real:
    for s in ("gpipe", "1f1b"):
        assert r["pipeline"][s]["grad_diff"] < 1e-6 * max(1.0, r["pipeline"]["grad_scale"])
    x = r["tensor_parallel"]
    assert x["output_diff"] < 1e-5 and max(x["grad_diff"].values()) < 1e-5
    assert x["allreduce_calls"] == {"forward": 1, "backward": 1} and x["allreduce_bytes"] == x["predicted_bytes"]
    assert x["torch_dtensor_output_diff"] is None or x["torch_dtensor_output_diff"] < 1e-5
assert abs(real[-1]["pipeline"]["gpipe"]["loss"] - real[-1]["pipeline"]["loss_unsplit"]) < 1e-5

# %% [markdown]
# ## 5 · The boundary
#
# - The simulator's costs are uniform and communication is free. Real stages are never
#   perfectly balanced (the slowest sets the pace) and every micro-batch boundary is a
#   point-to-point transfer of activations; more micro-batches shrink the bubble but make each
#   matrix product smaller and less efficient.
# - Zero-bubble schedules remove idle time only if W can be deferred, which keeps activations
#   alive longer: about 2p micro-batches on the first stage instead of 1F1B's p (the cap table
#   above). torch ships such schedules (`ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`
#   in `torch.distributed.pipelining`); this lesson runs GPipe and 1F1B for real, not those.
# - Tensor parallel's two all-reduces per MLP (and two per attention block) sit on the critical
#   path, with activations of size batch × sequence × hidden: fine inside one NVLink node, slow
#   across nodes. That is why large runs combine them: TP inside a node, pipeline across nodes,
#   data parallel / ZeRO over replicas.
# - Wall-clock speed-ups cannot be judged on two CPU processes sharing two cores; this lesson
#   checks exactness and counts, not time.

# %% [markdown]
# ## Exercises

# %% [raw]
# # BEGIN QUESTION
# name: q1_bubble_fraction
# points: 1

# %% [markdown]
# **Exercise 1 —** Write `bubble_fraction(p, m)`: the idle fraction of a GPipe schedule with p
# stages and m micro-batches (equal F and B costs per stage).

# %% [raw]
# # BEGIN SOLUTION

# %%
def bubble_fraction(p, m):
    # BEGIN SOLUTION
    return (p - 1) / (m + p - 1)
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
check_close(bubble_fraction(4, 8), timelines["gpipe"].bubble_fraction, what="bubble, p=4, m=8 (simulated)")

# %%
# HIDDEN
check_close(bubble_fraction(8, 1), 7 / 8, what="one micro-batch on 8 stages")
check_close(bubble_fraction(2, 30), pp.simulate("1f1b", 2, 30).bubble_fraction, what="1F1B, p=2, m=30")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_microbatches_needed
# points: 1

# %% [markdown]
# **Exercise 2 —** The smallest number of micro-batches m that keeps the GPipe bubble at or below
# `target` (e.g. 0.05) on p stages. Write `microbatches_for(p, target)`.

# %% [raw]
# # BEGIN SOLUTION

# %%
def microbatches_for(p, target):
    # BEGIN SOLUTION
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
check_equal(microbatches_for(4, 0.2), 12, what="p=4, bubble <= 20%")

# %%
# HIDDEN
check_equal(microbatches_for(8, 0.05), 133, what="p=8, bubble <= 5%")
check_equal(microbatches_for(1, 0.0), 1, what="one stage has no bubble")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_tp_bytes
# points: 1

# %% [markdown]
# **Exercise 3 —** A Megatron MLP with hidden size h on a batch of `tokens` rows (fp32): how many
# bytes are all-reduced per training step (forward + backward)? Write `tp_allreduce_bytes(tokens, h)`.

# %% [raw]
# # BEGIN SOLUTION

# %%
def tp_allreduce_bytes(tokens, h):
    # BEGIN SOLUTION
    return 2 * tokens * h * 4
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
check_equal(tp_allreduce_bytes(cfg.real["tensor_parallel"]["batch"], cfg.real["tensor_parallel"]["hidden"]),
            tpr["allreduce_bytes"], what="all-reduced bytes counted in this lesson")

# %%
# HIDDEN
check_equal(tp_allreduce_bytes(2048, 4096), 2 * 2048 * 4096 * 4, what="2048 tokens, h=4096")

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
    tp_max_grad_gap=max(max(r["tensor_parallel"]["grad_diff"].values()) for r in real),
    tp_allreduce_bytes_over_predicted=tpr["allreduce_bytes"] / tpr["predicted_bytes"],
)
