# %% [markdown]
# # 05 · The objective decides where compute goes
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/05_compute_budget.ipynb)
#
# Lessons 02–04 each changed one ledger line. Here the four objectives — supervised, SimCLR,
# MoCo, MAE — stand side by side at the same batch and the same compute budget, and we check the
# rule that ties parameters, data and training amount together: C ≈ 6·N·D.

# %%
# On Colab, install the kit with one pip command (Colab's own torch is kept); elsewhere this does nothing.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "git+https://github.com/training-ledger/course-kit.git"], check=True)

# %% tags=["parameters"]
import os
SCALE = os.environ.get("COURSE_SCALE", "default")

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.augment import SimCLRAugment
from course_utils.data import load_dataset
from course_utils.evaluate import probe_encoder
from course_utils.ledger import measure
from course_utils.models import MLP, ProjectionHead, SmallResNet, ViT, count_parameters
from course_utils.objectives import MAE, MoCo, SimCLR, Supervised, make_step
from course_utils.report import headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config
from course_utils.train import fit

cfg = config(
    SCALE,
    ci=dict(image_size=16, width=8, vit_dim=32, batch=16, budget_gflops=2.0, min_ssl_gain=None, train_limit=512,
            probe_train=256, probe_test=256, alloc_budget_mflops=200, alloc_widths=[8, 64],
            dataset="shapes"),
    default=dict(image_size=16, width=16, vit_dim=64, batch=64, budget_gflops=1500.0, min_ssl_gain=0.05, train_limit=None,
                 probe_train=2000, probe_test=1000, alloc_budget_mflops=5_000,
                 alloc_widths=[8, 32, 128, 512, 2048, 8192], dataset="shapes"),
    gpu=dict(image_size=32, width=64, vit_dim=192, batch=256, budget_gflops=200_000.0, min_ssl_gain=0.05, train_limit=None,
             probe_train=10000, probe_test=10000, alloc_budget_mflops=3_000_000,
             alloc_widths=[16, 64, 256, 1024, 4096], dataset="cifar10"),
)
device = setup(SCALE, seed=cfg.seed)
train = load_dataset(cfg.dataset, "train", image_size=cfg.image_size, device=device,
                     download=SCALE == "gpu", limit=cfg.train_limit)
test = load_dataset(cfg.dataset, "test", image_size=cfg.image_size, device=device,
                    download=SCALE == "gpu", limit=cfg.probe_test)
probe_train = train.subset(cfg.probe_train, seed=1)
# the contrastive augmentation of lessons 02-03 on "shapes" (large crops, strong colour, quarter
# turns); the gpu scale keeps SimCLR's CIFAR recipe
augment = (SimCLRAugment(cfg.image_size) if SCALE == "gpu" else
           SimCLRAugment(cfg.image_size, crop_scale=(0.6, 1.0), color_strength=1.0, rotate=True))
num_classes = len(train.classes)

# %% [markdown]
# ## The problem
#
# "Use more data and a bigger model" is not a plan. Each objective spends a step's compute in a
# different place — on extra views, on a key encoder without backward, on a cache, on fewer
# patches — so the same budget buys very different amounts of learning signal. And a fixed budget
# must be split between model size and training length: too large a model gets too few steps.

# %% [markdown]
# ## The mechanism
#
# One function per objective builds the model and its step (from `course_utils.objectives`); the
# ledger measures one step of each with the same batch of B images. Then every objective trains
# for the **same number of FLOPs** (steps = budget / FLOPs per step) and is probed.

# %%
def build(name, seed=cfg.seed):
    """-> (objective, optimizer, step): one constructor call per objective, one step builder."""
    torch.manual_seed(seed)
    if name == "MAE":
        vit = ViT(image_size=cfg.image_size, patch_size=4, dim=cfg.vit_dim, depth=4, heads=4)
        model = MAE(vit, mask_ratio=0.75, decoder_dim=32).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1.5e-3, weight_decay=0.05)
        return model, opt, make_step(model, opt, generator=torch.Generator().manual_seed(seed))
    backbone = SmallResNet(width=cfg.width)
    head = {"supervised": lambda: nn.Linear(backbone.feature_dim, num_classes),
            "SimCLR": lambda: ProjectionHead(backbone.feature_dim, 128, 64),
            "MoCo": lambda: ProjectionHead(backbone.feature_dim, 128, 64)}[name]()
    model = {"supervised": lambda: Supervised(backbone, head),
             "SimCLR": lambda: SimCLR(backbone, head, temperature=0.5),
             "MoCo": lambda: MoCo(backbone, head, queue_size=1024, momentum=0.99, temperature=0.2,
                                  bn_groups=2)}[name]().to(device)
    # the key encoder of MoCo is trained by EMA, not by the optimizer
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return model, opt, make_step(model, opt, augment=augment, generator=torch.Generator().manual_seed(seed))


def core_seconds():
    """CPU time / threads: the wall-clock of an idle machine (robust on a shared one)."""
    return time.process_time() / torch.get_num_threads() if device.type == "cpu" else time.perf_counter()


OBJECTIVES = ["supervised", "SimCLR", "MoCo", "MAE"]
batch = (train.images[:cfg.batch], train.labels[:cfg.batch])

# %% [markdown]
# ## Worked example: the four ledgers of one step

# %%
ledgers = {}
for name in OBJECTIVES:
    model, opt, step = build(name)
    step(batch)                                                  # optimizer state exists now
    rec = measure(lambda: step(batch), model=model, optimizer=opt, caches=model.caches,
                  encoders=model.ledger_encoders)
    start = core_seconds()
    for _ in range(3):
        step(batch)
    seconds = (core_seconds() - start) / 3
    ledgers[name] = dict(record=rec, seconds=seconds)

table = []
for name, r in ledgers.items():
    rec = r["record"]
    table.append({
        "objective": name,
        "encoded now": ", ".join(f"{v} {k}" for k, v in rec.encoded.items()),
        "back-propagated views / image": {"supervised": 1, "SimCLR": 2, "MoCo": 1, "MAE": 0.25}[name],
        "activation MB": rec.activation_bytes / 1e6, "cache KB": rec.cache_bytes / 1e3,
        "GFLOPs / image": rec.flops / cfg.batch / 1e9, "images/s": cfg.batch / r["seconds"],
    })
show_table(table)

# %%
# NBVAL_CHECK_OUTPUT
rec = {n: r["record"] for n, r in ledgers.items()}
L = (cfg.image_size // 4) ** 2
assert rec["SimCLR"].encoded["encoder images"] == 2 * cfg.batch              # two views, both with backward
assert rec["MoCo"].encoded["encoder images"] == rec["MoCo"].encoded["key encoder images"] == cfg.batch
assert rec["MAE"].encoded["encoder tokens"] == cfg.batch * int(L * 0.25)     # a quarter of the patches
assert rec["MoCo"].cache_bytes >= 1024 * 64 * 4 and rec["SimCLR"].cache_bytes == 0
assert rec["SimCLR"].activation_bytes > 1.8 * rec["supervised"].activation_bytes
assert rec["MoCo"].activation_bytes < 0.7 * rec["SimCLR"].activation_bytes    # keys keep nothing for backward
assert rec["SimCLR"].flops > 1.8 * rec["supervised"].flops

# %% [markdown]
# ## The evidence
#
# ### At a matched compute budget
#
# Every objective gets the same training FLOPs (`budget_gflops`), converted to steps with its own
# measured FLOPs per step, and is then probed (linear probe on frozen encoder features, and the
# same encoder at random initialisation as the floor).

# %%
results = []
for name in OBJECTIVES:
    model, _, step = build(name)
    encoder = model.encoder
    random_acc = probe_encoder(encoder, probe_train, test)["linear"]
    steps = max(1, int(cfg.budget_gflops * 1e9 / ledgers[name]["record"].flops))
    start = core_seconds()
    fit(step, train.batches(cfg.batch, seed=cfg.seed), steps=steps, desc=name, progress=False)
    seconds = core_seconds() - start
    acc = probe_encoder(encoder, probe_train, test)["linear"]
    results.append({"objective": name, "steps": steps, "images seen": steps * cfg.batch,
                    "train GFLOPs": steps * ledgers[name]["record"].flops / 1e9, "core-seconds": seconds,
                    "probe (random init)": random_acc, "probe (trained)": acc,
                    "gain (points) per TFLOP": 100 * (acc - random_acc) / (steps * ledgers[name]["record"].flops / 1e12)})
show_table(results)
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar([r["objective"] for r in results], [r["probe (trained)"] - r["probe (random init)"] for r in results])
ax.axhline(0, color="k", lw=0.5)
ax.set_ylabel("probe gain over random init"); ax.set_title(f"{cfg.budget_gflops:g} GFLOPs of training each")
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
for r in results:
    assert 0.5 * cfg.budget_gflops < r["train GFLOPs"] <= cfg.budget_gflops * 1.0001 or r["steps"] == 1, r
images_seen = {r["objective"]: r["images seen"] for r in results}
assert images_seen["MAE"] > images_seen["supervised"] > images_seen["SimCLR"], \
    "the same FLOPs buy the most images where the encoder sees the least of each"

# %%
gain = {r["objective"]: r["probe (trained)"] - r["probe (random init)"] for r in results}
if cfg.min_ssl_gain is not None:      # CI's 2 GFLOPs are a few steps: nothing to claim there
    assert gain["supervised"] == max(gain.values()), "the labels make supervised the strongest probe"
    for name in ("SimCLR", "MAE"):
        assert gain[name] >= cfg.min_ssl_gain, f"{name} should beat its random init at this budget"
    assert gain["MoCo"] < gain["SimCLR"], "at this budget MoCo has not taken off yet (lesson 03)"

# %% [markdown]
# The matched budget turns the ledger into data seen: SimCLR spends twice the encoder FLOPs per
# image (two views with backward), MoCo about one and a half (a key pass without backward), MAE a
# quarter of the patches. Only supervised learning uses the labels, so its probe is not a fair
# opponent and it wins by far. Of the self-supervised objectives, at this budget (1.5 TFLOP, about
# 3 minutes on 2 cores) SimCLR and MAE beat their random init by at least `min_ssl_gain` (we
# measured about +12 and +15 points), while MoCo is barely above the floor (+3): with batch 64 it
# gets about 900 steps, and lesson 03 showed that MoCo only takes off after about 800 steps of
# batch 128. Gain per TFLOP is a property of the budget, not only of the objective: at a twelfth of
# this budget (120 GFLOP) every self-supervised probe was at or below random init.

# %% [markdown]
# ### C ≈ 6·N·D, checked on the kit's models
#
# For a dense model, each parameter does one multiply-add (2 FLOPs) per token forward and two
# backward (gradients with respect to inputs and weights): C ≈ 6·N·D for N parameters and D
# tokens. Measured with the ledger's FLOP counter for one training step:

# %%
def six_nd_row(name, model, inputs, targets, tokens):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    def step():
        opt.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
    flops = measure(step, model=model).flops
    n = count_parameters(model)
    return {"model": name, "N params": n, "D tokens": tokens, "measured FLOPs": flops,
            "6ND": 6 * n * tokens, "measured / 6ND": flops / (6 * n * tokens)}


b = 32
xs, ys = torch.rand(b, 3, 32, 32, device=device), torch.randint(0, 10, (b,), device=device)
torch.manual_seed(0)
rows_6nd = [
    six_nd_row("MLP 3072-1024-1024-10", MLP(3 * 32 * 32, 1024, 10, layers=3).to(device), xs, ys, b),
    six_nd_row("ViT dim 256, 4 blocks, 16 tokens", ViT(image_size=32, patch_size=8, dim=256, depth=4, heads=4,
                                                       num_classes=10).to(device), xs, ys, b * 16),
    six_nd_row("SmallResNet width 16 (conv)", SmallResNet(width=16, num_classes=10).to(device), xs, ys, b),
]
show_table(rows_6nd)

# %%
# NBVAL_CHECK_OUTPUT
mlp_r, vit_r, cnn_r = (r["measured / 6ND"] for r in rows_6nd)
assert 0.7 < mlp_r <= 1.0, "dense MLP: 6ND minus the input layer's unneeded input gradient"
assert 0.9 < vit_r < 1.15, "transformer with few tokens: 6ND plus a little attention"
assert cnn_r > 20, "a conv reuses each weight at every position: 6ND with D = images does not apply"

# %% [markdown]
# The MLP is slightly *under* 6ND because nobody needs the gradient of the raw input (the first
# layer costs 4 FLOPs per weight, not 6); the ViT is slightly over because attention adds
# 4·L·D per token per block without parameters. For the CNN the rule needs D counted in
# *positions*, not images — the rule is about dense parameters used once per token.

# %% [markdown]
# ### A tiny allocation experiment: fixed compute, width vs steps
#
# Fix C (`alloc_budget_mflops`). A 2-layer MLP classifier of hidden width h on flattened 8×8
# images gets steps = C / (6·N(h)·B). Small models get many steps, large ones few. Which width
# reaches the lowest test loss?

# %%
digits_train = load_dataset("digits", "train", device=device)
digits_test = load_dataset("digits", "test", device=device)
alloc = []
for h in cfg.alloc_widths:
    torch.manual_seed(cfg.seed)
    net = MLP(64, h, 10, layers=2).to(device)
    n = count_parameters(net)
    bsz = 64
    steps = max(1, int(cfg.alloc_budget_mflops * 1e6 / (6 * n * bsz)))
    o = torch.optim.Adam(net.parameters(), lr=3e-3)
    fit(make_step(Supervised(net), o), digits_train.batches(bsz, seed=cfg.seed), steps=steps, progress=False)
    with torch.no_grad():
        logits = net(digits_test.images)
        alloc.append({"hidden": h, "N params": n, "steps": steps,
                      "test loss": F.cross_entropy(logits, digits_test.labels).item(),
                      "test acc": (logits.argmax(1) == digits_test.labels).float().mean().item()})
show_table(alloc)
best = min(alloc, key=lambda r: r["test loss"])
fig, ax = plt.subplots(figsize=(5, 3))
ax.semilogx([r["N params"] for r in alloc], [r["test loss"] for r in alloc], "o-")
ax.set_xlabel("parameters N (at fixed C)"); ax.set_ylabel("test loss"); plt.show()
print(f"best split at C = {cfg.alloc_budget_mflops} MFLOPs: hidden {best['hidden']} ({best['N params']} params, {best['steps']} steps)")

# %%
if SCALE != "ci":
    assert best is not alloc[0] and best is not alloc[-1], "the optimum is inside the range: neither extreme"

# %% [markdown]
# At a fixed budget the smallest model stops improving because it is too small, the largest
# because it gets too few steps; the best split lies between. That is the shape the scaling-law
# papers fit — at a toy scale.

# %% [markdown]
# ## The boundary
#
# - The matched-budget comparison counts matmul FLOPs only (augmentation, normalisation and the
#   optimizer are not in C) and measures one architecture per objective at one size; it says
#   where each objective *spends* compute, not which one wins at scale.
# - C ≈ 6ND holds for dense layers used once per token. It ignores attention's L²-term (large for
#   long sequences), counts D in tokens (images × patches for a ViT, positions for a CNN), and
#   says nothing about memory.
# - The allocation experiment is one dataset, one architecture family, one seed and budgets
#   spanning a factor of a few hundred in N: it shows that an interior optimum exists, not where it
#   lies for real models. Fitting a scaling law needs many budgets, several seeds per point, and
#   learning-rate schedules tuned for each run length — none of which a toy run provides.

# %% [markdown]
# ## Exercises
#
# The tests measure FLOPs with this helper.

# %%
def _measured(batch, d, h, c):
    net = MLP(d, h, c, layers=2)
    xx, yy = torch.rand(batch, d), torch.randint(0, c, (batch,))
    return measure(lambda: F.cross_entropy(net(xx), yy).backward(), model=net).flops

# %% [raw]
# # BEGIN QUESTION
# name: q1_steps_for_budget
# points: 1

# %% [markdown]
# **Exercise 1 —** With C ≈ 6·N·D, how many steps of batch B (one token per sample) does a budget
# of C FLOPs buy for a model with N parameters? Return an int (round down).

# %% [raw]
# # BEGIN SOLUTION

# %%
def steps_for_budget(c_flops, n_params, batch):
    # BEGIN SOLUTION
    return int(c_flops // (6 * n_params * batch))
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
assert steps_for_budget(6e9, 1e6, 100) == 10, "C / (6·N·B)"

# %%
""" # BEGIN TEST CONFIG
hidden: true
""" # END TEST CONFIG
assert steps_for_budget(1e12, 3e5, 64) == int(1e12 // (6 * 3e5 * 64))
assert steps_for_budget(10, 1e6, 1) == 0

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_mlp_training_flops
# points: 2

# %% [markdown]
# **Exercise 2 —** Exact training-step FLOPs (forward + backward, matmuls only) of
# `MLP(d, h, c, layers=2)` at batch B. Why is it less than 6·N·B? The test measures it.

# %% [raw]
# # BEGIN SOLUTION

# %%
def mlp_step_flops(batch, d, h, c):
    # BEGIN SOLUTION
    forward = 2 * batch * (d * h + h * c)
    backward = 2 * batch * d * h + 4 * batch * h * c     # no gradient for the input images
    return forward + backward
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
assert mlp_step_flops(4, 10, 8, 3) == _measured(4, 10, 8, 3), \
    "forward 2 FLOPs per weight per sample; backward 4 for the second layer, 2 for the first"

# %%
""" # BEGIN TEST CONFIG
hidden: true
""" # END TEST CONFIG
assert mlp_step_flops(16, 64, 32, 10) == _measured(16, 64, 32, 10)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Summary

# %%
headline(
    gflops_per_image_supervised=table[0]["GFLOPs / image"],
    gflops_per_image_simclr=table[1]["GFLOPs / image"],
    gflops_per_image_moco=table[2]["GFLOPs / image"],
    gflops_per_image_mae=table[3]["GFLOPs / image"],
    vit_flops_over_6nd=vit_r,
    best_alloc_hidden=best["hidden"],
)
