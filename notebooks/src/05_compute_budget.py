# %% [markdown]
# # 05 · The objective decides where compute goes
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/05_compute_budget.ipynb)
#
# Lessons 02–04 each changed one ledger line. Here the four objectives — supervised, SimCLR,
# MoCo, MAE — stand side by side at the same batch and the same compute budgets, each beside a
# supervised run of the *same* backbone, and we check the rule that ties parameters, data and
# training amount together: C ≈ 6·N·D.

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
import time

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_utils.augment import SimCLRAugment
from course_utils.data import load_dataset
from course_utils.evaluate import batchnorm_calibrated, probe_encoder
from course_utils.compare import NOT_RESOLVED, compare_paired, not_reversed
from course_utils.ledger import measure, utilisation
from course_utils.models import MLP, Attention, ProjectionHead, SmallResNet, ViT, count_parameters
from course_utils.objectives import MAE, MoCo, SimCLR, Supervised, make_step
from course_utils.report import committed_result, headline, show_table, ssl_quality_gains
from course_utils import runtime
from course_utils.runtime import map_runs, setup, step_bars
from course_utils.scales import config
from course_utils.train import TrainState, fit

# The claims of the matched-budget comparison are in the config: None or False means "no claim
# at this scale". CI's budgets are a few steps; the gpu scale has not been run against these
# claims, so it makes none (its numbers are printed, not asserted).
NO_CLAIMS = dict(labels_win=False, supervised_learns=False, alloc_check=False,
                 not_all_above_floor=False)
cfg = config(
    SCALE,
    # budgets_gflops: nested training budgets of the matched comparison (one run per objective and
    # seed, probed when it has spent each budget); alloc_budgets_flops: the allocation experiment's C,
    # in exact training FLOPs. simclr_temperature / moco_temperature: lessons 02 and 03's defaults.
    ci=dict(image_size=16, width=8, vit_dim=32, decoder_dim=32, batch=16, budgets_gflops=[0.5, 1.0],
            seeds=[0, 1],
            simclr_temperature=0.2, moco_temperature=0.2, moco_queue=1024, proj_dim=64,
            train_limit=512, probe_train=256, probe_test=256, dataset="shapes", calibration_images=64,
            alloc_budgets_flops=[2e6, 8e6], alloc_widths=[16, 64], alloc_batch=32, alloc_seeds=[0, 1], alloc_test_seeds=[2, 3],
            queue_flops_max=None, **NO_CLAIMS),
    default=dict(image_size=16, width=16, vit_dim=64, decoder_dim=32, batch=128,
                 budgets_gflops=[150.0, 300.0, 600.0], seeds=[0, 1, 2],
                 simclr_temperature=0.2, moco_temperature=0.2, moco_queue=1024, proj_dim=64,
                 train_limit=None, probe_train=2000, probe_test=1000, dataset="shapes", calibration_images=2048,
                 alloc_budgets_flops=[3.5e8, 1.4e9, 5.6e9], alloc_widths=[16, 64, 256, 1024],
                 alloc_batch=256, alloc_seeds=[0, 1, 2], alloc_test_seeds=[3, 4, 5], queue_flops_max=0.02,
                 # claims the default run is asserted against, each decided by paired seeds
                 # (the kit's rule for one run, course_utils.compare: each direction asserted here
                 # had room >= 2 in the default run; "random init > MAE" at the first budget had
                 # room 0.6 and is printed, not claimed. At the first budget SimCLR's and MoCo's
                 # means leaned below the kit's floor (room -0.2, -0.4) but above the lower,
                 # BatchNorm-calibrated one (-0.5, -0.7): no floor claim there. At the last
                 # budget MAE's mean leaned below both (room -0.7), which keeps "not all above")
                 labels_win=True, supervised_learns=True,
                 # not every self-supervised objective resolved above its floor at the last
                 # budget, so no ranking among them (the verdicts are printed, not asserted one by
                 # one: many correlated tests at 95% resolve one by chance often)
                 not_all_above_floor=True,
                 # the allocation claims, for every width each end budget's optimum may be (the
                 # largest budget's 256 and its tied neighbour 64): rooms 2.1 to 6.9
                 alloc_check=True),
    gpu=dict(image_size=32, width=64, vit_dim=192, decoder_dim=32, batch=256,
             budgets_gflops=[15_000.0, 30_000.0, 60_000.0], seeds=[0, 1, 2],
             simclr_temperature=0.2, moco_temperature=0.2, moco_queue=1024, proj_dim=64,
             train_limit=None, probe_train=10000, probe_test=10000, dataset="cifar10", calibration_images=10000,
             alloc_budgets_flops=[3.5e9, 1.4e10, 5.6e10], alloc_widths=[16, 64, 256, 1024, 4096],
             alloc_batch=1024, alloc_seeds=[0, 1], alloc_test_seeds=[2, 3], queue_flops_max=0.02,
             **NO_CLAIMS),
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
# different place — on extra views, on a key encoder without backward, on fewer patches (MoCo's
# queue of old keys costs memory, and almost no FLOPs) — so the same budget buys very different
# numbers of steps and of images seen. And a fixed budget must be split between model size and training
# length: the usual account (Kaplan et al. 2020, Hoffmann et al. 2022; cited here, not isolated below) is that too large a model gets too few
# steps and too small a model cannot use the data it is given.

# %% [markdown]
# ## The mechanism
#
# One function builds each model and its step (from `course_utils.objectives`); the ledger
# measures one step of each with the same batch of B images. Two backbone families keep the
# comparison like with like: SimCLR and MoCo run on the same ResNet as a supervised ResNet, and
# MAE (which needs patches, so a ViT) runs beside a supervised ViT of the same size, optimizer
# and data. SimCLR and MoCo use the temperatures of lessons 02 and 03 (`cfg.simclr_temperature`
# and `cfg.moco_temperature` are those lessons' defaults), but train far shorter than there (the
# budgets are printed below), so what those lessons found at their own budgets is a guide here,
# not a measurement. Every run then trains for the **same numbers of FLOPs** (steps = budget /
# FLOPs per step) and is probed.

# %%
FAMILY = {"supervised ResNet": "ResNet", "SimCLR": "ResNet", "MoCo": "ResNet",
          "supervised ViT": "ViT", "MAE": "ViT"}
BASELINE = {"ResNet": "supervised ResNet", "ViT": "supervised ViT"}


MAE_MASK_RATIO = 0.75   # the MAE paper's


def build(name, seed=cfg.seed):
    """-> (objective, optimizer, step): one constructor call per objective, one step builder.
    Within a family only the objective (and its head) differs: backbone, optimizer, LR, data and
    augmentation are the same. BatchNorm's batch follows the objective, as in each recipe:
    supervised normalises over B images, SimCLR over 2B views, MoCo's queries over two groups of
    B/2."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    if FAMILY[name] == "ViT":
        vit = ViT(image_size=cfg.image_size, patch_size=4, dim=cfg.vit_dim, depth=4, heads=4)
        model = (MAE(vit, mask_ratio=MAE_MASK_RATIO, decoder_dim=cfg.decoder_dim) if name == "MAE" else
                 Supervised(vit, nn.Linear(vit.feature_dim, num_classes))).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1.5e-3, weight_decay=0.05)
        # no augmentation in the ViT family: MAE's masking is its own corruption
        return model, opt, make_step(model, opt, generator=generator)
    backbone = SmallResNet(width=cfg.width)
    model = {"supervised ResNet": lambda: Supervised(backbone, nn.Linear(backbone.feature_dim, num_classes)),
             "SimCLR": lambda: SimCLR(backbone, ProjectionHead(backbone.feature_dim, 128, cfg.proj_dim),
                                      temperature=cfg.simclr_temperature),
             "MoCo": lambda: MoCo(backbone, ProjectionHead(backbone.feature_dim, 128, cfg.proj_dim),
                                  queue_size=cfg.moco_queue, momentum=0.99, temperature=cfg.moco_temperature,
                                  bn_groups=2)}[name]().to(device)
    # the key encoder of MoCo is trained by EMA, not by the optimizer
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    return model, opt, make_step(model, opt, augment=augment, generator=generator)


def core_seconds():
    """On CPU, CPU time / threads (`course_utils.runtime.core_seconds`): a proxy for an idle
    machine's wall-clock, not the wall-clock itself. It undercounts wherever an op runs on fewer
    threads than torch has, and on a crowded machine threads waiting for each other burn CPU time
    that counts, most for steps made of many small ops. Read it as a cost ranking, not a stopwatch."""
    return runtime.core_seconds() if device.type == "cpu" else time.perf_counter()


class UpdateClock:
    """Core-seconds spent inside optimizer.step(): the parameter update, which C does not count
    and which every step pays, whatever its FLOPs."""

    def __init__(self, optimizer):
        self.seconds, self._start = 0.0, 0.0
        optimizer.register_step_pre_hook(self._begin)
        optimizer.register_step_post_hook(self._end)

    def _begin(self, *_):
        self._start = core_seconds()

    def _end(self, *_):
        self.seconds += core_seconds() - self._start


OBJECTIVES = list(FAMILY)
batch = (train.images[:cfg.batch], train.labels[:cfg.batch])
print(f"{torch.get_num_threads()} threads on {device}")

# %% [markdown]
# ## Worked example: the ledgers of one step
#
# "FLOPs / image vs supervised" divides each objective's FLOPs per image by those of the
# supervised run of its own backbone. The two ViT steps are also counted per module with
# PyTorch's `FlopCounterMode` (whose per-op formulas the ledger's own counter borrows), to see
# where MAE's FLOPs go; that it and the ledger agree is two counters agreeing (asserted).

# %%
def flops_by_part(step, batch):
    """One step's FLOPs under FlopCounterMode, summed per part of the model: the encoder's
    transformer blocks (and, inside them, the attention L×L matmuls), the decoder, the total."""
    counter = FlopCounterMode(display=False)
    with counter:
        step(batch)
    parts = dict(total=counter.get_total_flops(), blocks=0, attention_matmuls=0, decoder=0)
    for module, ops in counter.get_flop_counts().items():
        path = module.split(".")
        if path[1:3] == ["encoder", "blocks"] and len(path) == 4:          # e.g. MAE.encoder.blocks.0
            parts["blocks"] += sum(ops.values())
        if path[1:3] == ["encoder", "blocks"] and path[-1] == "attn":      # QKᵀ and A·V are batched matmuls
            parts["attention_matmuls"] += ops.get(torch.ops.aten.bmm, 0)
        if path[1:] == ["decoder"]:
            parts["decoder"] += sum(ops.values())
    return parts


ledgers, vit_parts = {}, {}
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
    if FAMILY[name] == "ViT":
        vit_parts[name] = flops_by_part(step, batch)
    if name == "MoCo":
        queue_size, key_dim = model.queue.size, model.queue.dim

rec = {n: r["record"] for n, r in ledgers.items()}
flops_vs_supervised = {n: rec[n].flops / rec[BASELINE[FAMILY[n]]].flops for n in OBJECTIVES}
table = [{"objective": name, "backbone": FAMILY[name],
          "encoded now": ", ".join(f"{v} {k}" for k, v in rec[name].encoded.items()),
          "activation MB": rec[name].activation_bytes / 1e6, "cache KB": rec[name].cache_bytes / 1e3,
          "GFLOPs / image": rec[name].flops / cfg.batch / 1e9,
          "FLOPs / image vs supervised": flops_vs_supervised[name],
          "images per core-second": cfg.batch / ledgers[name]["seconds"]} for name in OBJECTIVES]
show_table(table)
print("MFU (ledger FLOPs per core-second of a step, against this machine's measured matmul peak; equal to per second with one thread):",
      ", ".join(f"{n} {utilisation(rec[n].flops, ledgers[n]['seconds'], device)['mfu']:.1%}" for n in OBJECTIVES))

# MAE's encoder blocks see a quarter of the tokens: a quarter of their per-token matmuls, and a
# sixteenth of the attention matmuls, which grow with tokens².
sup_vit, mae = vit_parts["supervised ViT"], vit_parts["MAE"]
attention_share = sup_vit["attention_matmuls"] / sup_vit["blocks"]
visible = 1 - MAE_MASK_RATIO
mae_blocks_predicted = (1 - attention_share) * visible + attention_share * visible ** 2
mae_blocks_measured = mae["blocks"] / sup_vit["blocks"]
mae_decoder_share = mae["decoder"] / mae["total"]

# %%
# NBVAL_CHECK_OUTPUT
L = (cfg.image_size // 4) ** 2
queue_logit_share = 4 * cfg.batch * queue_size * key_dim / rec["MoCo"].flops
# bookkeeping, not evidence: the ledger counts what the objectives were built to do
assert rec["SimCLR"].encoded["encoder images"] == 2 * cfg.batch              # two views, both with backward
assert rec["MoCo"].encoded["encoder images"] == rec["MoCo"].encoded["key encoder images"] == cfg.batch
assert rec["MAE"].encoded["encoder tokens"] == cfg.batch * int(L * visible)  # the visible patches
assert rec["MoCo"].cache_bytes >= queue_size * key_dim * 4 and rec["SimCLR"].cache_bytes == 0
assert vit_parts["MAE"]["total"] == rec["MAE"].flops                          # one counter, two readings
# two views through one encoder, both with backward: about twice one view, by construction
assert 1.8 < rec["SimCLR"].activation_bytes / rec["supervised ResNet"].activation_bytes < 2.2
assert 1.9 < flops_vs_supervised["SimCLR"] < 2.2, flops_vs_supervised
# MoCo's queue costs memory and almost no FLOPs: its logits, q·queueᵀ forward and its gradient
# for q backward, are 4·B·K·d of the step (CI's encoder is too small for "almost")
if cfg.queue_flops_max is not None:
    assert queue_logit_share < cfg.queue_flops_max, queue_logit_share
# identities of the construction, asserted so that a change to the kit is caught: the keys run
# under no_grad, so they keep nothing for backward; the key view, forward only, adds about a third
# of one trained view (a forward is about a third of forward + backward), plus the projector and
# queue logits
# (MoCo keeps what one trained view keeps, plus its projector and queue logits: less than half a
# view's worth above the supervised step, where a key encoder keeping its activations would add one)
view_kept = rec["SimCLR"].activation_bytes - rec["supervised ResNet"].activation_bytes
assert rec["MoCo"].activation_bytes - rec["supervised ResNet"].activation_bytes < 0.5 * view_kept
assert 1.25 < flops_vs_supervised["MoCo"] < 1.5, flops_vs_supervised
# identity, not evidence: the blocks' matmul FLOPs scale exactly with tokens (linear layers) and
# tokens² (attention), and there is no class token, so the formula is the counter's number
assert math.isclose(mae_blocks_measured, mae_blocks_predicted, rel_tol=1e-9), (mae_blocks_measured, mae_blocks_predicted)

# %%
print(f"Per image, against the supervised run of the same backbone: SimCLR spends "
      f"{flops_vs_supervised['SimCLR']:.2f}x the FLOPs (two views, both back-propagated), MoCo "
      f"{flops_vs_supervised['MoCo']:.2f}x (the key view is a forward without backward, about a third "
      f"of a training pass), MAE {flops_vs_supervised['MAE']:.2f}x. MoCo's queue logits are "
      f"{queue_logit_share:.1%} of its step.")
print(f"MAE's encoder blocks cost {mae_blocks_measured:.3f}x those of the supervised ViT: predicted "
      f"{1 - attention_share:.3f}·{visible:g} + {attention_share:.3f}·{visible:g}² = {mae_blocks_predicted:.3f} "
      f"(attention's L×L matmuls are {100 * attention_share:.1f}% of the supervised ViT's block FLOPs). "
      f"The decoder (width {cfg.decoder_dim}, the encoder's is {cfg.vit_dim}) runs on all {L} tokens and "
      f"costs {100 * mae_decoder_share:.0f}% of MAE's step.")

# %% [markdown]
# ## The evidence
#
# ### At matched compute budgets
#
# Every objective gets the same training FLOPs, converted to steps with its own measured FLOPs
# per step, and is then probed (linear probe on frozen encoder features). The floor is the kit's
# one random-init floor: the same encoder as built, before its first step, probed the same way.
# Each objective is trained from each of `seeds`; seed s of every objective draws its weights,
# data order and views from s, so the gains of two objectives can be compared seed by seed
# (`course_utils.compare`). A run uses a constant learning rate and is probed when it has spent
# each budget in `budgets_gflops`: with no schedule a shorter run is exactly a prefix of the
# longer one, so one run gives every budget (that probing a run on its way leaves it unchanged is
# checked by the kit's tests, `tests/test_evaluate.py`, for SimCLR and MoCo). Core-seconds are recorded next to FLOPs, and the
# part of them spent inside `optimizer.step()` separately: the update is not in C.

# %%
def budget_run(job):
    """One objective from one seed, probed at random init and when it has spent each budget: one
    row per budget."""
    name, seed = job
    model, opt, step = build(name, seed)
    update_clock = UpdateClock(opt)
    flops = rec[name].flops
    random_acc = probe_encoder(model.encoder, probe_train, test)["linear"]
    # the other floor (BatchNorm statistics measured on training images, lesson 02): printed
    # beside the kit's, and the floor claims are asserted against the lower of the two
    calibrated_acc = probe_encoder(batchnorm_calibrated(model.encoder, train.images[:cfg.calibration_images]),
                                   probe_train, test)["linear"]
    state, batches, seconds, rows = TrainState(), train.batches(cfg.batch, seed=seed), 0.0, []
    for budget in cfg.budgets_gflops:
        steps = max(1, int(budget * 1e9 / flops))
        start = core_seconds()
        fit(step, batches, steps=steps, state=state, desc=f"{name}, seed {seed}, to {budget:g} GFLOPs",
            progress=step_bars())   # resumes the same run
        seconds += core_seconds() - start
        acc = probe_encoder(model.encoder, probe_train, test)["linear"]
        rows.append({"objective": name, "seed": seed, "budget GFLOPs": budget, "steps": steps,
                     "images seen": steps * cfg.batch, "train GFLOPs": steps * flops / 1e9,
                     "core-seconds": seconds, "of which updates": update_clock.seconds,
                     "threads": torch.get_num_threads(), "probe (random init)": random_acc,
                     "probe (random init, BatchNorm calibrated)": calibrated_acc,
                     "probe (trained)": acc, "gain (points)": 100 * (acc - random_acc),
                     "gain over the lower floor (points)": 100 * (acc - min(random_acc, calibrated_acc))})
    return rows


# every (objective, seed) is an independent run: spread over the cores (map_runs), one thread each,
# the longest first (by the timed step above: seconds per step x steps to the last budget)
longest_first = sorted(OBJECTIVES, key=lambda n: -ledgers[n]["seconds"] / rec[n].flops)
budget_out = map_runs(budget_run, [(name, seed) for name in longest_first for seed in cfg.seeds],
                      device=device, desc="matched budgets (objective x seed)")
results = [row for rows in budget_out.values() for row in rows]   # one row per objective, seed and budget
gains, gains_lower_floor = {}, {}     # (objective, budget) -> {seed: gain in points}
for r in results:
    gains.setdefault((r["objective"], r["budget GFLOPs"]), {})[r["seed"]] = r["gain (points)"]
    gains_lower_floor.setdefault((r["objective"], r["budget GFLOPs"]), {})[r["seed"]] = r["gain over the lower floor (points)"]
mean_gain = {key: sum(by_seed.values()) / len(by_seed) for key, by_seed in gains.items()}
show_table([{"objective": name, "budget GFLOPs": budget,
             "steps": next(r["steps"] for r in results if r["objective"] == name and r["budget GFLOPs"] == budget),
             "probe (random init), mean": sum(r["probe (random init)"] for r in results if r["objective"] == name
                                              and r["budget GFLOPs"] == budget) / len(cfg.seeds),
             **{f"gain seed {s}": gains[(name, budget)][s] for s in cfg.seeds},
             "mean gain (points)": mean_gain[(name, budget)]}
            for name in OBJECTIVES for budget in cfg.budgets_gflops])
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
for name in OBJECTIVES:
    style = "o-" if FAMILY[name] == "ResNet" else "s--"
    line, = ax1.plot(cfg.budgets_gflops, [mean_gain[(name, b)] for b in cfg.budgets_gflops], style, label=name)
    for b in cfg.budgets_gflops:
        ax1.scatter([b] * len(cfg.seeds), list(gains[(name, b)].values()), s=10, color=line.get_color(), alpha=0.5)
    rows = [r for r in results if r["objective"] == name and r["seed"] == cfg.seeds[0]]
    ax2.plot([r["train GFLOPs"] for r in rows], [r["core-seconds"] for r in rows], style, label=name)
ax1.axhline(0, color="k", lw=0.5)
ax1.set_xlabel("budget GFLOPs"); ax1.set_ylabel("probe gain over random init (points)")
ax1.set_title(f"mean of {len(cfg.seeds)} seeds (dots: each seed)")
ax2.set_xlabel("training GFLOPs spent"); ax2.set_ylabel("core-seconds")
ax2.set_title(f"the same FLOPs, different seconds (seed {cfg.seeds[0]})"); ax1.legend(fontsize=8)
plt.tight_layout(); plt.show()

# %%
# NBVAL_CHECK_OUTPUT
for r in results:    # bookkeeping, not evidence: the budget was converted to steps correctly
    # the same FLOPs up to less than one step: one more step would have overspent the budget
    per_step = r["train GFLOPs"] / r["steps"]
    assert r["budget GFLOPs"] - per_step < r["train GFLOPs"] <= r["budget GFLOPs"] * (1 + 1e-9) or r["steps"] == 1, r

# %% [markdown]
# Every claim below is a paired comparison over the seeds: the difference seed by seed, its mean
# and 95% interval, and a verdict the interval decides ("A > B", "B > A" or "not resolved at this
# scale"; `course_utils.compare`). Within a family the arms share the backbone's initial weights,
# the optimizer, the learning rate, the data order and the augmentation recipe (not its draws:
# SimCLR and MoCo draw two views a step, the supervised run one); what differs is the
# objective (its loss, its head, one view or two, MoCo's key encoder and queue, and with them
# BatchNorm's batch: B images, 2B views, or two groups of B/2 for MoCo's queries), and, the FLOPs
# being matched, the number of steps each can afford (printed). The supervised run uses the
# labels, so it is a reference for what these FLOPs can buy on this task, not an opponent.

# %%
first, last = cfg.budgets_gflops[0], cfg.budgets_gflops[-1]
SSL_BASELINE = {n: BASELINE[FAMILY[n]] for n in OBJECTIVES if n not in BASELINE.values()}
floor = {s: 0.0 for s in cfg.seeds}      # a gain is measured from its own seed's random init
one_image = 100 / len(test.labels)       # points: the smallest difference a probe can show
def paired(a, b, names):
    return compare_paired(a, b, names, resolution=one_image)
# each self-supervised objective against its floor, at every budget: does it leave it?
left_floor = {(name, b): paired(gains[(name, b)], floor, (name, "random init"))
              for name in SSL_BASELINE for b in cfg.budgets_gflops}
# the same against the lower of the two floors (as built, BatchNorm calibrated), seed by seed:
# the stricter test of a claim that an objective has not left its floor
left_lower_floor = {(name, b): paired(gains_lower_floor[(name, b)], floor, (name, "lower random init"))
                    for name in SSL_BASELINE for b in cfg.budgets_gflops}
# within one backbone, the labels against each self-supervised objective, at every budget
labels_vs_ssl = {(name, b): paired(gains[(sup, b)], gains[(name, b)], (sup, name))
                 for name, sup in SSL_BASELINE.items() for b in cfg.budgets_gflops}
# the supervised runs learn: their gain at the last budget, and last against first budget
supervised_gain = {sup: paired(gains[(sup, last)], floor, (sup, "random init"))
                   for sup in BASELINE.values()}
supervised_grows = {sup: paired(gains[(sup, last)], gains[(sup, first)],
                                        (f"{sup} at {last:g}", f"at {first:g} GFLOPs"))
                    for sup in BASELINE.values()}
for title, group in (("self-supervised gain over random init (points)", left_floor),
                     ("the same over the lower floor, seed by seed: as built or BatchNorm calibrated, "
                      "whichever probes lower (points)", left_lower_floor),
                     ("labels against self-supervision, same backbone (points)", labels_vs_ssl),
                     ("supervised gain over random init at the last budget", supervised_gain),
                     ("supervised gain, last budget against first", supervised_grows)):
    print(title)
    for key, c in group.items():
        print(f"  {'' if isinstance(key, str) else f'{key[1]:g} GFLOPs: '}{c.describe()}")

floor_moves = {n: [100 * (r["probe (random init)"] - r["probe (random init, BatchNorm calibrated)"])
                   for r in results if r["objective"] == n and r["budget GFLOPs"] == first] for n in SSL_BASELINE}
print("the floor as built minus calibrated, per seed (points): " + "; ".join(
    f"{n} " + ", ".join(f"{v:+.1f}" for v in moves) for n, moves in floor_moves.items()))
at_last = {n: [r for r in results if r["objective"] == n and r["budget GFLOPs"] == last] for n in OBJECTIVES}
def mean_of(rows, field):
    return sum(r[field] for r in rows) / len(rows)
seconds_per_tflop = {n: mean_of(rows, "core-seconds") / (rows[0]["train GFLOPs"] / 1e3) for n, rows in at_last.items()}
mae_vs_vit_seconds = seconds_per_tflop["MAE"] / seconds_per_tflop["supervised ViT"]
mae_vs_vit_steps = at_last["MAE"][0]["steps"] / at_last["supervised ViT"][0]["steps"]
mae_vs_vit_updates = mean_of(at_last["MAE"], "of which updates") / mean_of(at_last["supervised ViT"], "of which updates")
mae_extra_seconds = mean_of(at_last["MAE"], "core-seconds") - mean_of(at_last["supervised ViT"], "core-seconds")
mae_extra_update_seconds = (mean_of(at_last["MAE"], "of which updates")
                            - mean_of(at_last["supervised ViT"], "of which updates"))

# %%
# NBVAL_CHECK_OUTPUT
if cfg.labels_win:         # within one backbone, the labels win at the last budget (paired over the seeds)
    for name in SSL_BASELINE:
        c = labels_vs_ssl[(name, last)]
        assert c.verdict == c.direction, (name, c.describe())
if cfg.not_all_above_floor:   # no ranking: at the last budget not every objective has left its floor:
    for group in (left_floor, left_lower_floor):   # MAE carries it, against either floor
        mae_vs_floor = group[("MAE", last)]
        assert mae_vs_floor.holds(not_reversed(f"{mae_vs_floor.names[1]} > MAE")), mae_vs_floor.describe()
# MAE's steps have fewer FLOPs than the supervised ViT's (measured; the evidence), so the same budget
# buys it more steps (an identity of steps = budget / FLOPs per step)
assert flops_vs_supervised["MAE"] < 1 and mae_vs_vit_steps > 1, (flops_vs_supervised["MAE"], mae_vs_vit_steps)
if cfg.supervised_learns:  # ... and the supervised runs do learn, more by the last budget than the first
    for sup in BASELINE.values():
        for c in (supervised_gain[sup], supervised_grows[sup]):
            assert c.verdict == c.direction, (sup, c.describe())

# %%
for floor_name, group in (("the kit's floor", left_floor), ("the lower floor", left_lower_floor)):
    resolved = [f"{name} {'above' if c.mean > 0 else 'below'} it at {b:g} GFLOPs ({c.mean:+.1f} points, room "
                f"{c.room:.1f})" for (name, b), c in group.items() if c.verdict != NOT_RESOLVED]
    print(f"Against {floor_name}, resolved: " + (", ".join(resolved) if resolved else "none")
          + f"; the other {len(group) - len(resolved)} of {len(group)} self-supervised runs and budgets: not "
          "resolved. None is claimed: a direction with room under 1 would be claimed only as not reversed, "
          "and these are printed, not asserted one by one (below).")
def side(c):
    """+1 resolved above the floor, -1 below it, 0 not resolved."""
    return 0 if c.verdict == NOT_RESOLVED else 1 if c.verdict == c.direction else -1


flips = [f"{name} at {b:g} GFLOPs" for (name, b), c in left_floor.items()
         if side(c) != side(left_lower_floor[(name, b)])]
print("Where the two floors give different verdicts: " + (", ".join(flips) if flips else "nowhere"))
print(f"At the last budget ({last:g} GFLOPs) the runs took, in core-seconds (mean of {len(cfg.seeds)} seeds): "
      + ", ".join(f"{n} {mean_of(rows, 'core-seconds'):.0f}" for n, rows in at_last.items())
      + f" ({results[0]['threads']} thread{'s' if results[0]['threads'] > 1 else ''} per run).")
print(f"MoCo's last budget buys {at_last['MoCo'][0]['steps']} steps of {cfg.batch} images "
      f"({at_last['MoCo'][0]['images seen']} images), SimCLR's {at_last['SimCLR'][0]['steps']} steps.")
print("core-seconds per training TFLOP: " + ", ".join(f"{n} {s:.0f}" for n, s in seconds_per_tflop.items()))
print(f"For the same FLOPs MAE took {mae_vs_vit_seconds:.2f}x the core-seconds of the supervised ViT. "
      f"It ran {mae_vs_vit_steps:.1f}x as many steps, and its parameter updates took "
      f"{mae_vs_vit_updates:.1f}x the supervised ViT's core-seconds: {mae_extra_update_seconds:.1f} of MAE's "
      f"{mae_extra_seconds:.1f} extra core-seconds (the updates explain "
      f"{mae_extra_update_seconds / mae_extra_seconds:.0%}; the rest is not attributed here).")

# %% [markdown]
# Read the left plot within a family. At the last budget each supervised run beats the
# self-supervised runs of its own backbone, with a paired interval above zero, and each
# supervised run has left its random init and gained more by the last budget than by the first
# (asserted where the config makes the claim; every verdict and interval is printed above, the
# earlier budgets' too, where not every one is resolved).
#
# Whether each self-supervised run has left its floor is printed budget by budget as a verdict,
# against two floors: the kit's (the network as built; the runs it resolves are listed above
# with their mean gains) and the stricter one for a claim that an objective has not left its
# floor, the lower of it and the same network with BatchNorm statistics calibrated on training
# images (lesson 02), seed by seed. The choice moves a ResNet's floor (printed above, per seed;
# the ViT has no BatchNorm, so its floors are one), and for the ResNet family the verdict can
# depend on it at any budget: where the two floors give different verdicts is printed above
# (a direction against one floor can be "not resolved", or even the other direction, against
# the other). So no self-supervised objective's place against its floor is claimed one by one.
# One thing is asserted at the default scale, against both floors, a not-reversed claim under
# the kit's rule for one run (the preset records the rooms): at the last budget MAE is not
# resolved above its floor (its mean leans below it), so not every self-supervised objective is
# *resolved* above its floor at this scale (`not_all_above_floor`; an unresolved interval cannot
# rule out a gain of a few points, so this is not evidence that MAE learned nothing); SimCLR's and
# MoCo's verdicts there are printed. A run resolved below the kit's floor probes worse than the
# network as built, whose BatchNorm running statistics are their initial values: against the
# calibrated floor the same run can sit above (where the floors disagree is printed), so "below
# the floor" may be the running statistics, not worse weights (printed, not claimed). The other verdicts are printed, not asserted one by one: with this
# many correlated comparisons at 95% (one per objective and budget, counted above), one resolved by chance would be no surprise, and one reseed could
# move it; a small gain resolved above the floor (its mean is printed) is a start, not a result.
# "Not resolved at this scale" is a statement about these seeds and budgets, not evidence of no
# learning. Either way the self-supervised gains are small beside the labels' at the last budget
# (the labels win there, asserted); that is a
# statement about these budgets (their core-seconds are printed
# above), not about the objectives. MoCo's steps here are printed above;
# lesson 03 trains it for longer (and with AdamW and weight decay, where this lesson's ResNet
# family uses Adam), over several seeds, and prints its gain over the floor there with the
# paired interval, and the kit's SSL benchmark, longer still, leaves the floor far behind
# (below); MAE's reconstruction objective
# is known to need far longer, and even converged MAE features are known to be weak under a
# *linear* probe (He et al. 2022 report a large gap between linear probing and fine-tuning);
# lesson 04 measures what MAE does learn. A ranking *among* the self-supervised objectives is not
# attempted: they differ in backbone (MAE a ViT) and in untuned recipes; a paired SimCLR − MoCo comparison on the same ResNet would need no floor, but the
# families' recipes here were set for the matched-FLOP comparison with the labels, not tuned per
# objective, so this lesson leaves it to lesson 13 (which compares them at matched FLOPs).
#
# FLOPs are not seconds. The budget is matched in FLOPs, and C counts only matmuls. A step also
# pays costs that do not grow with its FLOPs: the optimizer update over every parameter, the
# Python and dispatch cost of launching each op, drawing the mask, gathering the visible tokens.
# MAE's steps have fewer FLOPs than the supervised ViT's, so at the same budget it takes more steps
# (the ratio is printed above) and pays those costs more often, including one update per step:
# its core-seconds per FLOP and its update core-seconds are printed beside the supervised ViT's,
# with the share of MAE's extra core-seconds that the updates explain; how the rest splits
# between dispatch, masking and gathers is not measured here.
# They are measurements of this machine at its load when the lesson ran, printed and not
# asserted (a wall-clock figure belongs in a benchmark, not in a test of the lesson): the
# right-hand plot is the cost a reader actually pays here.

# %% [markdown]
# ### C ≈ 6·N·D, checked on the kit's models
#
# For a dense model, each parameter does one multiply-add (2 FLOPs) per token forward and two
# backward (gradients with respect to inputs and weights): C ≈ 6·N·D for N parameters and D
# tokens. The exact count, layer by layer, is what the rule approximates. A layer l with a weight
# of N_l entries that one image uses P_l times (output positions H·W of a convolution, tokens of
# a linear layer, 1 for a head that runs once per image) costs 2·N_l·P_l FLOPs per image
# forward, 2·N_l·P_l for its weight gradient and 2·N_l·P_l for its input gradient — except the
# first layer, whose input (the images) needs no gradient. Attention adds its two L×L matmuls
# (QKᵀ and A·V: 4·L²·d FLOPs per block forward for a model width d, not to be confused with the
# tokens D of 6·N·D; three times that per training step) without
# parameters. For a batch of B images:
#
# C = B · (6·Σ_l N_l·P_l − 2·N_1·P_1 + Σ_blocks 12·L²·d)
#
# Biases and normalisation parameters are in N but in no matmul. N counts every parameter, as
# Hoffmann et al. (2022) do; Kaplan et al. (2020) leave out embedding parameters, whose lookups are
# no matmul (here they would land in "params in no matmul"). Written against 6·N·D, the exact
# count is 6ND plus four corrections: attention (+), the first layer's missing input gradient
# (−), parameters outside any matmul (−), and weights used more or fewer times than once per
# token (±). Forward hooks read N_l, P_l and L from one forward pass; the ledger's FLOP counter
# measures one training step, and the two must agree exactly.

# %%
def weight_uses(model, images):
    """-> (uses, attention) from one forward pass with hooks. uses: [(N_l, P_l)] for every
    Linear/Conv2d in call order, N_l = weight entries, P_l = uses per image = output elements per
    image / output channels; attention: [(L, D)] for every Attention call."""
    uses, attention = [], []

    def weight_hook(module, inputs, output):
        channels = module.out_channels if isinstance(module, nn.Conv2d) else module.out_features
        uses.append((module.weight.numel(), output.numel() // (output.shape[0] * channels)))

    def attention_hook(module, inputs, output):
        attention.append(tuple(inputs[0].shape[1:]))
    hooks = [m.register_forward_hook(weight_hook) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    hooks += [m.register_forward_hook(attention_hook) for m in model.modules() if isinstance(m, Attention)]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
    return uses, attention


def step_flops_terms(model, images, tokens_per_image):
    """One training step's matmul FLOPs as 6·N·D plus four corrections, D = B·tokens_per_image.
    The terms sum to B·(6·Σ N_l·P_l − 2·N_1·P_1 + Σ 12·L²·D), the exact count."""
    uses, attention = weight_uses(model, images)
    b, n = len(images), count_parameters(model)
    (first_weights, first_uses), weights = uses[0], sum(n_l for n_l, _ in uses)
    return {"6ND": 6 * n * b * tokens_per_image,
            "attention": b * sum(12 * tokens ** 2 * dim for tokens, dim in attention),
            "first layer, no input gradient": -2 * b * first_weights * first_uses,
            "params in no matmul": -6 * b * tokens_per_image * (n - weights),
            "weights used ≠ once per token": 6 * b * sum(n_l * (p_l - tokens_per_image) for n_l, p_l in uses)}


def six_nd_row(name, model, inputs, targets, tokens_per_image):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
    measured = measure(step, model=model).flops
    terms = step_flops_terms(model, inputs, tokens_per_image)
    return {"model": name, "N params": count_parameters(model), "D": len(inputs) * tokens_per_image,
            "measured FLOPs": measured, "exact sum": sum(terms.values()),
            "measured / 6ND": measured / terms["6ND"],
            **{f"{k} / 6ND": v / terms["6ND"] for k, v in terms.items() if k != "6ND"}}


b = 32
xs, ys = torch.rand(b, 3, 32, 32, device=device), torch.randint(0, 10, (b,), device=device)
torch.manual_seed(0)
mlp_6nd = MLP(3 * 32 * 32, 1024, 10, layers=3).to(device)
vit_6nd = ViT(image_size=32, patch_size=8, dim=256, depth=4, heads=4, num_classes=10).to(device)
cnn_6nd = SmallResNet(width=16, num_classes=10).to(device)
rows_6nd = [
    six_nd_row("MLP 3072-1024-1024-10 (D = images)", mlp_6nd, xs, ys, 1),
    six_nd_row(f"ViT dim 256, 4 blocks (D = images × {vit_6nd.num_patches} tokens)", vit_6nd, xs, ys,
               vit_6nd.num_patches),
    six_nd_row("SmallResNet width 16 (D = images)", cnn_6nd, xs, ys, 1),
]
show_table(rows_6nd)
mlp_row, vit_row, cnn_row = rows_6nd
mlp_r, vit_r, cnn_r = (r["measured / 6ND"] for r in rows_6nd)
CORRECTIONS = ("attention", "first layer, no input gradient", "params in no matmul", "weights used ≠ once per token")
VIT_6ND_TOLERANCE, CNN_MISFIT = 0.02, 2      # the claims below: "within 2%", "off by more than 2x"
first_layer_share = (3 * 32 * 32 * 1024) / count_parameters(mlp_6nd)
mlp_predicted = 1 - first_layer_share / 3
# the CNN against 6ND with D counted in positions, at each resolution its convolutions work at
cnn_positions = sorted({p_l for _, p_l in weight_uses(cnn_6nd, xs)[0] if p_l > 1}, reverse=True)
cnn_vs_positions = {p: cnn_row["measured FLOPs"] / (6 * cnn_row["N params"] * b * p) for p in cnn_positions}

# %%
# NBVAL_CHECK_OUTPUT
for r in rows_6nd:      # the layer-by-layer sum is the counter's number, to the FLOP
    assert r["measured FLOPs"] == r["exact sum"], r
assert abs(mlp_r - mlp_predicted) < 0.01, (mlp_r, mlp_predicted)   # the first layer is the only big term
assert abs(vit_r - 1) < VIT_6ND_TOLERANCE, "transformer with few tokens: 6ND is close"
assert all(abs(vit_row[k + " / 6ND"]) < VIT_6ND_TOLERANCE for k in CORRECTIONS), vit_row
# ... and they partly cancel: attention adds, the other three subtract
assert vit_row["attention / 6ND"] > 0 and all(vit_row[k + " / 6ND"] < 0 for k in CORRECTIONS[1:]), vit_row
# counting D in positions at the first stage's resolution overcounts, at the last stage's undercounts
assert cnn_vs_positions[cnn_positions[0]] < 1 / CNN_MISFIT and cnn_vs_positions[cnn_positions[-1]] > CNN_MISFIT, \
    cnn_vs_positions

# %%
print(f"MLP: measured {mlp_r:.3f} of 6ND; the first layer holds {100 * first_layer_share:.0f}% of the "
      f"weights and costs 4 instead of 6 FLOPs each, which predicts 1 - {first_layer_share:.3f}/3 = "
      f"{mlp_predicted:.3f}; biases add {100 * mlp_row['params in no matmul / 6ND']:+.2f}%.")
print(f"ViT ({vit_6nd.num_patches} tokens of width {vit_6nd.dim}): measured {vit_r:.4f} of 6ND = 1 " + " ".join(
    f"{100 * vit_row[k + ' / 6ND']:+.2f}% ({k})" for k in CORRECTIONS)
      + f"; asserted: total and each term within {100 * VIT_6ND_TOLERANCE:.0f}%.")
print(f"CNN: {cnn_r:.0f}x 6ND with D counted in images; with D counted in positions: " + ", ".join(
    f"{r:.2f} at {p} positions per image" for p, r in cnn_vs_positions.items())
      + f" (asserted: off by more than {CNN_MISFIT}x at the first stage's and at the last stage's resolution).")

# %% [markdown]
# The layer-by-layer sum equals the counter's number exactly for all three models (asserted),
# so the corrections to 6ND printed above are the whole story. The MLP is not "slightly" under
# 6ND: it is under by the first layer's share of the weights divided by three, because nobody
# needs the gradient of the raw input — and in this MLP the first layer holds most of the
# weights. In a deep network, where the first layer is a sliver of N, the same effect is
# negligible. The ViT lands close to 6ND (asserted, tolerance printed) because each of its four
# corrections is small (each asserted within the same tolerance) and they partly cancel:
# attention's L×L matmuls add; the patch embedding's missing input gradient, the biases and
# LayerNorms (in N, in no matmul) and the head (which runs once per image, not once per token)
# subtract. Per image and block, attention costs 12·L²·d against 6·N_block·L for the block's
# weights (N_block ≈ (4 + 2·mlp)·d²), so its share grows with the tokens against the width, L/d:
# with sequences long beside the width 6ND undercounts (Kaplan et al. 2020 neglect the term while
# d_model > n_ctx/12; this lesson measures one L only, printed above). For the CNN no single D works: each
# convolution reuses its weight at every output position, and the stages work at different
# resolutions, so D counted in positions at the first stage's resolution overcounts and at the
# last stage's undercounts, each by more than the factor printed (asserted); a resolution in
# between lands nearer by the accident of this architecture, not by a rule. The per-layer sum,
# 6·Σ N_l·P_l less the stem's missing input gradient, is exact.

# %% [markdown]
# ### Allocation: at a fixed C, which model size? And how does the answer move as C grows?
#
# C = 6·N·D fixes the product of parameters and data, not their split. To see the split we need
# a task where data never repeats (so a small model sees *more* distinct examples, never the same
# ones again — no overfitting) and where capacity matters. A procedural task gives both for free:
# inputs x ~ N(0, I) of dimension `ALLOC_DIM`, drawn fresh at every step, labelled by a fixed,
# randomly initialised "teacher" MLP (`ALLOC_CLASSES` classes: the argmax of its outputs). The
# students are 2-layer MLPs of hidden width h. For these MLPs 6ND overstates a step's FLOPs (the
# first layer holds most of the weights and needs no input gradient, as above), so a run with
# budget C gets steps = C / (exact FLOPs of one step of B examples), from the layer-by-layer sum
# above; every example is seen once (one epoch by construction), and the learning rate decays
# linearly to zero over *its own* run length. Every (C, h) point is trained with each seed in
# `alloc_seeds` (initialisation and example stream), which pick the best widths, and the points
# the claims compare again with each seed in `alloc_test_seeds`, which decide them; each run is
# scored by its loss on held-out examples from the same teacher. The seed-to-seed spread of a
# point (printed) shows how much a seed moves one run; the claims are paired (seed s of every
# width sees the same example stream), so what they must beat is the spread of the paired
# differences, each printed with its interval.

# %%
ALLOC_DIM, ALLOC_CLASSES = 16, 4
torch.manual_seed(cfg.seed + 1)
teacher = MLP(ALLOC_DIM, 256, ALLOC_CLASSES, layers=2).to(device).requires_grad_(False)


def teacher_examples(generator, n):
    """n fresh examples: x ~ N(0, I) drawn from the generator, y = the teacher's class."""
    x = torch.randn(n, ALLOC_DIM, generator=generator).to(device)
    with torch.no_grad():
        return x, teacher(x).argmax(1)


x_test, y_test = teacher_examples(torch.Generator().manual_seed(10_000), 4000)
# a second held-out draw picks each budget's best width, so that the test loss that then compares
# widths is not the one that chose them (choosing on it would favour the winner)
x_val, y_val = teacher_examples(torch.Generator().manual_seed(20_000), 4000)


def summed_step_flops(net):
    """One student step's FLOPs at batch `alloc_batch`, by the layer-by-layer sum above."""
    return sum(step_flops_terms(net, x_test[:cfg.alloc_batch], tokens_per_image=1).values())


def train_student(hidden, c_flops, seed):
    torch.manual_seed(seed)
    start = core_seconds()
    net = MLP(ALLOC_DIM, hidden, ALLOC_CLASSES, layers=2).to(device)
    step_flops = summed_step_flops(net)
    steps = max(1, int(c_flops // step_flops))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / steps)
    stream = torch.Generator().manual_seed(seed)      # per seed, the same example stream for every width
    fit(make_step(Supervised(net), opt, scheduler=schedule),
        lambda epoch: (teacher_examples(stream, cfg.alloc_batch) for _ in range(steps)), steps=steps,
        desc=f"h={hidden}, C={c_flops:.1e}, seed {seed}", progress=step_bars())
    with torch.no_grad():
        logits, val_logits = net(x_test), net(x_val)
    return {"C FLOPs": c_flops, "hidden": hidden, "seed": seed, "N params": count_parameters(net),
            "steps": steps, "examples seen": steps * cfg.alloc_batch,
            "FLOPs / step vs 6NB": step_flops / (6 * count_parameters(net) * cfg.alloc_batch),
            "validation loss": F.cross_entropy(val_logits, y_val).item(),
            "test loss": F.cross_entropy(logits, y_test).item(),
            "test acc": (logits.argmax(1) == y_test).float().mean().item(),
            "core-seconds": core_seconds() - start}


# every (C, width, seed) is an independent run, spread over the cores (map_runs, one thread each:
# students this small gain nothing from a second thread, only its waiting); the largest C first
grid = [(c, h, s) for c in sorted(cfg.alloc_budgets_flops, reverse=True) for h in cfg.alloc_widths
        for s in cfg.alloc_seeds]
runs = list(map_runs(lambda job: train_student(job[1], job[0], job[2]), grid, device=device,
                     desc="allocation runs").values())
alloc_seconds = sum(r["core-seconds"] for r in runs)
alloc = []                    # one row per (C, width): the mean over seeds, and their spread
for c in cfg.alloc_budgets_flops:
    for h in cfg.alloc_widths:
        seeds = [r for r in runs if r["C FLOPs"] == c and r["hidden"] == h]
        losses = [r["test loss"] for r in seeds]
        alloc.append({**{k: seeds[0][k] for k in ("C FLOPs", "hidden", "N params", "steps", "examples seen",
                                                  "FLOPs / step vs 6NB")},
                      "validation loss": sum(r["validation loss"] for r in seeds) / len(seeds),
                      "test loss": sum(losses) / len(losses), "best seed": min(losses), "worst seed": max(losses),
                      "seed spread": max(losses) - min(losses),
                      "test acc": sum(r["test acc"] for r in seeds) / len(seeds)})
show_table(alloc)
best = {c: min((r for r in alloc if r["C FLOPs"] == c), key=lambda r: r["validation loss"])
        for c in cfg.alloc_budgets_flops}   # chosen on the validation draw, compared on the test draw
seed_spread = max(r["seed spread"] for r in alloc)
fig, ax = plt.subplots(figsize=(5.5, 3.5))
for c in cfg.alloc_budgets_flops:
    rows = [r for r in alloc if r["C FLOPs"] == c]
    line = ax.errorbar([r["N params"] for r in rows], [r["test loss"] for r in rows],
                       yerr=[[r["test loss"] - r["best seed"] for r in rows], [r["worst seed"] - r["test loss"] for r in rows]],
                       fmt="o-", capsize=3, label=f"C = {c:.1e}")
    ax.plot(best[c]["N params"], best[c]["test loss"], "*", ms=14, color=line[0].get_color())
ax.set_xscale("log")
ax.set_xlabel("parameters N (at fixed C)"); ax.set_ylabel(f"test loss (mean of {len(cfg.alloc_seeds)} seeds)")
ax.set_title("bars: best to worst seed"); ax.legend(); plt.show()
for c in cfg.alloc_budgets_flops:
    print(f"C = {c:.1e} FLOPs: best hidden on the validation draw {best[c]['hidden']} ({best[c]['N params']} params, "
          f"{best[c]['examples seen']} fresh examples)")
ratios = [r["FLOPs / step vs 6NB"] for r in alloc]


def student_step_flops(hidden):
    """(one student step's FLOPs by the ledger's counter, by the layer-by-layer sum train_student uses)"""
    net = MLP(ALLOC_DIM, hidden, ALLOC_CLASSES, layers=2).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    batch = (x_test[:cfg.alloc_batch], y_test[:cfg.alloc_batch])
    counted = measure(lambda: make_step(Supervised(net), opt)(batch), model=net, optimizer=opt).flops
    return counted, summed_step_flops(net)


student_flops = {h: student_step_flops(h) for h in cfg.alloc_widths}
params_of = {h: next(r["N params"] for r in alloc if r["hidden"] == h) for h in cfg.alloc_widths}
print("one width step multiplies N by " + ", ".join(f"{params_of[b] / params_of[a]:.2f}" for a, b in zip(cfg.alloc_widths, cfg.alloc_widths[1:]))
      + "; one budget step multiplies C by " + ", ".join(f"{b / a:.2f}" for a, b in zip(cfg.alloc_budgets_flops, cfg.alloc_budgets_flops[1:])))
print(f"A step costs {min(ratios):.3f}-{max(ratios):.3f} of 6·N·B across these widths. "
      f"Largest seed-to-seed spread of a point's test loss: {seed_spread:.3f} nats. "
      f"{len(runs)} runs in {alloc_seconds:.0f} core-seconds, one thread each.")

# %%
best_hidden = [best[c]["hidden"] for c in cfg.alloc_budgets_flops]
smallest, largest = cfg.alloc_budgets_flops[0], cfg.alloc_budgets_flops[-1]
# the claims are decided on fresh seeds: new initialisations and example streams, trained only where
# a claim needs them, so the seed luck that picked a width cannot carry into its comparison
def neighbours(width):
    """The widths next to ``width`` on the grid (one or two)."""
    i = cfg.alloc_widths.index(width)
    return [w for w in cfg.alloc_widths[max(0, i - 1):i + 2] if w != width]


# each end budget's best width and its grid neighbours, at both end budgets, and the widest and
# narrowest widths where the trade-off claims need them
near_best = {h: [h, *neighbours(h)] for h in (best_hidden[0], best_hidden[-1])}
compared = {(c, h) for c in (smallest, largest) for h in near_best[best_hidden[0]] + near_best[best_hidden[-1]]} | \
           {(smallest, cfg.alloc_widths[-1]), (largest, cfg.alloc_widths[0])}
fresh_runs = map_runs(lambda job: train_student(job[1], job[0], job[2]),
                      [(c, h, s) for c, h in sorted(compared, reverse=True) for s in cfg.alloc_test_seeds],
                      device=device, desc="fresh seeds").values()
test_loss = {}   # (C, width) -> {fresh seed: test loss}; seed s of every width saw the same example stream
for r in fresh_runs:
    test_loss.setdefault((r["C FLOPs"], r["hidden"]), {})[r["seed"]] = r["test loss"]
print(f"the compared points, each from the fresh seeds {cfg.alloc_test_seeds}: "
      + ", ".join(f"h={h} at C={c:.1e}" for c, h in sorted(compared)))


def loss_comparison(c, worse, better):
    """Paired over the fresh seeds: the test loss of width `worse` minus width `better`, at budget c."""
    return compare_paired(test_loss[(c, worse)], test_loss[(c, better)],
                          (f"loss of h={worse} at C={c:.1e}", f"of h={better}"))


# where the optimum lies within one grid step: each end's best width against its neighbours
optimum_vs_neighbours = {(c, h, w): loss_comparison(c, w, h)
                         for c, h in ((smallest, best_hidden[0]), (largest, best_hidden[-1])) for w in neighbours(h)}
for (c, h, w), comparison in optimum_vs_neighbours.items():
    print(f"best width {h} at C={c:.1e} against its neighbour {w}: {comparison.describe(digits=3)}")
# which widths each end budget's optimum may be: every width trained there on the fresh seeds
# that they do not place behind another width trained there (a tie with the best, or the best).
# Which of them a draw of seeds picks is luck, so every claim below must hold for each of them
def behind(c, w, v):
    """Whether the fresh seeds place width w behind width v at budget c (its loss resolved higher)."""
    comparison = loss_comparison(c, w, v)
    return comparison.verdict == comparison.direction


widths_at = {c: sorted(h for cc, h in compared if cc == c) for c in (smallest, largest)}
contenders = {c: [w for w in hs if not any(behind(c, w, v) for v in hs if v != w)] for c, hs in widths_at.items()}
print("the widths each end budget's optimum may be: "
      + "; ".join(f"C={c:.1e}: {', '.join(map(str, hs))}" for c, hs in contenders.items()))
claim_points = {}
for h_small in contenders[smallest]:
    for h_large in contenders[largest]:
        # the move is not noise: each end budget's optimum beats the other end's optimum there
        claim_points[f"largest C: the small-C optimum h={h_small} loses to h={h_large}"] = (largest, h_small, h_large)
        claim_points[f"smallest C: the large-C optimum h={h_large} loses to h={h_small}"] = (smallest, h_large, h_small)
for h_small in contenders[smallest]:   # the trade-off's sides: the widest model gets too few steps at
    claim_points[f"smallest C: the widest loses to h={h_small}"] = (smallest, cfg.alloc_widths[-1], h_small)
for h_large in contenders[largest]:    # the smallest C, the narrowest cannot use its data at the largest
    claim_points[f"largest C: the narrowest loses to h={h_large}"] = (largest, cfg.alloc_widths[0], h_large)
# two claims that name the same comparison here (e.g. the small-C optimum is the narrowest width)
# are one piece of evidence: merged, and said so; a width against itself is no claim (it fails the
# claim that the optimum moves, asserted below)
by_points = {}
for name, points in claim_points.items():
    if points[1] != points[2]:
        by_points.setdefault(points, []).append(name)
allocation_claims = {" = ".join(names): loss_comparison(*points) for points, names in by_points.items()}
for name, c in allocation_claims.items():
    print(f"{name}: {c.describe(digits=3)}")

# %%
# NBVAL_CHECK_OUTPUT
# evidence: the steps train_student counts are the ledger counter's, at every width
assert all(counted == summed for counted, summed in student_flops.values()), student_flops
# identity, not evidence: with no attention every correction to 6ND is negative for an MLP (the first
# layer needs no input gradient, biases are in no matmul), so a step costs under 6·N·B
assert max(ratios) < 1, ratios
if cfg.alloc_check:
    assert min(contenders[largest]) > max(contenders[smallest]), ("more compute moves the best width right", contenders)
    # the widths the validation draw picked are among the ones the fresh seeds could not rule out
    assert best_hidden[0] in contenders[smallest] and best_hidden[-1] in contenders[largest], (best_hidden, contenders)
    for name, c in allocation_claims.items():
        assert c.verdict == c.direction, (name, c.describe(digits=3))

# %% [markdown]
# At a fixed budget the widest student ends above the best width's test loss at the smallest
# budget, and the narrowest at the largest (asserted by paired seeds: seed s of every width saw the same
# stream of examples, so the difference is taken seed by seed and decided by its interval). As C
# grows, the best width (by the mean over `alloc_seeds` of a second held-out draw, the validation
# draw) moves right (asserted: it is larger at the largest budget than at the smallest, and at each
# of those two budgets its best width beats the other's, paired). A width that the fresh seeds do
# not place behind any other width trained at an end budget could have been picked by another
# draw of seeds, so each such width counts as that budget's optimum (the "widths each end budget's
# optimum may be", printed): every claim is asserted for each of them. The widths are chosen on
# `alloc_seeds` and every comparison is decided on `alloc_test_seeds`, fresh initialisations and
# example streams trained again for the compared points only: the seeds whose luck picked the best
# width are not the seeds that test it, and the test draw is not the draw that chose it. (The set
# of widths each claim must hold for is itself filtered on the fresh seeds, each width dropped
# from it only by a comparison those seeds resolve.) Why the widest
# loses at the smallest budget is not separated here: it gets the fewest steps (the budget over
# its step's FLOPs, printed above), and it trains with the one learning rate chosen for every
# width, decayed over its own short run, so too few steps and a learning rate that may not suit
# its width change together; the usual reading, that a model too large gets too few steps and one
# too small cannot use the data it sees, is the scaling-law papers', cited, not isolated. The claims are
# asserted where the default run measured them clear of zero by at least a half-width (the kit's
# rule for one run, `course_utils.compare`; the preset records it); two claims that name the same
# comparison (the small-C optimum can be the narrowest width) are printed once, as one. Where
# exactly the optimum lies is another matter: each end's best width against its grid neighbours
# is printed, and a width the fresh seeds do not place behind another means the optimum is known
# only to within that grid step (which is why every such width is a contender above); where the
# best width is the grid's narrowest or widest, it is bounded on one side only (at the smallest
# budget the narrowest width wins: a narrower one, off the grid, could be better still). Between
# neighbouring budgets it may stay on the same point of this coarse grid. How the data at the best width moves is not
# resolved here: one step of the width grid multiplies N by about as much as one budget step
# multiplies C, so the best point can move along a line of nearly constant data — the fresh
# examples the best student sees are printed above. What grows with C here is the model; whether
# the data should grow with it too, the question the scaling-law papers fit, this grid cannot
# answer.
#
# What this cannot tell you: the *exponents*. With a few seeds per point, a coarse grid of widths
# and only a few budgets, the best width is known only to within one grid step, so "N* grows like
# C^a" cannot be fitted (Kaplan et al. 2020 and Hoffmann et al. 2022 disagree on the exponent a,
# each fitted on many training runs: Hoffmann et al. report over 400 models, a figure cited,
# not re-checked). The learning rate is one value for every width, not tuned per
# size; the task is a random teacher, not language or images; and a Gaussian-input MLP has
# nothing like attention, embeddings or a data distribution with a long tail.

# %% [markdown]
# ## The boundary
#
# - The matched-budget comparison counts matmul FLOPs only (augmentation, normalisation, masking
#   and the optimizer update are not in C), which is one reason why core-seconds per FLOP differ
#   between objectives. It measures one small model per family, a few seeds, one untuned learning
#   rate per family (only the temperatures come from lessons 02 and 03), a few budgets (their
#   core-seconds are printed above) and a constant learning rate: it says where each objective
#   *spends* compute and what each buys at these budgets, not which one wins at scale (there, SSL
#   pre-training is judged by linear probes, fine-tuning and transfer after full-length training,
#   not by a probe after a run this short). The gpu scale runs the same code but asserts none of these claims:
#   they were set on the CPU default and have not been run on a GPU.
# - **These budgets are the start of training.** Each run here spends the core-seconds printed
#   above. The kit's SSL benchmark (`benchmarks/bench_ssl_quality.py`) gives SimCLR,
#   MoCo, SimSiam and MAE a fixed budget of steps each on the same kind of shapes (the steps its
#   time budget bought on the machine that calibrated it), many times the steps a run
#   here takes (at least `MIN_BENCHMARK_STEPS_RATIO`, asserted) (a budget set by time, not matched FLOPs; its steps, seeds and the ratio to this
#   lesson's last budget are printed below); in its committed result
#   (`benchmarks/results/ssl_quality.json`, read below where the repository is at hand) SimCLR,
#   MoCo and MAE, the objectives trained here, have left their random-init floors far behind on
#   shapes, by at least the benchmark's goal on every seed. Its recipes differ from this
#   lesson's beyond length: AdamW with weight decay for each (this lesson's ResNet family uses
#   Adam without), and its MAE regresses normalised patches (`norm_pix_loss`, which lesson 04
#   resolves above plain pixels for a linear probe) where this lesson's regresses plain pixels.
#   So the benchmark shows that some recipe with many times the steps leaves the floor
#   far behind; length and recipe are not separated here. The small self-supervised gains
#   measured here are the start of training, not where it ends; lesson 13 sets SimSiam's start
#   beside SimCLR's and MoCo's at matched FLOPs over several seeds.
# - C ≈ 6ND holds for dense layers used once per token. It ignores attention's L²-term (large for
#   long sequences) and the first layer's missing input gradient, needs D in tokens (images ×
#   patches for a ViT) and has no single D for a CNN whose stages work at different resolutions
#   (the layer-by-layer sum above is exact), and says nothing about memory.
# - The allocation experiment shows that the best model size grows with compute when data never
#   repeat, at one learning rate and schedule shared by every width (a per-width tuned rate could
#   move each optimum); it does not say how fast, nor where the optimum lies for real models.

# %%
# evidence for the boundary's pointer: the SSL benchmark's committed rows on shapes
ssl = committed_result("ssl_quality")
if ssl is None:
    print("benchmarks/results/ssl_quality.json is not here (the kit runs without its repository)")
else:
    ssl_gains = ssl_quality_gains(ssl, "shapes", ("simclr", "moco", "mae"))
    weakest = min(ssl_gains, key=ssl_gains.get)
    print(f"SSL benchmark, shapes, {len(ssl['config']['seeds'])} seeds: SimCLR, MoCo and MAE gain "
          f"{ssl_gains[weakest]:+.1f} points or more over its own random init (the least: {weakest[0]}, "
          f"seed {weakest[1]}; the benchmark's goal: +{ssl['config']['goal_gain_points']})")
    assert ssl_gains[weakest] >= ssl["config"]["goal_gain_points"], ssl_gains
    benchmark_steps = {n: [run["steps"] for run in ssl["datasets"]["shapes"][n.lower()]["seeds"].values()]
                       for n in ("SimCLR", "MoCo", "MAE")}
    steps_ratio = {n: min(steps) / at_last[n][0]["steps"] for n, steps in benchmark_steps.items()}
    print(f"its training steps per seed against this lesson's at {last:g} GFLOPs: " + ", ".join(
        f"{n} {min(benchmark_steps[n])}-{max(benchmark_steps[n])} vs {at_last[n][0]['steps']} "
        f"({steps_ratio[n]:.1f}x or more)" for n in benchmark_steps))
    MIN_BENCHMARK_STEPS_RATIO = 4
    print(f"(asserted: more than {MIN_BENCHMARK_STEPS_RATIO}x each)")
    assert min(steps_ratio.values()) > MIN_BENCHMARK_STEPS_RATIO, steps_ratio

# %% [markdown]
# ## Exercises
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.
#
# Two predictions about the allocation experiment's students, `MLP(d, h, c, layers=2)`, each
# checked against the ledger's FLOP counter on a live training step. The configuration (input
# width, hidden width, classes, batch, budget) is yours, drawn from `STUDENT_ID`. With no ID it is
# the lesson's own: the allocation experiment's input width and classes and one of its student
# widths, and at the default scale its batch and middle budget (asserted):

# %%
from course_utils.exercises import check_close
from course_utils.variants import exercise_variant

VARIANT_CHOICES = dict(d=(16, 32, 64), h=(64, 16, 256, 1024), c=(4, 10, 16),
                       batch=(256, 32, 64, 128), budget_flops=(1.4e9, 3.5e8, 5.6e9))
task = exercise_variant("05_compute_budget", STUDENT_ID, **VARIANT_CHOICES)
_own = exercise_variant("05_compute_budget", None, **VARIANT_CHOICES)   # with no ID
assert (_own.d, _own.c) == (ALLOC_DIM, ALLOC_CLASSES) and _own.h in cfg.alloc_widths, _own
if cfg.scale == "default":
    assert (_own.batch, _own.budget_flops) == (cfg.alloc_batch, sorted(cfg.alloc_budgets_flops)[1]), _own
task

# %% [markdown]
# The tests measure FLOPs with this helper: one training step (forward, loss, backward) of the
# student, counted by the ledger.

# %%
def _measured(batch, d, h, c):
    torch.manual_seed(0)
    net = MLP(d, h, c, layers=2)
    xx, yy = torch.rand(batch, d), torch.randint(0, c, (batch,))
    return measure(lambda: F.cross_entropy(net(xx), yy).backward(), model=net).flops


# Every variant affords at least one step under either count: a step's FLOPs grow with each
# size, so the largest student at the largest batch on the smallest budget is the hardest case.
_big = {k: max(VARIANT_CHOICES[k]) for k in ("batch", "d", "h", "c")}
_big_params = count_parameters(MLP(_big["d"], _big["h"], _big["c"], layers=2))
assert min(VARIANT_CHOICES["budget_flops"]) >= max(_measured(**_big), 6 * _big_params * _big["batch"])
# %% [raw]
# # BEGIN QUESTION
# name: q1_mlp_training_flops
# points: 2

# %% [markdown]
# **Exercise 1 — predict, then measure: a student's exact step FLOPs.** Write
# `mlp_step_flops(batch, d, h, c)`: the training-step FLOPs (forward + backward, matmuls only) of
# `MLP(d, h, c, layers=2)` at batch B, from the layer-by-layer count above. Why is it less than
# 6·N·B? The test measures one step for `task.batch`, `task.d`, `task.h`, `task.c`.

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
check_close(mlp_step_flops(task.batch, task.d, task.h, task.c), _measured(task.batch, task.d, task.h, task.c),
            rtol=0, what=f"training-step FLOPs of MLP({task.d}, {task.h}, {task.c}) at batch {task.batch}")

# %%
# HIDDEN
for _b, _d, _h, _c in [(1, 1, 1, 1), (16, 64, 32, 10), (3, 5, 7, 2)]:
    check_close(mlp_step_flops(_b, _d, _h, _c), _measured(_b, _d, _h, _c), rtol=0,
                what=f"training-step FLOPs of MLP({_d}, {_h}, {_c}) at batch {_b}")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_steps_missed_by_6nd
# points: 2

# %% [markdown]
# **Exercise 2 — predict, then measure: what 6·N·D gets wrong about a budget.** Your student
# `MLP(task.d, task.h, task.c, layers=2)` trains at batch `task.batch` on a budget of
# `task.budget_flops` FLOPs on fresh examples every step, as in the allocation experiment
# (steps = budget // FLOPs of one step, rounded down; every configuration here affords at least
# one step, even under the plan). How many more steps does it get with the
# exact step FLOPs than a plan that counts 6·N·B per step (N = all parameters)? Set
# `extra_steps` (negative if the plan gives more). The test counts N and measures a step.

# %% [raw]
# # BEGIN SOLUTION

# %%
extra_steps = int(task.budget_flops // mlp_step_flops(task.batch, task.d, task.h, task.c)) - int(task.budget_flops // (6 * (task.d * task.h + task.h + task.h * task.c + task.c) * task.batch))  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_n_params = count_parameters(MLP(task.d, task.h, task.c, layers=2))
_expected = int(task.budget_flops // _measured(task.batch, task.d, task.h, task.c)) - \
    int(task.budget_flops // (6 * _n_params * task.batch))
check_close(extra_steps, _expected, rtol=0,
            what=f"steps gained over a 6·N·B plan by MLP({task.d}, {task.h}, {task.c}) at batch {task.batch}, "
                 f"budget {task.budget_flops:.2g} FLOPs")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Summary

# %%
headline(
    flops_per_image_simclr_vs_supervised=flops_vs_supervised["SimCLR"],
    flops_per_image_moco_vs_supervised=flops_vs_supervised["MoCo"],
    flops_per_image_mae_vs_supervised_vit=flops_vs_supervised["MAE"],
    mae_encoder_block_flops_vs_supervised_vit=mae_blocks_measured,
    **{f"mean_gain_points_{n.replace(' ', '_')}_at_{last:g}_gflops": mean_gain[(n, last)] for n in OBJECTIVES},
    **{f"verdict_vs_floor_{n}_at_{b:g}_gflops": c.verdict + ("" if c.verdict == NOT_RESOLVED else f" (room {c.room:.1f})")
       for (n, b), c in left_floor.items() if b == last},
    # each with its room: under 1, the kit's rule reads a resolved direction as "not reversed" only
    **{f"verdict_vs_lower_floor_{n}_at_{b:g}_gflops": c.verdict + ("" if c.verdict == NOT_RESOLVED else f" (room {c.room:.1f})")
       for (n, b), c in left_lower_floor.items() if b == last},
    **{f"labels_vs_{n}_at_{b:g}_gflops": c.describe(digits=1) for (n, b), c in labels_vs_ssl.items() if b == last},
    mae_core_seconds_per_flop_vs_supervised_vit=mae_vs_vit_seconds,
    mlp_flops_over_6nd=mlp_r,
    vit_flops_over_6nd=vit_r,
    best_alloc_hidden_smallest_to_largest_c=f"{best_hidden[0]} -> {best_hidden[-1]}",
    alloc_contenders_smallest_to_largest_c=" -> ".join("/".join(map(str, contenders[c])) for c in (smallest, largest)),
    best_alloc_hidden_against_neighbours="; ".join(f"{h} vs {w} at C={c:.1e}: {comparison.verdict}" for (c, h, w), comparison
                                                   in optimum_vs_neighbours.items()),
    alloc_seed_spread_nats=seed_spread,
)
