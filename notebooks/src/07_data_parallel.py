# %% [markdown]
# # 07 · Data parallel: two devices, different data, one set of parameters
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/07_data_parallel.ipynb)
#
# The *communicated* line of the ledger appears. Two processes — real `torch.distributed` ranks,
# gloo on this CPU, NCCL on GPUs — each take half of the batch, and still take **one** update:
# the same one a single process would take on the whole batch. We check that, count the bytes it
# costs, and find where "several shards are one batch" stops being true.

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
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_utils.distributed import WorkerError, launch
from course_utils.experiments import data_parallel as lesson
from course_utils.experiments import toys
from course_utils.exercises import check_close, check_equal
from course_utils.ledger.comm_count import WIRE_OVERHEAD_MAX
from course_utils.report import headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config

# Every scale runs the same workers; only sizes change. Ranks: 2 (one per core here; on a
# machine with >= 2 GPUs launch() picks NCCL and one GPU per rank by itself).
cfg = config(
    SCALE,
    ci=dict(seed=0, ranks=2, dp=dict(steps=3, batch=8, hidden=32, queue_size=64), comm=dict(hidden=64, steps=2)),
    default=dict(seed=0, ranks=2, dp=dict(steps=8, batch=32, hidden=64, queue_size=256),
                 comm=dict(hidden=512, steps=5)),
    gpu=dict(seed=0, ranks=2, dp=dict(steps=8, batch=64, hidden=256, queue_size=512),
             comm=dict(hidden=1024, steps=5)),
)
device = setup(SCALE, seed=cfg.seed)   # prints the scale, why, and the device
print(f"ranks: {cfg.ranks}")

# %% [markdown]
# ## 1 · The problem: the batch you want is larger than one device
#
# SimCLR wants large batches (Chen et al. 2020, cited in lesson 02), and lesson 06 showed that one device's memory caps
# the batch. Data parallelism runs n copies of the model, each on its own device and its own
# shard of the batch. Whether that is *the same training* as one big device depends on one
# question: do the n copies stay one set of parameters?
#
# First, the machinery. `launch(fn, n)` starts n real processes, joins them into a process group
# and returns what each rank's `fn(rank, n)` returned. This lesson's workers live in
# `course_utils/experiments/data_parallel.py` because every process re-imports them by name; the
# mechanisms they use (gradient averaging, cross-rank BatchNorm, gathers) live in
# `course_utils/distributed/`.

# %%
import inspect
print(inspect.getsource(lesson.hello_all_reduce))

# %% [markdown]
# Before calling it, each rank has joined the group: `launch` sets `MASTER_ADDR`/`MASTER_PORT`
# and calls `torch.distributed.init_process_group(backend, rank=rank, world_size=n)` with
# `backend` "nccl" when every rank can have its own GPU, else "gloo". Note `device=worker_device()`:
# NCCL only takes CUDA tensors, so a tensor built on the host would run here and crash on GPUs.
# The same worker runs under torchrun, which sets those variables for you:
#
#     torchrun --nproc_per_node 2 -m course_utils.distributed.torchrun_entry \
#         course_utils.experiments.data_parallel:hello_all_reduce

# %%
hello = launch(lesson.hello_all_reduce, cfg.ranks)
show_table(hello)
assert [h["sum"] for h in hello] == [cfg.ranks * (cfg.ranks + 1) / 2] * cfg.ranks

# %% [markdown]
# A notebook must never hang on a distributed bug. If a rank raises, the launcher stops the
# others and re-raises *that* rank's traceback here (shown next); a rank killed outright is named
# with its signal, and a run that outlives `timeout=` is stopped with the ranks' stacks (both shown
# by the kit's tests, `tests/test_distributed_launch.py`, not here).

# %%
try:
    launch(lesson.fail_on_rank, cfg.ranks, 1, timeout=60)
except WorkerError as err:
    failed_rank, failure = err.rank, str(err)
print(f"rank {failed_rank} failed; the re-raised traceback ends with:\n  "
      + next(line for line in failure.splitlines() if line.startswith("ValueError")))
assert failed_rank == 1 and "found a NaN" in failure

# %% [markdown]
# ## 2 · The mechanism: the gradient of a mean is the mean of the gradients
#
# Split the global batch X (nB rows) into shards X_r of B rows. The loss is a mean over rows,
# so for any parameters θ
#
# $$\nabla_\theta \frac{1}{nB}\sum_{i\in X}\ell_i \;=\; \frac{1}{n}\sum_{r}\;\nabla_\theta\frac{1}{B}\sum_{i\in X_r}\ell_i .$$
#
# Each rank computes its shard's gradient; each divides it by n and an **all-reduce** sums the n
# results (every rank receives the sum: the mean; DDP divides before summing). With identical starting parameters and identical
# averaged gradients, every rank's optimizer — SGD, Adam, anything deterministic — takes the same
# step, and the copies never drift apart. `DistributedDataParallel` (DDP) does exactly this, in
# buckets, overlapping each bucket's all-reduce with the rest of backward (the DDP docs and paper,
# Li et al. 2020, cited: this lesson's models fit one bucket, so no overlap happens here), and
# broadcasts rank 0's parameters once when it is built.
#
# First the identity itself, in this process, without any ranks:

# %%
model = toys.make_mlp(16, 32, 4, seed=cfg.seed)
x, y = toys.global_batch(0, 16, 16, 4, seed=cfg.seed)
full_grad = torch.autograd.grad(F.mse_loss(model(x), y), list(model.parameters()))
shard_grads = [torch.autograd.grad(F.mse_loss(model(xs), ys), list(model.parameters()))
               for xs, ys in zip(x.chunk(2), y.chunk(2))]
mean_of_shards = [(a + b) / 2 for a, b in zip(*shard_grads)]  # per parameter
identity_gap = max((f - m).abs().max().item() for f, m in zip(full_grad, mean_of_shards))
print(f"max |full-batch grad - mean of 2 shard grads| = {identity_gap:.1e}")

# %% [markdown]
# **What it costs.** A ring all-reduce of P bytes on n ranks is a reduce-scatter followed by an
# all-gather: each rank sends (n−1)/n·P in each, so **2(n−1)/n·P bytes per rank per step**,
# with P = 4Ψ, the fp32 gradient bytes of Ψ parameters. The bytes approach 2P and stay flat as n
# grows: that is why data parallelism scales in bandwidth. What does grow is latency: the ring
# takes 2(n−1) steps one after the other, each paying a message start-up α, so with link
# bandwidth β the time is 2(n−1)α + 2(n−1)/n·P/β. For small P or large n the α term wins (which
# is why collective libraries offer tree algorithms as well as rings, and NCCL chooses between
# them by message size, rank and node count and topology, per its documentation (cited, not
# measured here)). The plot in section 4 shows both terms.
#
# **Where the data comes from.** Each rank must see a different shard of the dataset. With a
# `DataLoader`, that is `DistributedSampler(dataset, num_replicas=n, rank=r)`; call
# `sampler.set_epoch(epoch)` every epoch, or every epoch repeats the first epoch's order. When n
# does not divide the dataset, the sampler pads it by repeating indices (or, with
# `drop_last=True`, drops the tail) so that every rank gets the same number of rows; this
# lesson's images divide evenly over `cfg.ranks` ranks (their count is printed below); padding
# would count the repeated images twice in that epoch. That matters because DDP averages the
# ranks' gradients uniformly (1/n each): with shards of unequal size the mean of the means is not
# the full batch's gradient:

# %%
print(inspect.getsource(lesson.sampler_epochs))
DATASET_SIZE = 20     # divides evenly over the lesson's ranks
samples = launch(lesson.sampler_epochs, cfg.ranks, DATASET_SIZE)
for epoch in range(len(samples[0]["seen"])):
    print(f"epoch {epoch}: " + " | ".join(f"rank {r} sees images {' '.join(map(str, s['seen'][epoch]))}"
                                          for r, s in enumerate(samples)))
# one image more than divides evenly: the sampler pads by repeating indices, every rank the same count
padded = launch(lesson.sampler_epochs, cfg.ranks, DATASET_SIZE + 1, 1)
padded_seen = [s["seen"][0] for s in padded]
repeated = len(sum(padded_seen, [])) - len(set(sum(padded_seen, [])))
print(f"{DATASET_SIZE + 1} images on {cfg.ranks} ranks: each rank sees {', '.join(str(len(v)) for v in padded_seen)}; "
      f"{repeated} image(s) seen twice this epoch (padding)")

# %%
# NBVAL_CHECK_OUTPUT
for epoch in range(len(samples[0]["seen"])):
    shards = [set(s["seen"][epoch]) for s in samples]
    assert set.union(*shards) == set(range(DATASET_SIZE)) and sum(map(len, shards)) == DATASET_SIZE   # disjoint, complete
# padding: equal shares, ceil(N/n) each, the extra rows repeats of images already seen
assert len({len(v) for v in padded_seen}) == 1 and len(padded_seen[0]) == math.ceil((DATASET_SIZE + 1) / cfg.ranks)
assert repeated == cfg.ranks * len(padded_seen[0]) - (DATASET_SIZE + 1) and set(sum(padded_seen, [])) == set(range(DATASET_SIZE + 1))
assert all(s["seen"][0] != s["seen"][1] for s in samples)                          # set_epoch reshuffles
assert all(epoch == s["seen_without_set_epoch"][0] for s in samples for epoch in s["seen_without_set_epoch"])

# %% [markdown]
# ## 3 · Worked example: DDP on two ranks vs one process on the concatenated batch
#
# `ddp_equivalence` builds the model on each rank from a *different* seed (to show the initial
# broadcast), wraps it in DDP, and trains it on its half of each batch; alongside, each rank trains
# a single-process copy on the whole batch. After every step it records max |θ_DDP − θ_single|.
# Two optimizers: SGD with momentum 0.9 (`sgd-momentum` in `course_utils.optim`) and AdamW.
# The worker, and `wrap_ddp`, where `DistributedDataParallel(...)` is built:

# %%
print(inspect.getsource(lesson.ddp_equivalence))
from course_utils.distributed import data_parallel
print(inspect.getsource(data_parallel.wrap_ddp))

# %%
eq = launch(lesson.ddp_equivalence, cfg.ranks, cfg.dp)
eq64 = launch(lesson.ddp_equivalence, cfg.ranks, {**cfg.dp, "dtype": "float64"})
rows = []
for opt in lesson.EQUIVALENCE_OPTIMIZERS:
    rows.append({"optimizer": opt,
                 "rank 0 init sum": eq[0][opt]["checksum_before_broadcast"],
                 "rank 1 init sum": eq[1][opt]["checksum_before_broadcast"],
                 "rank 1 after DDP()": eq[1][opt]["checksum_after_broadcast"],
                 "max |Δθ| fp32": max(max(r[opt]["max_abs_diff"]) for r in eq),
                 "max |Δθ| fp64": max(max(r[opt]["max_abs_diff"]) for r in eq64),
                 "bitwise equal steps": sum(eq[0][opt]["bitwise_equal"]),
                 "ranks' final θ identical": all(len({r[opt]["final_params_sha256"] for r in run}) == 1
                                                  for run in (eq, eq64))})
show_table(rows)
eps = {"fp32": torch.finfo(torch.float32).eps, "fp64": torch.finfo(torch.float64).eps}
gap_in_eps = {(prec, opt): max(max(r[opt]["max_abs_diff"]) for r in run) / (eps[prec] * run[0][opt]["param_scale"])
              for prec, run in (("fp32", eq), ("fp64", eq64)) for opt in lesson.EQUIVALENCE_OPTIMIZERS}
fp64_over_fp32 = max(max(max(r[o]["max_abs_diff"]) for r in eq64) / max(max(r[o]["max_abs_diff"]) for r in eq)
                     for o in lesson.EQUIVALENCE_OPTIMIZERS)
print("max |Δθ| in units of ε·max|θ| (ε: the dtype's machine epsilon): "
      + ", ".join(f"{p} {o} {v:.1f}" for (p, o), v in gap_in_eps.items())
      + f"; fp64 gap / fp32 gap ≤ {fp64_over_fp32:.1e}")

# %% [markdown]
# Not bitwise: the single process sums 2B per-row gradients inside one matrix product, DDP sums
# B of them per rank and then adds the two halves. Floating-point addition is not associative, so
# the last bits of the *gradients* differ. How large that is for the *parameters* depends on the
# optimizer, and the line above measures it in units of the dtype's machine epsilon ε times the
# parameter scale:
#
# - **SGD with momentum** is linear in the gradient, so a gradient that differs in its last bits
#   moves the parameters by an amount that differs in its last bits: about one ε in this run (its
#   steps and learning rate; later gradients are taken at parameters that already differ, so how
#   the gap grows over a long run is not bounded by this argument).
# - **AdamW** divides by √v + 1e-8. Where a gradient entry is itself near zero, a rounding
#   difference of ε·max|g| is not small *relative to that entry*, and the division turns it into
#   a visible change of that entry's step (our reading: which entry carries the gap is not
#   measured). Its gap in these units therefore has no constant
#   bound: it depends on how near zero the smallest gradient entries happen to be, which this one
#   configuration does not vary, so no bound is asserted on it.
#
# What tells rounding apart from a different algorithm is not the size but how it scales with
# precision: **going from fp32 to fp64 shrinks every gap by more than 10⁶**, for both optimizers.
# A different update (a missing average, a stale gradient) would leave a gap that does not shrink
# with precision: an argument, not an arm run here (no deliberately wrong DDP is trained). The
# evidence asserts the shrinking, SGD-momentum's gap between a quarter and 2 ε·max|θ| ("about one"),
# and that some step is not bitwise equal.
#
# Those gaps are between DDP and a *different* program, the single process. Between the DDP
# ranks themselves there is no gap at all: every rank applies the same averaged gradient to the
# same parameters with the same arithmetic, so after the last step their parameters agree to
# the bit (the table's last column compares a SHA-256 of each rank's final parameters, hashed in
# their own dtype; asserted for both optimizers and both precisions). The two precisions train on
# the same data: the batches are drawn in fp32 and cast, so fp64's arm differs in precision only.
#
# **Gradient accumulation with `no_sync`.** With k micro-batches per rank, only the last
# backward needs the all-reduce; the others accumulate locally inside `ddp.no_sync()`. Each
# micro-batch's loss is divided by k (the step's loss is the mean over its k micro-batches; without
# it the update is k times too large). The result is one step on n·k·B rows, and the all-reduce
# runs once per step, not k times (this model's gradients fit in one of DDP's buckets, so "once"
# is one bucket per step).

# %%
ns = launch(lesson.ddp_no_sync_accumulation, cfg.ranks, {**cfg.dp, "accumulation": 4})
buckets_per_step = set(ns[0]["allreduce_buckets_per_step"])
print(f"over {len(ns[0]['max_abs_diff'])} steps: max |Δθ| {max(ns[0]['max_abs_diff']):.1e}; all-reduced buckets "
      f"per step: {', '.join(map(str, sorted(buckets_per_step)))} for {ns[0]['micro_batches']} micro-batches")

# %% [markdown]
# **Bytes on the wire.** A DDP comm hook (`allreduce_mean_hook`) routes every gradient bucket
# through `torch.distributed.all_reduce`, where `CollectiveCounter` sees its size: the ledger's
# sixth line, `record.comm_bytes` of `measure`, is that count under the ring formula. On Linux we
# also read how many bytes each rank process really wrote during the step (`/proc/self/io`,
# `record.wire_bytes`): every write counts there, and the step writes nothing but what gloo
# pushes through its TCP sockets (the workers print outside it).

# %%
comm = {n: launch(lesson.ddp_comm_bytes, n, cfg.comm) for n in (1, cfg.ranks)}
show_table([{"ranks": n, "4Ψ (grad bytes)": c[0]["param_bytes"],
             "all-reduce payload/step": c[0]["payload_per_step"],
             "ring formula 2(n-1)/n·4Ψ": c[0]["ring_formula"],
             "wire bytes/step (measured)": c[0]["wire_per_step"]} for n, c in comm.items()])
print(f"the wire is held to at most {WIRE_OVERHEAD_MAX - 1:.0%} above the ring formula (WIRE_OVERHEAD_MAX)")

# %% [markdown]
# ## 4 · The evidence

# %%
# NBVAL_CHECK_OUTPUT
assert identity_gap < 1e-6, identity_gap   # the identity above, checked in this process (calculus)
assert all(0.25 < gap_in_eps[(prec, "sgd-momentum")] < 2 for prec in ("fp32", "fp64")), gap_in_eps   # about one ε
# not bitwise: some step of some optimizer differs in its last bits
assert not all(all(eq[0][opt]["bitwise_equal"]) for opt in lesson.EQUIVALENCE_OPTIMIZERS)
assert fp64_over_fp32 < 1e-6, fp64_over_fp32
for run in (eq, eq64):   # the copies end bit-identical: every rank's final parameters the same bits
    for opt in lesson.EQUIVALENCE_OPTIMIZERS:
        assert len({r[opt]["final_params_sha256"] for r in run}) == 1, opt
a, b = eq[0]["sgd-momentum"], eq[1]["sgd-momentum"]
assert a["checksum_before_broadcast"] != b["checksum_before_broadcast"], "ranks must start apart"
assert b["checksum_after_broadcast"] == a["checksum_before_broadcast"], "DDP broadcasts rank 0"
assert max(ns[0]["max_abs_diff"]) < 1e-6 and ns[0]["allreduce_buckets_per_step"] == [1] * len(ns[0]["max_abs_diff"])
for n, c in comm.items():
    assert c[0]["payload_per_step"] == c[0]["param_bytes"]          # every gradient byte once
    # identity, not evidence: by hand and DDP's comm hook are the same arithmetic (divide by n, then
    # all-reduce); the evidence against DDP's own reducer is the equivalence with one process above
    assert c[0]["manual_equals_ddp_bitwise"]
    if c[0]["wire_per_step"] is not None and n > 1:
        assert 1.0 <= c[0]["wire_per_step"] / c[0]["ring_formula"] < WIRE_OVERHEAD_MAX

# %% [markdown]
# The ring formula is the model for every rank count; we can measure 1 and 2 here (the wire check above
# only means something for n ≥ 2). At n = 2 the ring's 2(n−1)/n is 1, and any all-reduce that
# ends with both ranks holding the sum must send about that much, so the measurement shows that
# gloo sends no more than a ring would, not that it runs one. Measured wire bytes sit at or just above the formula (compare
# the table's last two columns): what they add is gloo's message headers and the process group's
# own bookkeeping, and the assert allows a small share for it (`WIRE_OVERHEAD_MAX`, printed under
# the table, the kit's one bound for every wire check; the smaller the gradients, the
# larger that share is expected to be, not shown here: one size runs; the headline's
# `wire_over_ring_formula` is this run's). On the right, the other side
# of the ring: the number of sequential message steps, 2(n−1), each paying the latency α. This
# half is the formula itself, not a measurement (two ranks on one machine cannot show it).

# %%
psi = comm[cfg.ranks][0]["param_bytes"]   # gradient bytes, 4Ψ
ranks_axis = list(range(1, 65))
fig, (ax, ax_lat) = plt.subplots(1, 2, figsize=(11, 3.5))
ax.plot(ranks_axis, [2 * (n - 1) / n * psi / 1e3 for n in ranks_axis], label="ring formula 2(n−1)/n·4Ψ")
ax.axhline(2 * psi / 1e3, ls=":", color="gray", label="2·4Ψ (the large-n limit)")
measured = [(n, c[0]["wire_per_step"]) for n, c in comm.items() if c[0]["wire_per_step"] is not None]
ax.plot([n for n, _ in measured], [w / 1e3 for _, w in measured], "o", label="measured (gloo, this machine)")
ax.set_xscale("log", base=2)
ax.set_xlabel("ranks n")
ax.set_ylabel("kB sent per rank per step")
ax.set_title("bytes per rank: bounded by 2·4Ψ in n")
ax.legend()
ax_lat.plot(ranks_axis, [2 * (n - 1) for n in ranks_axis], color="C3")
ax_lat.set_xlabel("ranks n (linear axis: a straight line is linear growth)")
ax_lat.set_ylabel("sequential steps 2(n−1) (× α each)")
ax_lat.set_title("latency term: grows linearly in n")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5 · The boundary: what is *not* automatically one large batch
#
# Equality held because the loss is a mean of per-row terms. Anything that couples rows *within*
# a batch sees only the rank's shard:
#
# - **BatchNorm** normalises with the shard's mean and variance. With shards that differ (here
#   each rank's data is shifted), outputs and gradients differ from the large batch.
#   `nn.SyncBatchNorm` all-gathers every rank's mean, inverse standard deviation and count and
#   merges them (and all-reduces two sums in backward); it refuses CPU tensors, so on CPU the kit
#   uses `CrossRankBatchNorm1d`, which all-reduces Σx, Σx² and the count through a differentiable
#   all-reduce: the same statistics, computed differently. The experiment averages the gradients
#   by hand, as DDP would. (Under DDP, buffer syncing, on by default, also overwrites every rank's
#   running mean and variance with rank 0's at each forward: `broadcast_buffers` in the DDP docs,
#   cited, not run here; torch 2.13 renamed it `forward_sync_buffers`. Rank 0's running statistics
#   then come from its own shard alone, and every other rank's hold rank 0's plus its own last
#   batch's update.)
# - **SimCLR's negatives** are the other images *in the batch*: per rank, each anchor sees
#   2B−1 candidates, not 2nB−1. Gathering the embeddings from all ranks restores them, but the
#   gather must route gradients back (its backward is a reduce-scatter; `all_gather_with_grad`).
# - **MoCo's queue** must be filled with the keys of all ranks, or each rank's dictionary holds
#   only its own shard's history and the copies disagree.

# %%
bn = launch(lesson.batchnorm_boundary, cfg.ranks, cfg.dp)
sim = launch(lesson.simclr_negatives, cfg.ranks, cfg.dp)
moco = launch(lesson.moco_queue_from_all_ranks, cfg.ranks, cfg.dp)
show_table([{"variant": v, "max |out − large batch|": bn[0][v]["output_diff"],
             "max |grad − large batch|": bn[0][v]["grad_diff"]} for v in ("per_rank_bn", "synced_bn")])
show_table([{"SimCLR negatives": v, "candidates per anchor": sim[0][v]["candidates"],
             "loss": sim[0][v]["loss"], "max |grad − large batch|": sim[0][v]["grad_diff"]}
            for v in ("per_rank", "gathered")]
           + [{"SimCLR negatives": "one process, whole batch", "candidates per anchor":
               sim[0]["candidates_single"], "loss": sim[0]["loss_single"],
               "max |grad − large batch|": 0.0}])
print(f"chance level, log(candidates): per rank log(2B − 1) = {math.log(sim[0]['per_rank']['candidates']):.4f}, "
      f"gathered log(2nB − 1) = {math.log(sim[0]['gathered']['candidates']):.4f}: their difference "
      f"{math.log(sim[0]['gathered']['candidates']) - math.log(sim[0]['per_rank']['candidates']):.3f} against the "
      f"losses' {sim[0]['loss_single'] - sim[0]['per_rank']['loss']:.3f}: the per-rank loss is lower because its task "
      f"has fewer candidates (both arms score the same weights, so not because its model is better: an identity)")
owners = sorted(set((moco[0]["shared_ids"][moco[0]["shared_ids"] >= 0] // 1000).tolist()))
same_queue = torch.equal(moco[0]["shared_keys"], moco[1]["shared_keys"])
print(f"rank 0's shared queue holds keys from ranks {', '.join(map(str, owners))}; "
      f"both ranks hold the same queue: {'yes' if same_queue else 'no'}")

# %%
# NBVAL_CHECK_OUTPUT
# These hold for the lesson's 2 ranks (run here); on one rank per-rank == global.
assert bn[0]["per_rank_bn"]["output_diff"] > 1e-2 and bn[0]["synced_bn"]["output_diff"] < 1e-5
assert bn[0]["synced_bn"]["grad_diff"] < 1e-5 < bn[0]["per_rank_bn"]["grad_diff"]
# the candidates are counted from the logits each loss scored (finite entries of an anchor's row)
assert all(r["per_rank"]["candidates"] == 2 * cfg.dp["batch"] - 1 for r in sim)
assert all(r["gathered"]["candidates"] == r["candidates_single"] == 2 * cfg.ranks * cfg.dp["batch"] - 1
           for r in sim)
for r in sim:
    assert abs(r["gathered"]["loss"] - r["loss_single"]) < 1e-5
    assert r["gathered"]["grad_diff"] < 1e-5 * max(1.0, r["gathered"]["grad_scale"])
    assert r["per_rank"]["loss"] < r["loss_single"] - 0.1 and r["per_rank"]["grad_diff"] > 1e-3
    # ... by about the gap between the two chance levels (the candidates explain the drop)
    log_gap = math.log(r["gathered"]["candidates"]) - math.log(r["per_rank"]["candidates"])
    assert abs((r["loss_single"] - r["per_rank"]["loss"]) - log_gap) < 0.25 * log_gap, (r, log_gap)
    assert r["matches_torch_all_gather"]
assert torch.equal(moco[0]["shared_keys"], moco[1]["shared_keys"]) and owners == list(range(cfg.ranks))
assert not torch.equal(moco[0]["own_keys"], moco[1]["own_keys"])

# %% [markdown]
# What this does *not* let you conclude:
# - "n ranks = n× faster". The all-reduce is 2(n−1)/n·4Ψ bytes per step *per rank*, but it competes with
#   compute for time; overlap (DDP's buckets) hides it only when backward is long enough.
# - "A larger global batch is free". The update equals one large-batch step; whether a large batch
#   *trains as well* (learning rate, warm-up, how far steps still fall) is a separate question (lesson 12).
# - Memory: every rank still holds the full parameters, gradients and optimizer state. Spreading
#   those is the next lesson.

# %% [markdown]
# ## Exercises
#
# Your exercises' configuration, drawn from `STUDENT_ID`: how a batch of 16 rows is split over
# ranks (`task.shard_sizes`), a number of ranks `task.ranks`, the MLP's hidden width `task.hidden`,
# and SimCLR's images per rank `task.per_rank` and embedding width `task.dim`. The byte checks run
# your configuration in a *fake* process group (`course_utils.ledger.fake_world`): this process
# plays rank 0 of `task.ranks`, DDP and the kit's gathers issue their real collectives, and the
# ledger counts them (`record.comm_bytes`) without moving data.
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.

# %%
from course_utils.ledger.comm_count import allreduce_mean_hook
from course_utils.distributed.data_parallel import nt_xent_local_with_global_negatives
from course_utils.ledger import fake_world, measure
from course_utils.variants import exercise_variant

task = exercise_variant("07_data_parallel", STUDENT_ID, shard_sizes=((6, 10), (4, 12), (3, 5, 8), (2, 6, 8), (1, 15)),
                        ranks=(2, 4, 8, 3, 16), hidden=(64, 32, 48, 128),
                        per_rank=(8, 4, 16, 32), dim=(4, 8, 16))
task

# %% [raw]
# # BEGIN QUESTION
# name: q1_uneven_shards
# points: 1

# %% [markdown]
# **Exercise 1 — an edge case.** The identity of section 2 assumed equal shards. `DistributedSampler`
# keeps them equal by padding (section 2), but a split without it, such as a data source each rank
# reads in its own share or uneven inputs under DDP's `Join`, gives rank r B_r rows.
# Write `average_uneven_gradients(shard_grads, shard_sizes)`: given one list of gradient tensors
# per rank, each the gradient of that rank's *mean* loss over its B_r rows, return the gradient of
# the mean loss over all rows. The check splits a batch of 16 rows like the lesson's `x, y` (drawn
# afresh, for a freshly seeded MLP of the lesson's kind) into `task.shard_sizes` rows, computes
# each shard's gradient, and compares your result with that batch's full gradient (to fp32
# rounding).

# %% [raw]
# # BEGIN SOLUTION

# %%
def average_uneven_gradients(shard_grads, shard_sizes):
    # BEGIN SOLUTION
    total = sum(shard_sizes)
    # each shard's gradient is of a mean over B_r rows: weight it by its share of the rows
    return [sum(size / total * g for size, g in zip(shard_sizes, grads)) for grads in zip(*shard_grads)]
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
# a batch and a model of the lesson's kind, measured here (not the lesson's own x, y and full_grad)
_mlp = toys.make_mlp(16, 32, 4, seed=7)
_x, _y = toys.global_batch(1, 16, 16, 4, seed=7)
_full = torch.autograd.grad(F.mse_loss(_mlp(_x), _y), list(_mlp.parameters()))
_grads = [torch.autograd.grad(F.mse_loss(_mlp(xs), ys), list(_mlp.parameters()))
          for xs, ys in zip(_x.split(list(task.shard_sizes)), _y.split(list(task.shard_sizes)))]
check_close(torch.cat([g.flatten() for g in average_uneven_gradients(_grads, list(task.shard_sizes))]),
            torch.cat([g.flatten() for g in _full]), rtol=1e-5, atol=1e-7,
            what=f"combined gradient of shards of {list(task.shard_sizes)} rows vs the full-batch gradient")

# %%
# HIDDEN
_hmodel = toys.make_mlp(16, 32, 4, seed=8)
_hx, _hy = toys.global_batch(2, 16, 16, 4, seed=8)
_hfull = torch.autograd.grad(F.mse_loss(_hmodel(_hx), _hy), list(_hmodel.parameters()))
for _sizes in ([1, 15], [8, 8], [2, 3, 5, 6], [16]):
    _hgrads = [torch.autograd.grad(F.mse_loss(_hmodel(xs), ys), list(_hmodel.parameters()))
              for xs, ys in zip(_hx.split(_sizes), _hy.split(_sizes))]
    check_close(torch.cat([g.flatten() for g in average_uneven_gradients(_hgrads, _sizes)]),
                torch.cat([g.flatten() for g in _hfull]), rtol=1e-5, atol=1e-7,
                what=f"combined gradient of shards of {_sizes} rows vs the full-batch gradient")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_ddp_bytes_sent
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** The lesson's MLP, `toys.make_mlp(16, task.hidden, 4)`
# (Linear(16, h)–Tanh–Linear(h, h)–Tanh–Linear(h, 4), with biases, fp32), trains under DDP on
# `task.ranks` ranks. How many bytes does rank 0 send per step in the gradient all-reduce, ring
# algorithm? Write `ddp_bytes_sent(in_dim, hidden, out_dim, ranks)`; count the parameters
# yourself. The check wraps the model in DDP in a fake world of `task.ranks` ranks and counts one
# measured step's all-reduce (`record.comm_bytes`, rounded to whole bytes: be within one byte).

# %% [raw]
# # BEGIN SOLUTION

# %%
def ddp_bytes_sent(in_dim, hidden, out_dim, ranks):
    # BEGIN SOLUTION
    n_params = (in_dim * hidden + hidden) + (hidden * hidden + hidden) + (hidden * out_dim + out_dim)
    # ring all-reduce = reduce-scatter + all-gather, each sending (n-1)/n of the 4Ψ gradient bytes
    return 2 * (ranks - 1) / ranks * 4 * n_params
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
with fake_world(task.ranks):
    _model = toys.make_mlp(16, task.hidden, 4, seed=0)
    _ddp = data_parallel.wrap_ddp(_model)
    _ddp.register_comm_hook(None, allreduce_mean_hook)   # the all-reduce the counter sees
    _rec = measure(lambda: F.mse_loss(_ddp(torch.randn(4, 16)), torch.randn(4, 4)).backward(), model=_model)
check_close(ddp_bytes_sent(16, task.hidden, 4, task.ranks), _rec.comm_bytes, rtol=0, atol=1,
            what=f"bytes rank 0 sends per DDP step, MLP of width {task.hidden}, {task.ranks} ranks")

# %%
# HIDDEN
for _ranks, _hidden, _in, _out in ((1, 32, 16, 4), (8, 96, 16, 4), (5, 20, 7, 3)):
    with fake_world(_ranks):
        _model = toys.make_mlp(_in, _hidden, _out, seed=0)
        _ddp = data_parallel.wrap_ddp(_model)
        _ddp.register_comm_hook(state=None, hook=allreduce_mean_hook)
        _rec = measure(lambda: F.mse_loss(_ddp(torch.randn(4, _in)), torch.randn(4, _out)).backward(), model=_model)
    check_close(ddp_bytes_sent(_in, _hidden, _out, _ranks), _rec.comm_bytes, rtol=0, atol=1,
                what=f"bytes rank 0 sends per DDP step, make_mlp({_in}, {_hidden}, {_out}), {_ranks} ranks")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_gathered_negatives_bytes
# points: 1

# %% [markdown]
# **Exercise 3 — predict, then measure.** Section 5 restored SimCLR's large-batch negatives by
# gathering both views' embeddings (B×d each, fp32) from all ranks with `all_gather_with_grad`.
# That is communication too: with `task.per_rank` images per rank, embeddings of width `task.dim`
# and `task.ranks` ranks, how many bytes does rank 0 send per step for it, forward *and* backward
# (the gather's backward is a reduce-scatter), ring algorithms? Write
# `gathered_negatives_bytes(per_rank, dim, ranks)`. The check runs the kit's
# `nt_xent_local_with_global_negatives` forward and backward in a fake world of `task.ranks` ranks
# and counts its collectives; the answer must be exact.

# %% [raw]
# # BEGIN SOLUTION

# %%
def gathered_negatives_bytes(per_rank, dim, ranks):
    # BEGIN SOLUTION
    gathered = ranks * per_rank * dim * 4      # one view's n·B×d fp32 rows after the gather
    per_collective = (ranks - 1) / ranks * gathered
    # two views, each gathered in forward and reduce-scattered in backward
    return 2 * 2 * per_collective
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
with fake_world(task.ranks):
    _encoder = toys.make_mlp(16, 32, task.dim, seed=0)
    _views = torch.randn(task.per_rank, 16), torch.randn(task.per_rank, 16)
    _rec = measure(lambda: nt_xent_local_with_global_negatives(*map(_encoder, _views)).backward(), model=_encoder)
check_close(gathered_negatives_bytes(task.per_rank, task.dim, task.ranks), _rec.comm_bytes, rtol=0,
            what=f"bytes rank 0 sends per step for gathered negatives, B={task.per_rank}, d={task.dim}, {task.ranks} ranks")

# %%
# HIDDEN
for _ranks, _b, _d in ((1, 8, 4), (8, 3, 5), (32, 2, 16)):
    with fake_world(_ranks):
        _encoder = toys.make_mlp(16, 32, _d, seed=0)
        _views = torch.randn(_b, 16), torch.randn(_b, 16)
        _rec = measure(lambda: nt_xent_local_with_global_negatives(*map(_encoder, _views)).backward(), model=_encoder)
    check_close(gathered_negatives_bytes(_b, _d, _ranks), _rec.comm_bytes, rtol=0,
                what=f"bytes sent for gathered negatives, B={_b}, d={_d}, {_ranks} ranks")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(
    ddp_max_param_diff_fp32=max(max(r[o]["max_abs_diff"]) for r in eq for o in lesson.EQUIVALENCE_OPTIMIZERS),
    ddp_max_param_diff_fp64=max(max(r[o]["max_abs_diff"]) for r in eq64 for o in lesson.EQUIVALENCE_OPTIMIZERS),
    no_sync_max_param_diff=max(ns[0]["max_abs_diff"]),
    allreduce_payload_over_grad_bytes=comm[cfg.ranks][0]["payload_per_step"] / psi,
    # None (shown as "—") where this OS does not let a process read the bytes it wrote
    wire_over_ring_formula=(None if comm[cfg.ranks][0]["wire_per_step"] is None
                            else comm[cfg.ranks][0]["wire_per_step"] / comm[cfg.ranks][0]["ring_formula"]),
    per_rank_bn_output_gap=bn[0]["per_rank_bn"]["output_diff"],
    gathered_simclr_grad_gap=sim[0]["gathered"]["grad_diff"],
    per_rank_simclr_grad_gap=sim[0]["per_rank"]["grad_diff"],
)
