# %% [markdown]
# # 08 · Sharding: spread the resident state, pay in communication
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/08_sharding.ipynb)
#
# Data parallelism (lesson 07) copies the *resident state* — weights, gradients, optimizer
# moments — onto every rank. Sharding keeps 1/n of it per rank and fetches the rest when it is
# needed. We measure, per rank, what is held and what crosses the wire, with PyTorch's own
# `ZeroRedundancyOptimizer` (ZeRO-1) and FSDP2 `fully_shard` (ZeRO-3), against the formulas.

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
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_utils.distributed import launch
from course_utils.distributed import sharding
from course_utils.experiments import sharding as lesson
from course_utils.experiments import toys
from course_utils.exercises import check_close, check_equal
from course_utils.ledger import measure
from course_utils.ledger.comm_count import WIRE_OVERHEAD_MAX
from course_utils.report import headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config

cfg = config(
    SCALE,
    ci=dict(seed=0, ranks=2, model=dict(width=64, depth=4, batch=8, steps=2),
            activation_batch=2048),
    default=dict(seed=0, ranks=2, model=dict(width=256, depth=8, batch=16, steps=3),
                 activation_batch=8192),
    gpu=dict(seed=0, ranks=2, model=dict(width=512, depth=8, batch=32, steps=3),
             activation_batch=16384),
)
device = setup(SCALE, seed=cfg.seed)
GB = 1e9
print(device, cfg.model)

# %% [markdown]
# ## 1 · The problem: every data-parallel rank holds 16 bytes per parameter
#
# fp32 Adam training keeps 4 bytes of weight, 4 of gradient and 8 of moments per parameter
# (lesson 06). Under DDP *each* rank holds all of it, so a 7 B-parameter model needs the
# DDP row's total (printed below) per rank before a single activation — more than an 80 GB GPU,
# however many GPUs you buy.

# %%
seven_b = 7e9
show_table([{"stage": stage, **{k: v / GB for k, v in sharding.predicted_state_bytes(seven_b, 8, stage).items()},
             "total GB per rank (8 ranks)": sum(sharding.predicted_state_bytes(seven_b, 8, stage).values()) / GB}
            for stage in sharding.STAGES])
ddp_per_rank = sum(sharding.predicted_state_bytes(seven_b, 8, "ddp").values())
print(f"DDP: {ddp_per_rank / GB:.0f} GB per rank for 7 B parameters, at any number of ranks")
# an identity of the table (16 bytes per parameter), and the comparison the sentence makes
assert ddp_per_rank == 16 * seven_b and ddp_per_rank > 80 * GB
assert ddp_per_rank == sum(sharding.predicted_state_bytes(seven_b, 64, "ddp").values())

# %% [markdown]
# ## 2 · The mechanism: keep 1/n, fetch the rest just in time
#
# ZeRO (Rajbhandari et al., 2020) removes the redundancy in three steps. With Ψ the number of
# parameters (the paper's Ψ: a count, not bytes), fp32 everything and n ranks, in bytes:
#
# | stage | sharded | held per rank (params + grads + Adam m, v) | sent per rank per step (ring) |
# |---|---|---|---|
# | DDP | nothing | 4Ψ + 4Ψ + 8Ψ | all-reduce grads: 2(n−1)/n·4Ψ |
# | ZeRO-1 | optimizer state | 4Ψ + 4Ψ + 8Ψ/n | reduce-scatter grads + all-gather params: 2(n−1)/n·4Ψ |
# | ZeRO-2 | + gradients | 4Ψ + 4Ψ/n + 8Ψ/n | same |
# | ZeRO-3 / FSDP | + parameters | (4Ψ + 4Ψ + 8Ψ)/n | all-gather in forward, again in backward, reduce-scatter: 3(n−1)/n·4Ψ |
#
# DDP's row holds only because the kit builds DDP with `gradient_as_bucket_view=True`. By
# default DDP copies every gradient into flat communication *buckets* before the all-reduce and
# copies the result back, so each rank holds the gradients twice: 4Ψ + **4Ψ + 4Ψ** + 8Ψ (as
# torch's `DistributedDataParallel` documentation describes `gradient_as_bucket_view`; not measured
# here: the ledger counts gradient tensors, and the default's buckets are not gradients). As bucket
# views, each `p.grad` is a slice of its bucket and there is one copy. The evidence below checks
# that side from the storage layout: the gradients live in as many storages as DDP has buckets,
# not one per parameter.
#
# ZeRO-1 and 2 are free in communication in the paper's algorithm: an all-reduce *is* a
# reduce-scatter plus an all-gather; ZeRO-1/2 reduce-scatter the gradients, update their own
# shard, then all-gather the updated *parameters* instead of the summed gradients, the same bytes
# (torch's ZeRO-1 pays more,
# 3(n−1)/n·4Ψ: an all-reduce, then a broadcast of each updated shard, measured below). ZeRO-3 pays one extra all-gather, because the
# parameters gathered for forward are dropped and gathered again for backward.
#
# In PyTorch: ZeRO-1 is `torch.distributed.optim.ZeroRedundancyOptimizer` (wraps any optimizer;
# each rank owns whole parameters, greedily balanced by size). ZeRO-3 is FSDP2
# `fully_shard(module)`: parameters become `DTensor`s sharded by rows; `reshard_after_forward=False`
# keeps the gathered parameters until backward — one all-gather saved, ZeRO-2-like traffic in
# the ring model (this gloo's reduce-scatter sends more, section 5), at the price of holding the
# full parameters during the step.

# %% [markdown]
# ## 3 · Worked example: one model, four ways, on one rank and on `cfg.ranks`
#
# A stack of equal Linear+Tanh blocks (like transformer blocks: equal sizes split evenly), AdamW,
# the same data and initialisation everywhere. Each run measures its last step with the ledger
# (`measure`: its `comm_bytes` line counts the step's collectives with `CollectiveCounter`; DDP's
# all-reduce is made visible with a comm hook) and the bytes each rank holds afterwards. This is the code every rank runs (`build` wraps the model, `parallelize` is
# where `DDP(...)`, `ZeroRedundancyOptimizer` and `fully_shard` appear):

# %%
import inspect
print(inspect.getsource(sharding.parallelize))
print(inspect.getsource(lesson.train_and_measure))

# %% [markdown]
# `launch` starts the ranks; in each, `torch.distributed.init_process_group("gloo" or "nccl")`
# has run before the worker is called (`course_utils/distributed/launcher.py`). First the
# single-process ledger of a step of the same model (its own data), whose state bytes the
# one-rank DDP run below must match:

# %%
model = toys.make_stack(cfg.model["width"], cfg.model["depth"], cfg.seed).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(cfg.model["batch"], cfg.model["width"], device=device)


def step():
    opt.zero_grad()
    F.mse_loss(model(x), torch.zeros_like(x)).backward()
    opt.step()


record = measure(step, model=model, optimizer=opt)
n_params = sum(p.numel() for p in model.parameters())
print(f"Ψ = {n_params:,} parameters, 4Ψ = {4 * n_params:,} bytes; ledger: params {record.param_bytes:,}, "
      f"grads {record.grad_bytes:,}, optimizer {record.optimizer_bytes:,} bytes")

# %%
runs = {n: launch(lesson.compare_strategies, n, cfg.model, timeout=300) for n in (1, cfg.ranks)}
stage_of = {"ddp": "ddp", "zero1": "zero1", "fsdp": "zero3", "fsdp_keep": "zero3"}
rows = []
for n, per_rank in runs.items():
    for strategy, r in per_rank[0].items():
        rows.append({"ranks": n, "strategy": strategy, **{k: v for k, v in r["state"].items()},
                     "held fwd→bwd": r["held_after_forward"],
                     "ring model of payloads/step": r["comm"]["ring_bytes_sent"],
                     "wire bytes/step": r["comm"]["wire_bytes"],
                     "max |θ − θ_DDP|": (r["params"] - per_rank[0]["ddp"]["params"]).abs().max().item()})
show_table(rows)

# %% [markdown]
# Read the multi-rank rows: ZeRO-1 divides the optimizer column by n, FSDP2 all three; both end
# at DDP's parameters (AdamW is elementwise, so updating a shard is updating those elements): the
# max |θ − θ_DDP| column, asserted exactly equal on two ranks (a sum of two terms has one order,
# and halving is exact) and within `PARAM_TOL` on more, where a reduce-scatter may sum in another
# order than an all-reduce. The *ring model* column is not a measurement: it is the counted
# payload of each collective times the ring algorithm's factor, 2(n−1)/n for an all-reduce and
# (n−1)/n for the others; the *wire* column is what each rank process wrote to its sockets
# (Linux; section 5 reads it). And the payloads per collective:

# %%
two = runs[cfg.ranks][0]
param_bytes = two["ddp"]["param_bytes"]   # 4Ψ
show_table([{"strategy": s, **{f"{k} payload / 4Ψ": v / param_bytes for k, v in r["comm"]["payload"].items()}}
            for s, r in two.items()])
layout = two["ddp"]["grad_layout"]
print(f"DDP gradients: {layout['grads']} tensors in {layout['storages']} storage(s) of "
      f"{layout['bytes']:,} bytes in all (4Ψ = {param_bytes:,})")

# %% [markdown]
# ## 4 · The evidence

# %%
# NBVAL_CHECK_OUTPUT
PARAM_TOL = 1e-6   # beyond two ranks: the order of a sum may differ between collectives
assert (record.param_bytes, record.grad_bytes, record.optimizer_bytes) == (4 * n_params, 4 * n_params, 8 * n_params)
assert runs[1][0]["ddp"]["state"] == {"params": record.param_bytes, "grads": record.grad_bytes,
                                      "optimizer": record.optimizer_bytes}, "the one-rank run is this step's state"
for n, per_rank in runs.items():
    for r in per_rank:
        for strategy, result in r.items():
            predicted = sharding.predicted_state_bytes(result["n_params"], n, stage_of[strategy])
            assert result["state"] == predicted, (n, strategy, result["state"], predicted)
            gap = (result["params"] - r["ddp"]["params"]).abs().max()
            assert gap == 0 if n <= 2 else gap < PARAM_TOL, (n, strategy, gap)
        pb = r["ddp"]["param_bytes"]   # 4Ψ
        # identities of the payload asserts below (the ring model is payload x ring factor); shown so
        # the table's column reads as the formulas' 2(n−1)/n·4Ψ, 3(n−1)/n·4Ψ
        for strategy, stage in (("ddp", "ddp"), ("fsdp", "zero3"), ("fsdp_keep", "zero2")):
            sent = r[strategy]["comm"]["ring_bytes_sent"]
            assert abs(sent - sharding.predicted_comm_bytes(pb, n, stage)) <= 1e-9 * pb, (n, strategy, sent)
        assert r["fsdp"]["held_after_forward"] == pb / n and r["fsdp_keep"]["held_after_forward"] == pb
        for strategy in ("ddp", "zero1"):  # one copy of the gradients: they are the buckets
            g = r[strategy]["grad_layout"]
            assert g["bytes"] == pb and g["storages"] < g["grads"], (n, strategy, g)
            # as many storages as buckets: one all-reduce per bucket per step
            assert g["storages"] == r[strategy]["comm"]["calls"].get("all_reduce", 0) or n == 1, (n, strategy, g)
        # activations are not sharded by ZeRO-DP: every strategy keeps the same bytes for backward
        kept = {strategy: result["record"].activation_bytes for strategy, result in r.items()}
        assert len(set(kept.values())) == 1, (n, kept)
        if n > 1:  # on one rank FSDP2 and ZeRO-1 skip their collectives altogether
            assert r["fsdp"]["comm"]["payload"] == {"all_gather": 2 * pb, "reduce_scatter": pb}
            assert r["fsdp_keep"]["comm"]["payload"] == {"all_gather": pb, "reduce_scatter": pb}
            assert r["zero1"]["comm"]["payload"] == {"all_reduce": pb, "broadcast": pb}
            # torch's ZeRO-1 sends an all-reduce (2(n−1)/n) and broadcasts ((n−1)/n): 3(n−1)/n·4Ψ
            assert abs(r["zero1"]["comm"]["ring_bytes_sent"] - 3 * (n - 1) / n * pb) <= 1e-9 * pb, n

# %% [markdown]
# Resident state: predicted for 1–64 ranks, measured (dots) where the runs were. Communication:
# the formulas' curves, and dots for the ring model of each run's counted payloads (payloads
# counted, the ring factor assumed; the measured wire bytes are in the table and in section 5). At
# two ranks a ring and a direct exchange send the same bytes (2(n−1)/n·P = P), so these runs
# cannot tell the algorithms apart; the curves beyond two ranks are the formulas':

# %%
ranks_axis = [1, 2, 4, 8, 16, 32, 64]
fig, (ax_mem, ax_comm) = plt.subplots(1, 2, figsize=(11, 3.8))
for (strategy, stage), color in zip((("ddp", "ddp"), ("zero1", "zero1"), (None, "zero2"), ("fsdp", "zero3")),
                                    ("C0", "C1", "C2", "C3")):
    ax_mem.plot(ranks_axis, [sum(sharding.predicted_state_bytes(n_params, n, stage).values()) / 1e6
                             for n in ranks_axis], color=color, label=stage)
    if strategy:
        ax_mem.plot(list(runs), [sum(runs[n][0][strategy]["state"].values()) / 1e6 for n in runs],
                    "o", color=color)
    ax_comm.plot(ranks_axis, [sharding.predicted_comm_bytes(4 * n_params, n, stage) / 1e6 for n in ranks_axis],
                 color=color, label=stage)
for strategy, color in (("ddp", "C0"), ("fsdp", "C3"), ("fsdp_keep", "C2")):
    ax_comm.plot(list(runs), [runs[n][0][strategy]["comm"]["ring_bytes_sent"] / 1e6 for n in runs],
                 "o", color=color, label="fsdp_keep (reshard_after_forward=False)" if strategy == "fsdp_keep" else None)
ax_comm.plot(list(runs), [runs[n][0]["zero1"]["comm"]["ring_bytes_sent"] / 1e6 for n in runs],
             "s", color="C1", label="torch ZeRO-1 (all-reduce + broadcast)")
for ax, title in ((ax_mem, "resident state per rank (MB)"), (ax_comm, "sent per rank per step (MB), ring model")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks n")
    ax.set_title(title)
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# **Distributed checkpoint.** A sharded model has no single place holding its weights. 
# `torch.distributed.checkpoint` (DCP) has every rank write its own shards plus one metadata
# file; loading reshards into whatever layout the new run uses. Here: save the FSDP2 model and its
# AdamW state, load into a freshly initialised sharded model, compare every local shard bitwise,
# then take one more step with both.

# %%
ckpt = launch(lesson.checkpoint_roundtrip, cfg.ranks, cfg.model, timeout=300)
show_table([{"rank": i, "files": ", ".join(c["files"]), "local shard bytes": c["local_shard_bytes"],
             "exact": c["exact"], "next step equal": c["next_step_equal"]} for i, c in enumerate(ckpt)])

# %%
# NBVAL_CHECK_OUTPUT
assert all(c["keys_match"] and c["exact"] and c["next_step_equal"] for c in ckpt)
assert sum(f.endswith(".distcp") for f in ckpt[0]["files"]) == cfg.ranks and ".metadata" in ckpt[0]["files"]

# %% [markdown]
# **Resharding.** The metadata file records which slice of each tensor every shard holds, so the
# loading run may shard differently. Save from `cfg.ranks` ranks after a few steps, then load
# with a single process (FSDP2 on a one-rank mesh) into a model built from *other* initial
# weights, with no optimizer state yet (both checked before the load: a guard against a test
# that could not fail, since the fresh model has taken no step), and compare the whole
# state (weights and AdamW's moments) bitwise with what was saved. (A training run resumed on
# another number of ranks also needs its schedule and data position, which the kit's script
# carries, and each rank's RNG stream, which has no counterpart there: lesson 10's boundary.)

# %%
reshard_dir = Path(tempfile.mkdtemp(prefix="lesson08_dcp_"))
saved = launch(lesson.dcp_save, cfg.ranks, str(reshard_dir / "ckpt"), cfg.model, timeout=300)
shard_files = sorted(f.name for f in (reshard_dir / "ckpt").iterdir())
loaded = launch(lesson.dcp_load, 1, str(reshard_dir / "ckpt"), cfg.model, True, timeout=300)[0]
before, loaded = loaded["before"], loaded["after"]
shutil.rmtree(reshard_dir)


def same(a, b, key):
    return torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key]))


reshard_equal = sorted(saved[0]) == sorted(loaded) and all(same(saved[0], loaded, k) for k in saved[0])
# before the load: none of the saved optimizer state, and not one saved weight
empty_before = not any(k.startswith("optim.") for k in before) and \
    not any(same(saved[0], before, k) for k in before if k.startswith("param."))
print(f"saved by {cfg.ranks} ranks ({sum(f.endswith('.distcp') for f in shard_files)} shard files), loaded by 1: "
      f"{len(saved[0])} tensors ({sum(k.endswith('exp_avg_sq') for k in saved[0])} of them AdamW second "
      f"moments), all bitwise equal: {reshard_equal}")

# %%
# NBVAL_CHECK_OUTPUT
assert empty_before, "the loading model must start from other weights and no optimizer state"
assert reshard_equal, "DCP loads a checkpoint saved by N ranks into 1, bitwise"
assert sum(f.endswith(".distcp") for f in shard_files) == cfg.ranks and ".metadata" in shard_files

# %% [markdown]
# ## 5 · The boundary: what sharding does not touch
#
# - **Activations are not sharded by ZeRO-DP.** Each rank keeps the activations of *its*
#   micro-batch for backward, whatever the stage 1–3 (the evidence above asserts that DDP, torch's
#   ZeRO-1 and both FSDP2 runs keep the same bytes). When they dominate — long sequences, big
#   batches — these stages do not shrink them (the state they free is memory the activations can
#   use); recomputation (lesson 06) or splitting the layers (lesson 09) does, and the ZeRO paper's
#   ZeRO-R partitions activation checkpoints across model-parallel ranks. The ledger
#   of one rank's step at a large local batch:

# %%
big_x = torch.randn(cfg.activation_batch, cfg.model["width"], device=device)
act = measure(lambda: F.mse_loss(model(big_x), torch.zeros_like(big_x)).backward(), model=model)
resident_zero3 = sum(sharding.predicted_state_bytes(n_params, cfg.ranks, "zero3").values())
half = measure(lambda: F.mse_loss(model(big_x[: cfg.activation_batch // 2]),
                                  torch.zeros_like(big_x[: cfg.activation_batch // 2])).backward(), model=model)
assert abs(2 * half.activation_bytes / act.activation_bytes - 1) < 1e-3, "activations are linear in the batch"
crossover_batch = resident_zero3 / (act.activation_bytes / cfg.activation_batch)   # activations ∝ batch
print(f"local batch {cfg.activation_batch}: activations kept {act.activation_bytes / 1e6:.1f} MB vs "
      f"ZeRO-3 resident state {resident_zero3 / 1e6:.1f} MB per rank; the activations, linear in the "
      f"batch, pass the sharded state above a local batch of about {crossover_batch:.0f} (below it, "
      f"ZeRO-3's state is the larger line)")
assert act.activation_bytes > resident_zero3, "at this batch the activations dominate"

# %% [markdown]
# - **The paper counts differently.** Its 16 bytes per parameter are mixed precision's
#   2Ψ (fp16 weights) + 2Ψ (fp16 gradients) + 12Ψ (fp32 master weights and Adam's moments), so
#   its stage 1 saves up to 4×, where this lesson's fp32 AdamW (4 + 4 + 8) saves up to 2×; and its
#   communication volumes (2Ψ, 3Ψ) count elements for large n, where this lesson counts bytes at n.
#   And torch's ZeRO-1 gives every parameter whole to one rank, so 8Ψ/n is its balanced ideal: a
#   rank that owns one large tensor (an embedding) holds more; here the blocks are equal, so
#   every rank holds exactly 8Ψ/n.
# - **Implementations differ from the paper.** torch's ZeRO-1 keeps DDP's all-reduce and then
#   broadcasts each owner's updated parameters: 3(n−1)/n·4Ψ sent, not the ideal 2(n−1)/n·4Ψ. And
#   the formulas assume ring algorithms. gloo's CPU reduce-scatter (this torch's gloo, measured
#   on `cfg.ranks` ranks, where a ring all-reduce's 2(n−1)/n·P is the whole input) writes as many
#   bytes as an all-reduce of the same input, 2(n−1)/n·P instead of (n−1)/n·P, so FSDP2's measured wire bytes exceed 3(n−1)/n·4Ψ; NCCL on GPUs has a ring
#   reduce-scatter that sends (n−1)/n·P (not measured by this lesson). The
#   cell compares the wire with both models of the reduce-scatter:

# %%
fsdp = two["fsdp"]["comm"]
fsdp_wire = fsdp["wire_bytes"]
gather_ring = (cfg.ranks - 1) / cfg.ranks * fsdp["payload"]["all_gather"]
as_ring = gather_ring + (cfg.ranks - 1) / cfg.ranks * fsdp["payload"]["reduce_scatter"]
as_all_reduce = gather_ring + 2 * (cfg.ranks - 1) / cfg.ranks * fsdp["payload"]["reduce_scatter"]
if fsdp_wire is not None:  # Linux: bytes the rank process wrote to its sockets
    print(f"FSDP2 wire bytes {fsdp_wire:,}: {fsdp_wire / as_ring:.2f}× the ring model, "
          f"{fsdp_wire / as_all_reduce:.2f}× the model where reduce-scatter costs an all-reduce; "
          f"DDP wire / ring formula = {two['ddp']['comm']['wire_bytes'] / two['ddp']['comm']['ring_bytes_sent']:.2f} "
          f"(each model is held to at most {WIRE_OVERHEAD_MAX - 1:.0%} above it: gloo's headers and the "
          "process group's bookkeeping, as in lesson 07)")
    assert 1.0 <= fsdp_wire / as_all_reduce < WIRE_OVERHEAD_MAX and fsdp_wire / as_ring > 1.2, fsdp_wire
    assert 1.0 <= two["ddp"]["comm"]["wire_bytes"] / two["ddp"]["comm"]["ring_bytes_sent"] < WIRE_OVERHEAD_MAX
    # torch's ZeRO-1 (an all-reduce and a broadcast) on the wire, against its ring model
    assert 1.0 <= two["zero1"]["comm"]["wire_bytes"] / two["zero1"]["comm"]["ring_bytes_sent"] < WIRE_OVERHEAD_MAX
    # like for like: fsdp and fsdp_keep differ by one all-gather of the parameters, so their wire
    # bytes differ by one ring all-gather, (n−1)/n·4Ψ: the all-gather is priced as a ring, and the
    # excess over the ring model sits in the reduce-scatter
    one_gather = fsdp_wire - two["fsdp_keep"]["comm"]["wire_bytes"]
    ring_gather_of_params = (cfg.ranks - 1) / cfg.ranks * param_bytes
    print(f"FSDP2 − fsdp_keep on the wire: {one_gather:,} bytes against one ring all-gather's "
          f"{ring_gather_of_params:,.0f}")
    assert 1.0 <= one_gather / ring_gather_of_params < WIRE_OVERHEAD_MAX, one_gather

# %% [markdown]
# - **Bytes are not time.** ZeRO-3's extra all-gather is cheap when it overlaps with compute
#   (FSDP2 prefetches the next block's parameters) and expensive when the network is slow
#   relative to the model's FLOPs per parameter; only a timed run on the real cluster says which.

# %% [markdown]
# ## Exercises
#
# Your exercises' configuration, drawn from `STUDENT_ID`: the toy stack's `task.width` and
# `task.depth` (`toys.make_stack`: `depth` blocks of `Linear(width, width)` with bias, then Tanh),
# `task.ranks` ranks, and a model and GPU size for the last question. The checks run your
# configuration in a *fake* process group (`course_utils.ledger.fake_world`): this process plays
# rank 0 of `task.ranks`, DDP and FSDP2 wrap the model for real and issue their real collectives,
# which the ledger counts without moving data, so 16 ranks cost no more than 2.
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.

# %%
from course_utils.experiments.toys import settings
from course_utils.ledger import fake_world
from course_utils.variants import exercise_variant

task = exercise_variant("08_sharding", STUDENT_ID, ranks=(2, 4, 8, 16), width=(64, 32, 96, 128),
                        depth=(4, 2, 3, 6), strategy=("fsdp", "ddp"),
                        billions=(7, 1.3, 13, 30), gpu_gb=(80, 40, 24), stage=("zero3", "zero1", "zero2"))
task

# %% [raw]
# # BEGIN QUESTION
# name: q1_resident_per_rank
# points: 1

# %% [markdown]
# **Exercise 1 — predict, then measure.** The stack `toys.make_stack(task.width, task.depth)` is
# trained with fp32 AdamW on `task.ranks` ranks under `task.strategy` ("ddp" or "fsdp", FSDP2's
# `fully_shard`). Write `resident_bytes_per_rank(width, depth, ranks, strategy)`: the bytes rank 0
# holds after a step in weights, gradients and Adam's moments. Count the parameters yourself from
# the blocks. The check trains your configuration in a fake world of `task.ranks` ranks and reads
# rank 0's tensors; the answer must be exact.

# %% [raw]
# # BEGIN SOLUTION

# %%
def resident_bytes_per_rank(width, depth, ranks, strategy):
    # BEGIN SOLUTION
    n_params = depth * (width * width + width)          # each block: weight and bias
    per_param = 4 + 4 + 8                               # weight, gradient, Adam m and v (fp32)
    return per_param * n_params / (ranks if strategy == "fsdp" else 1)
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
with fake_world(task.ranks) as _mesh:
    _run = lesson.train_and_measure(0, task.ranks, task.strategy, settings(
        dict(width=task.width, depth=task.depth, batch=4, steps=1), lesson.DEFAULTS), mesh=_mesh)
check_close(resident_bytes_per_rank(task.width, task.depth, task.ranks, task.strategy),
            sum(_run["state"].values()), rtol=0,
            what=f"rank 0's resident bytes, {task.strategy}, width {task.width}, depth {task.depth}, {task.ranks} ranks")

# %%
# HIDDEN
for _ranks, _width, _depth, _hstrategy in ((8, 32, 3, "ddp"), (16, 64, 2, "fsdp"), (4, 96, 5, "fsdp")):
    with fake_world(_ranks) as _mesh:
        _run = lesson.train_and_measure(0, _ranks, _hstrategy, settings(
            dict(width=_width, depth=_depth, batch=4, steps=1), lesson.DEFAULTS), mesh=_mesh)
    check_close(resident_bytes_per_rank(_width, _depth, _ranks, _hstrategy), sum(_run["state"].values()),
                rtol=0, what=f"rank 0's resident bytes, {_hstrategy}, width {_width}, depth {_depth}, {_ranks} ranks")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_fsdp_bytes_sent
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** How many bytes does rank 0 send per step when FSDP2
# trains `toys.make_stack(task.width, task.depth)` on `task.ranks` ranks, with
# `reshard_after_forward=True` (the default) and with `False`? Write
# `fsdp_bytes_sent(width, depth, ranks, reshard_after_forward)`, assuming ring collectives. The
# check counts every all-gather and reduce-scatter of one measured step in a fake world of
# `task.ranks` ranks (`record.comm_bytes`, which rounds to whole bytes: your answer must be
# within one byte).

# %% [raw]
# # BEGIN SOLUTION

# %%
def fsdp_bytes_sent(width, depth, ranks, reshard_after_forward=True):
    # BEGIN SOLUTION
    param_bytes = 4 * depth * (width * width + width)   # fp32 weights and biases
    # all-gather in forward (+ again in backward if resharded), reduce-scatter of the gradients;
    # each ring collective sends (n-1)/n of its payload per rank
    collectives = 3 if reshard_after_forward else 2
    return collectives * (ranks - 1) / ranks * param_bytes
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_sent = {}
for _strategy in ("fsdp", "fsdp_keep"):
    with fake_world(task.ranks) as _mesh:
        _sent[_strategy] = lesson.train_and_measure(0, task.ranks, _strategy, settings(
            dict(width=task.width, depth=task.depth, batch=4, steps=1), lesson.DEFAULTS), mesh=_mesh)["record"].comm_bytes
check_close([fsdp_bytes_sent(task.width, task.depth, task.ranks, True),
             fsdp_bytes_sent(task.width, task.depth, task.ranks, False)],
            [_sent["fsdp"], _sent["fsdp_keep"]], rtol=0, atol=1,
            what=f"[resharded, kept] bytes rank 0 sends per step, width {task.width}, depth {task.depth}, {task.ranks} ranks")

# %%
# HIDDEN
for _ranks, _width, _depth in ((8, 32, 3), (16, 96, 2), (1, 64, 2)):
    for _kind, _reshard in (("fsdp", True), ("fsdp_keep", False)):
        with fake_world(_ranks) as _mesh:
            _measured = lesson.train_and_measure(0, _ranks, _kind, settings(
                dict(width=_width, depth=_depth, batch=4, steps=1), lesson.DEFAULTS), mesh=_mesh)["record"].comm_bytes
        check_close(fsdp_bytes_sent(_width, _depth, _ranks, _reshard), _measured, rtol=0, atol=1,
                    what=f"bytes sent, reshard={_reshard}, width {_width}, depth {_depth}, {_ranks} ranks")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_min_ranks
# points: 1

# %% [markdown]
# **Exercise 3 — search.** A model of `task.billions` billion parameters is trained with fp32 AdamW
# on GPUs of `task.gpu_gb` GB (10⁹ bytes). Write `min_ranks(n_params, stage, gpu_bytes)`: the
# smallest number of ranks (1–1024) on which the resident state per rank (the table in section 2;
# `stage` one of "ddp", "zero1", "zero2", "zero3") fits in `gpu_bytes`, or 0 if none does. The
# check asks for `task.stage` (hidden checks: the other stages), and searches the kit's
# `sharding.predicted_state_bytes` for the same number.

# %% [raw]
# # BEGIN SOLUTION

# %%
def min_ranks(n_params, stage, gpu_bytes):
    # BEGIN SOLUTION
    level = ("ddp", "zero1", "zero2", "zero3").index(stage)
    for ranks in range(1, 1025):
        held = (4 * n_params / (ranks if level >= 3 else 1) + 4 * n_params / (ranks if level >= 2 else 1)
                + 8 * n_params / (ranks if level >= 1 else 1))
        if held <= gpu_bytes:
            return ranks
    return 0
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_n, _gpu = task.billions * 1e9, task.gpu_gb * 1e9
_expected = next((r for r in range(1, 1025) if sum(sharding.predicted_state_bytes(_n, r, task.stage).values()) <= _gpu), 0)
check_equal(min_ranks(_n, task.stage, _gpu), _expected,
            what=f"smallest number of ranks for {task.billions}B parameters, {task.stage}, {task.gpu_gb} GB GPUs (0: never fits)")

# %%
# HIDDEN
for _billions, _stage, _gb in ((7, "ddp", 80), (7, "zero1", 80), (70, "zero3", 80), (1.3, "zero2", 24)):
    _hn, _hgpu = _billions * 1e9, _gb * 1e9
    _hr = min_ranks(_hn, _stage, _hgpu)
    _hexpected = next((r for r in range(1, 1025)
                      if sum(sharding.predicted_state_bytes(_hn, r, _stage).values()) <= _hgpu), 0)
    check_equal(_hr, _hexpected, what=f"smallest number of ranks for {_billions}B parameters, {_stage}, {_gb} GB")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(
    zero1_optimizer_bytes_ratio=two["zero1"]["state"]["optimizer"] / two["ddp"]["state"]["optimizer"],
    fsdp_state_ratio=sum(two["fsdp"]["state"].values()) / sum(two["ddp"]["state"].values()),
    ddp_sent_over_param_bytes=two["ddp"]["comm"]["ring_bytes_sent"] / param_bytes,
    zero3_ring_model_over_param_bytes=two["fsdp"]["comm"]["ring_bytes_sent"] / param_bytes,
    torch_zero1_sent_over_param_bytes=two["zero1"]["comm"]["ring_bytes_sent"] / param_bytes,
    # None (shown as "—") where this OS does not let a process read the bytes it wrote
    fsdp_wire_over_reduce_scatter_as_all_reduce=None if fsdp_wire is None else fsdp_wire / as_all_reduce,
    fsdp_max_param_diff_vs_ddp=(two["fsdp"]["params"] - two["ddp"]["params"]).abs().max().item(),
    dcp_exact=all(c["exact"] for c in ckpt),
)
