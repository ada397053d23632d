# %% [markdown]
# # 11 · Plan the real run
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/11_plan_the_real_run.ipynb)
#
# Every lesson so far measured the ledger of a step that fits on a laptop. The question you bring
# from a paper, or from work, is about a step that does not: SimCLR's ResNet-50 at batch 4096,
# MoCo v2 with 65,536 keys on 8 GPUs, MAE's ViT-L, a 7B transformer on 64 GPUs. This lesson
# measures those steps, here, without the memory or the GPUs, and checks each figure against the
# one the paper published.

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
import math
import time

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

from course_utils.exercises import check_close, check_equal
from course_utils.ledger import fake_mode, fake_world, recompute_tradeoff, utilisation
from course_utils.ledger.plan import (gathered_negatives_ledger, gpt_ledger, resnet50_encoder,
                                      ssl_ledger, vit_large_16)
from course_utils.models import SmallResNet
from course_utils.plots import planner_widget
from course_utils.report import headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config

GPT_7B = dict(hidden=4096, heads=32, vocab=32000, seq=4096, batch=1)
cfg = config(
    SCALE,
    # CI: the same code on smaller images and a 2-layer slice of the 7B model (published-figure
    # checks need paper sizes and are guarded by cfg.paper)
    ci=dict(seed=0, paper=False, image_size=64, per_gpu_batches=(512, 4096), gpt_layers=2,
            ranks=(8, 64)),
    default=dict(seed=0, paper=True, image_size=224, per_gpu_batches=(256, 512, 1024, 2048, 4096),
                 gpt_layers=32, ranks=(8, 64)),
    gpu=dict(seed=0, paper=True, image_size=224, per_gpu_batches=(256, 512, 1024, 2048, 4096),
             gpt_layers=32, ranks=(8, 64)),
)
device = setup(SCALE, seed=cfg.seed)
GPU_BYTES = 80e9          # one 80 GB accelerator (A100 80GB / H100)
MARGIN = 0.9              # keep 10% for what the ledger cannot see (workspaces, fragmentation)
PEAK_FLOPS = 312e12       # A100 dense bf16 peak; change to your device's
MFU = 0.40                # assumed model FLOPs utilisation of a well-tuned run
print(device, f"| planning for {GPU_BYTES / 1e9:.0f} GB devices, peak {PEAK_FLOPS / 1e12:.0f} TFLOP/s, MFU {MFU:.0%}")

# %% [markdown]
# ## 1 · The problem
#
# A 7B-parameter model with AdamW holds 16 bytes per parameter before it sees a single token:
# more than 100 GB, more than this machine has. Building it to measure it is not an option; the
# formulas of lesson 06 cover GPT-like models but not ResNets with BatchNorm, MoCo's queue or
# MAE's masking. We want the *measured* ledger — all six lines — of steps we cannot run.
#
# ## 2 · The mechanism: fake tensors and a fake process group
#
# - `fake_mode()` makes every tensor created inside it a **fake tensor**: shape, dtype and
#   strides, no memory, no arithmetic. A whole training step still runs — every op is dispatched
#   and produces outputs of the right shapes — so `measure` sees the same FLOPs, the same tensors
#   saved for backward and the same parameter, gradient and optimizer-state shapes as a real step.
# - `fake_world(n)` starts torch's `"fake"` process group: this process is rank 0 of `n` ranks,
#   collectives return at once. DDP, FSDP2 and tensor parallel wrap the model for real and issue
#   their real collectives, which the ledger counts as the sixth line, `comm_bytes` (ring
#   convention of lessons 07-08).
#
# First the claim everything else rests on: fake and real ledgers are *equal*, line by line, where
# both can run. A SimCLR step on a small ResNet, once on real tensors, once on fake ones:

# %%
def small_simclr():
    torch.manual_seed(cfg.seed)
    return ssl_ledger("simclr", 8, image_size=32, encoder=SmallResNet())


real = small_simclr()
with fake_mode():
    fake = small_simclr()
LINES = ("flops", "forward_flops", "backward_flops", "activation_bytes", "param_bytes",
         "grad_bytes", "optimizer_bytes", "cache_bytes")
show_table([{"line": k, "real": getattr(real, k), "fake": getattr(fake, k),
             "fake / real": getattr(fake, k) / max(getattr(real, k), 1)} for k in LINES])
print(fake.notes)

# %%
# NBVAL_CHECK_OUTPUT
assert all(getattr(fake, k) == getattr(real, k) for k in LINES) and fake.fake and not real.fake

# %% [markdown]
# (The test suite checks the same for every objective and optimizer of the kit, TinyGPT with each
# recomputation mode, and DDP, ZeRO-1, FSDP2 and tensor parallel against a real 2-rank gloo run,
# communicated bytes included: `tests/test_fake_ledger.py`, `tests/test_fake_world.py`.)
#
# ## 3 · Worked example: four runs from the papers
#
# ### SimCLR, ResNet-50, 224 px: batch 256 → 4096
#
# SimCLR's best results use batch 4096 (Chen et al. 2020). One step per per-GPU batch, each on
# fake tensors:

# %%
simclr = {}
for b in tqdm(cfg.per_gpu_batches, desc="SimCLR ResNet-50 (fake)"):
    start = time.process_time()
    with fake_mode():
        simclr[b] = ssl_ledger("simclr", b, image_size=cfg.image_size)
    simclr[b].cpu_seconds = time.process_time() - start


def needs_bytes(rec):
    """What one device must hold during the step: resident state plus what backward keeps."""
    return rec.resident_bytes + rec.activation_bytes


show_table([{"images per GPU": b, "TFLOP/step": r.flops / 1e12, "kept for backward (GB)": r.activation_bytes / 1e9,
             "resident (GB)": r.resident_bytes / 1e9, "fits 80 GB": needs_bytes(r) <= MARGIN * GPU_BYTES,
             "CPU s to measure": r.cpu_seconds} for b, r in simclr.items()])

# %% [markdown]
# What backward keeps grows with the batch, the resident state does not. With DDP each of `n`
# GPUs takes 4096/n images, so the per-GPU rows above are the per-rank ledgers of 4096 images on
# 4096/b GPUs. The smallest such `n` that fits, and what DDP and the gathered negatives send
# (each measured in a fake world of `n` ranks):

# %%
largest = max(cfg.per_gpu_batches)
fitting = [b for b, r in simclr.items() if needs_bytes(r) <= MARGIN * GPU_BYTES]
per_gpu = max(fitting) if fitting else min(cfg.per_gpu_batches)
simclr_gpus = largest // per_gpu
with fake_world(max(simclr_gpus, 2)) as mesh, fake_mode():
    ddp = ssl_ledger("simclr", per_gpu, image_size=cfg.image_size, ddp=True)
    negatives = gathered_negatives_ledger(per_gpu)
print(f"batch {largest}: {simclr_gpus} GPUs of {per_gpu} images each "
      f"({needs_bytes(simclr[per_gpu]) / 1e9:.1f} GB per GPU)")
print(f"DDP gradient all-reduce: {ddp.comm_bytes / 1e6:.1f} MB sent per GPU per step; "
      f"gathered negatives: {negatives.comm_bytes / 1e6:.2f} MB ({negatives.comm_bytes / ddp.comm_bytes:.1%} of it)")
show_table([{"collective": k, **v} for k, v in {**ddp.comm, **{f"negatives {k}": v for k, v in negatives.comm.items()}}.items()])

# %% [markdown]
# The gathered negatives are cheap on the wire: B·128 floats per view per rank, against the
# gradients of every parameter. What makes batch 4096 expensive is what backward keeps.
#
# ### MoCo v2: batch 256 on 8 GPUs, K = 65,536
#
# Each GPU encodes 32 queries and 32 keys; the queue and the key encoder are its extra state:

# %%
with fake_mode():
    moco = ssl_ledger("moco", 256 // 8, image_size=cfg.image_size, queue_size=65536)
    key_encoder_bytes = moco.param_bytes // 2   # the key encoder is a copy of the query encoder
moco_parts = {"queue (cache)": moco.cache_bytes, "key encoder copy": key_encoder_bytes,
              "kept for backward": moco.activation_bytes}
show_table([{"MoCo v2 per GPU": k, "MB": v / 1e6} for k, v in moco_parts.items()])

# %% [markdown]
# ### MAE, ViT-L/16: mask ratio 0.75 vs 0.0
#
# The encoder sees only the visible patches; at mask ratio 0 it would see all 196 of them:

# %%
mae = {}
for ratio in tqdm((0.75, 0.0), desc="MAE ViT-L/16 (fake)"):
    with fake_mode():
        mae[ratio] = ssl_ledger("mae", 64, image_size=cfg.image_size, mask_ratio=ratio)
show_table([{"mask ratio": r, "encoder tokens": rec.encoded["encoder tokens"],
             "TFLOP/step": rec.flops / 1e12, "kept for backward (GB)": rec.activation_bytes / 1e9}
            for r, rec in mae.items()])
mae_speed_up = mae[0.0].flops / mae[0.75].flops
mae_memory = mae[0.0].activation_bytes / mae[0.75].activation_bytes
print(f"mask 0.75 saves {mae_speed_up:.2f}x the FLOPs and {mae_memory:.2f}x the bytes kept for backward")

# %% [markdown]
# ### A 7B GPT-like model: DDP vs FSDP2, 8 and 64 GPUs, with and without recomputation
#
# Our GPT-like model (tied head, MLP 4h, 32 layers of width 4096, sequence 4096, one sequence
# per GPU) has the shape of LLaMA-7B with a plain MLP. bf16 autocast forward, fp32 AdamW state.

# %%
gpt = {}
runs = [(s, n, r) for s in ("ddp", "fsdp") for n in cfg.ranks for r in ("none", "full")]
for strategy, n, recompute in tqdm(runs, desc="7B GPT (fake)"):
    start = time.process_time()
    with fake_world(n) as mesh, fake_mode():
        gpt[strategy, n, recompute] = gpt_ledger(layers=cfg.gpt_layers, **GPT_7B, strategy=strategy,
                                                 mesh=mesh, recompute=recompute)
    gpt[strategy, n, recompute].cpu_seconds = time.process_time() - start
show_table([{"strategy": s, "GPUs": n, "recompute": r, "resident GB": rec.resident_bytes / 1e9,
             "kept for backward GB": rec.activation_bytes / 1e9, "TFLOP/step": rec.flops / 1e12,
             "sent GB/step": rec.comm_bytes / 1e9, "fits 80 GB": needs_bytes(rec) <= MARGIN * GPU_BYTES,
             "CPU s": rec.cpu_seconds} for (s, n, r), rec in gpt.items()])

# %%
fig, ax = plt.subplots(figsize=(9, 3.5))
labels = [f"{s} ×{n}\n{r}" for s, n, r in gpt]
resident = [rec.resident_bytes / 1e9 for rec in gpt.values()]
kept = [rec.activation_bytes / 1e9 for rec in gpt.values()]
ax.bar(labels, resident, label="resident (params, grads, AdamW)")
ax.bar(labels, kept, bottom=resident, label="kept for backward")
ax.axhline(GPU_BYTES / 1e9, color="k", ls="--", label="80 GB")
ax.set_ylabel("GB per GPU")
ax.set_title(f"{cfg.gpt_layers}-layer GPT, seq {GPT_7B['seq']}: what one GPU holds")
ax.legend(fontsize=8)
plt.show()
for n in cfg.ranks:
    print(f"{n} GPUs: FSDP2 sends {gpt['fsdp', n, 'none'].comm_bytes / gpt['ddp', n, 'none'].comm_bytes:.2f}x "
          "DDP's bytes per step")

# %% [markdown]
# DDP keeps all 16 bytes per parameter on every GPU: it never fits. FSDP2 divides the resident
# state by the number of GPUs and pays more traffic than DDP (ratio printed below: each block is
# gathered in forward and again in backward, gradients reduce-scattered); what is left is what backward keeps, which
# no sharding of state touches — full recomputation does.
#
# ## 4 · The evidence: the ledger against the published figures
#
# - ResNet-50: 4.1 GMACs per 224-px image forward, 25.6 M parameters with its 1000-class head
#   (He et al. 2016; torchvision's model card).
# - ViT-L/16: 304 M parameters (Dosovitskiy et al. 2021, Table 1).
# - MAE: an encoder that processes all 196 positions costs 3.3× the training FLOPs of one that
#   sees the 25% visible patches (He et al. 2022, Table 2c, ViT-L, 8-block decoder).
# - Mixed-precision Adam: 16 bytes per parameter (Rajbhandari et al. 2020, ZeRO).
# - MoCo v2 report (Chen et al. 2020, Table 3), 8 V100s: 5.0 GB per GPU for MoCo at batch 256,
#   93.0 GB (extrapolated) for end-to-end SimCLR-style training at batch 4096, i.e. 512 per GPU. A
#   GPU's peak also holds what the ledger cannot see (cuDNN workspaces, allocator caching), so
#   the ledger must come in *below* each, but not far below.

# %%
PUBLISHED = dict(resnet50_gmacs=4.1, resnet50_params=25.6e6, vitl_params=304e6, mae_speed_up=3.3,
                 adam_bytes_per_param=16, moco_gpu_bytes=5.0e9, e2e_4096_gpu_bytes=93.0e9)
with fake_mode():
    resnet_params = sum(p.numel() for p in resnet50_encoder().parameters()) + 2048 * 1000 + 1000
    vitl_params = sum(p.numel() for p in vit_large_16().parameters())
resnet_gmacs = simclr[largest].forward_flops / 2 / (2 * largest) / 1e9   # two views per image
psi = gpt["ddp", cfg.ranks[0], "none"].param_bytes // 4   # parameters (fp32, unsharded under DDP)
measured = dict(resnet50_gmacs=resnet_gmacs, resnet50_params=resnet_params, vitl_params=vitl_params,
                mae_speed_up=mae_speed_up,
                adam_bytes_per_param=gpt["ddp", cfg.ranks[0], "none"].resident_bytes / psi,
                moco_gpu_bytes=needs_bytes(moco),
                e2e_4096_gpu_bytes=needs_bytes(simclr[512]) if 512 in simclr else float("nan"))
show_table([{"figure": k, "published": PUBLISHED[k], "ledger (fake)": v, "ledger / published": v / PUBLISHED[k]}
            for k, v in measured.items()])

# %%
# NBVAL_CHECK_OUTPUT
assert measured["adam_bytes_per_param"] == 16          # at any size: 4 + 4 + 8 bytes per parameter
assert abs(measured["resnet50_params"] / PUBLISHED["resnet50_params"] - 1) < 0.01
assert abs(measured["vitl_params"] / PUBLISHED["vitl_params"] - 1) < 0.01
if cfg.paper:   # FLOPs and bytes at 224 px need the paper's image size
    assert abs(resnet_gmacs / PUBLISHED["resnet50_gmacs"] - 1) < 0.01, resnet_gmacs
    assert abs(mae_speed_up / PUBLISHED["mae_speed_up"] - 1) < 0.10, mae_speed_up
    for k in ("moco_gpu_bytes", "e2e_4096_gpu_bytes"):
        assert 0.5 < measured[k] / PUBLISHED[k] <= 1.0, (k, measured[k])
fsdp8 = gpt["fsdp", cfg.ranks[0], "none"]
assert abs(fsdp8.resident_bytes * cfg.ranks[0] / (16 * psi) - 1) < 1e-3   # FSDP2 shards all 16 bytes
for n in cfg.ranks:   # DDP sends 2(n-1)/n of the fp32 gradients, whatever the recomputation
    assert abs(gpt["ddp", n, "full"].comm_bytes - 2 * (n - 1) / n * 4 * psi) <= 4
assert all(gpt["fsdp", n, "full"].activation_bytes < gpt["fsdp", n, "none"].activation_bytes / 4 for n in cfg.ranks)
assert all(gpt["fsdp", n, "full"].flops > gpt["fsdp", n, "none"].flops for n in cfg.ranks)

# %% [markdown]
# ## 5 · The time side
#
# The ledger gives FLOPs per step; a device gives peak FLOP/s; the rest is the fraction of peak a
# real run achieves, the **MFU** (model FLOPs utilisation):
#
# $$t_\text{step} = \frac{\text{FLOPs per step}}{\text{devices} \times \text{peak} \times \text{MFU}}$$
#
# Two sanity checks against reported training times: SimCLR, ResNet-50 at batch 4096, 100 epochs
# of ImageNet (1,281,167 images) took about 1.5 hours on 128 TPU v3 cores, 64 chips of 123 TFLOP/s
# bf16 (Chen et al. 2020, §2.2); LLaMA 2 7B took 184,320 A100-80GB GPU-hours for 2 T tokens
# (Touvron et al. 2023, Table 2). Turned around, each reported time *implies* an MFU.

# %%
def step_seconds(flops, devices, peak=PEAK_FLOPS, mfu=MFU):
    return flops / (devices * peak * mfu)


simclr_total = simclr[largest].flops * math.ceil(100 * 1_281_167 / largest)
simclr_implied_mfu = simclr_total / (1.5 * 3600 * 64 * 123e12)
tokens_per_step = GPT_7B["seq"] * GPT_7B["batch"]
llama_gpu_hours = gpt["fsdp", cfg.ranks[1], "none"].flops / tokens_per_step * 2e12 / (PEAK_FLOPS * MFU) / 3600
llama_implied_mfu = gpt["fsdp", cfg.ranks[1], "none"].flops / tokens_per_step * 2e12 / (184_320 * 3600 * PEAK_FLOPS)
show_table([
    {"run": "SimCLR RN-50 b4096, 100 ep", "predicted at our MFU": f"{simclr_total / (64 * 123e12 * MFU) / 3600:.2f} h on 64 TPU v3 chips",
     "reported": "1.5 h", "implied MFU": simclr_implied_mfu},
    {"run": "7B GPT, 2T tokens", "predicted at our MFU": f"{llama_gpu_hours:,.0f} GPU-h (A100)",
     "reported": "184,320 GPU-h (LLaMA 2 7B)", "implied MFU": llama_implied_mfu},
])
for (s, n, r), rec in gpt.items():
    if s == "fsdp":
        print(f"FSDP2 ×{n}, recompute {r}: {step_seconds(rec.flops * n, n):.2f} s per step of {n} sequences")

# %%
# NBVAL_CHECK_OUTPUT
if cfg.paper:   # reported times imply an MFU that real runs reach (a few % to ~60%)
    assert 0.05 < simclr_implied_mfu < 0.6, simclr_implied_mfu
    assert 0.2 < llama_implied_mfu < 0.6, llama_implied_mfu

# %% [markdown]
# The same arithmetic on a real step, here: the ledger's FLOPs of a small TinyGPT step over its
# measured time, against this machine's matmul peak (`peak_flops`, a large matmul timed once):

# %%
toy = recompute_tradeoff(2, 128, 4, 256, 64, 4, modes=("none",), repeats=3)[0]
here = utilisation(toy["flops"], toy["seconds"], device)
print(f"toy step: {toy['flops'] / 1e9:.2f} GFLOP in {toy['seconds'] * 1e3:.1f} ms = "
      f"{here['flops_per_second'] / 1e9:.1f} GFLOP/s; peak here {here['peak_flops'] / 1e9:.1f} GFLOP/s; "
      f"MFU {here['mfu']:.1%}")

# %%
# NBVAL_CHECK_OUTPUT
assert 0 < here["mfu"] < 1   # no step beats the large-matmul peak

# %% [markdown]
# Small matrices, Python dispatch between ops and elementwise work the ledger does not count keep
# a toy step far below the peak; the papers' runs are large enough to get within a factor of a few.
# Our assumed MFU puts the LLaMA-size estimate within a factor of two of the reported GPU-hours;
# SimCLR's reported time implies a lower MFU (small convolutions, BatchNorm, a 2017-era stack).
#
# **Plan your own run.** The planner measures the step you choose on fake tensors and fake ranks
# (a few seconds per click) and prints the six ledger lines per device, the fit and the time:

# %%
planner_widget()

# %% [markdown]
# ## 6 · The boundary: what a fake run cannot know
#
# - **Speed.** Fake tensors do no arithmetic, so the ledger has FLOPs, not seconds; the MFU is an
#   assumption (the table above shows how far apart real runs are).
# - **Overlap.** Whether communication hides behind compute depends on kernels and links.
# - **The allocator.** Peak memory includes workspaces, caching and fragmentation: our 10% margin
#   is a guess, and the MoCo v2 check shows a real peak can sit well above the ledger.
# - **Data-dependent steps.** A step whose shapes depend on values (boolean indexing, `.item()`
#   branches) cannot run fake: `measure` raises and says which op, rather than guessing.
# - **Elementwise FLOPs** (BatchNorm, GELU, softmax) are not counted, as everywhere in the ledger.
# - DDP on fake tensors measures its first step only (its bucket rebuild before step 2 reads data).

# %% [markdown]
# ## Exercises

# %% [raw]
# # BEGIN QUESTION
# name: q1_min_gpus
# points: 1

# %% [markdown]
# **Exercise 1 —** With DDP, `n` GPUs each take `global_batch / n` images. Given the bytes kept
# for backward per image, the resident bytes per GPU and the device's bytes, return the smallest
# power of two `n` (1 to 4096) for which resident + kept fits in `MARGIN` (0.9) of the device;
# 0 if none does.

# %% [raw]
# # BEGIN SOLUTION

# %%
def min_gpus(kept_per_image, resident, global_batch, device_bytes, margin=0.9):
    # BEGIN SOLUTION
    n = 1
    while n <= 4096:
        if resident + kept_per_image * global_batch / n <= margin * device_bytes:
            return n
        n *= 2
    return 0
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
check_equal(min_gpus(1.0, 0.0, 100, 100, margin=1.0), 1, what="everything fits on one GPU")
check_equal(min_gpus(1.0, 10.0, 400, 100, margin=0.9), 8, what="400 bytes of activations, 80 free per GPU")

# %%
# HIDDEN
check_equal(min_gpus(1.0, 95.0, 400, 100, margin=0.9), 0, what="resident state alone overflows")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_training_days
# points: 1

# %% [markdown]
# **Exercise 2 —** A run takes `steps` steps of `flops_per_step` FLOPs on `devices` devices of
# `peak` FLOP/s at utilisation `mfu`. Return its length in days.

# %% [raw]
# # BEGIN SOLUTION

# %%
def training_days(flops_per_step, steps, devices, peak, mfu):
    # BEGIN SOLUTION
    return flops_per_step * steps / (devices * peak * mfu) / 86400
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
check_close(training_days(86400.0, 1, 1, 1.0, 1.0), 1.0, what="one day of one FLOP/s")
check_close(training_days(8.64e16, 10, 8, 1e12, 0.5), 2.5, what="8 devices at half of 1 TFLOP/s")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(
    fake_equals_real=all(getattr(fake, k) == getattr(real, k) for k in LINES),
    resnet50_gmacs_per_image=resnet_gmacs,
    simclr_4096_gpus_80gb=simclr_gpus,
    simclr_negatives_over_ddp_bytes=negatives.comm_bytes / ddp.comm_bytes,
    moco_queue_mb=moco.cache_bytes / 1e6,
    mae_flops_saving=mae_speed_up,
    gpt_fsdp64_resident_gb=gpt["fsdp", cfg.ranks[1], "none"].resident_bytes / 1e9,
    gpt_fsdp_over_ddp_sent=gpt["fsdp", cfg.ranks[0], "none"].comm_bytes / gpt["ddp", cfg.ranks[0], "none"].comm_bytes,
    llama_implied_mfu=llama_implied_mfu,
    simclr_implied_mfu=simclr_implied_mfu,
    toy_step_mfu_here=here["mfu"],
)
