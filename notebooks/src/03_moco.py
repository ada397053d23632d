# %% [markdown]
# # 03 · MoCo: candidates from history, kept consistent by a slow momentum
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/03_moco.ipynb)
#
# SimCLR pays for every candidate with an image in the batch (lesson 02). MoCo keeps a queue
# (the source text's 历史字典, history dictionary; the paper's "dictionary as a queue") of K keys from past batches and compares each query against all
# of them: the candidates move from **kept for backward** (a whole view's activations each) to
# **cached** (one d-float key each), though each key still costs the step a logits column and a
# queue-snapshot row kept for backward (measured below). The price is staleness, and the cure is a
# key encoder that changes slowly.

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
import copy
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from course_utils.augment import SimCLRAugment
from course_utils.data import load_dataset
from course_utils.evaluate import batchnorm_calibrated, probe_encoder
from course_utils.ledger import measure
from course_utils.models import ProjectionHead, SmallResNet, count_parameters
from course_utils.objectives import MoCo, SimCLR, make_step
from course_utils.objectives.moco import FeatureQueue, bn_group_overlap, encode_in_groups, shuffle_batch
from course_utils.compare import compare_paired, not_reversed
from course_utils.report import committed_result, headline, show_table
from course_utils.runtime import map_runs, setup, step_bars
from course_utils.scales import config
from course_utils.train import Callback, EvalEvery, fit

cfg = config(
    SCALE,
    ci=dict(image_size=16, width=8, blocks=(1, 1, 1),
            batch=16, queue=64, dim=32, steps=8, stale_steps=6, probe_every=2,
            seeds=(0, 1, 2), sweep_queues=(32, 64, 128), sweep_steps=6, lr=2e-3,
            temperature=0.2, crop_scale=(0.6, 1.0), color_strength=1.0, rotate=True,
            probe_claim=False, late_gain_claim=None,
            stale_cos_m099_min=None,
            sweep_claims=None, loss_climb_tol=None,
            train_limit=512, probe_train=256, probe_test=256, dataset="shapes"),
    default=dict(image_size=16, width=16, blocks=(1, 1, 1),
                 batch=128, queue=1024, dim=64, steps=500, stale_steps=100, probe_every=125,
                 seeds=(0, 1, 2, 3, 4), sweep_queues=(256, 1024, 4096), sweep_steps=250, lr=2e-3, temperature=0.2,
                 crop_scale=(0.6, 1.0), color_strength=1.0, rotate=True,
                 # the probe against random init, by the kit's rule for one run
                 # (course_utils.compare): claimed as not reversed. At 500 steps (which keep the
                 # lesson near 2 minutes alone) its interval's lower edge sat just below zero
                 # (room -0.0: not resolved), and against the stricter of the two floors (the
                 # asserted one) just above it (room 0.0); at 1000 steps its nearer edge stood 0.3
                 # half-widths clear. The late gain (steps 251-500 over 1-250) had room 0.6 from
                 # the kit's floor and was not resolved from the lower, BN-calibrated one (mean
                 # -0.4 points): printed, not claimed. The staleness thresholds were set from
                 # seed 0's default run and are asserted on every seed (1-4: fresh data); the
                 # staleness verdict's edge stood 1.5 half-widths clear
                 probe_claim=True, late_gain_claim=None,
                 stale_cos_m099_min=0.98,
                 sweep_claims=True,
                 loss_climb_tol=0.5,
                 train_limit=5000, probe_train=2000, probe_test=1000, dataset="shapes"),
    # gpu: a half-width CIFAR ResNet-18, sized by tools/gpu_budget.py to fit 15 minutes on a T4
    gpu=dict(image_size=32, width=32, blocks=(2, 2, 2, 2),
             batch=256, queue=16384, dim=128, steps=1000, stale_steps=100, probe_every=500,
             seeds=(0, 1, 2), sweep_queues=(4096, 16384, 65536), sweep_steps=500,
             lr=2e-3, temperature=0.2, crop_scale=(0.2, 1.0), color_strength=0.5, rotate=False,
             probe_claim=False, late_gain_claim=None,   # not measured on a GPU yet
             stale_cos_m099_min=None,
             sweep_claims=None, loss_climb_tol=None,
             train_limit=None, probe_train=10000, probe_test=10000, dataset="cifar10"),
)
# the main run is seed cfg.seeds[0]; the K sweep measures one step of its final model per K
assert cfg.queue in cfg.sweep_queues and cfg.sweep_steps % cfg.probe_every == 0
assert cfg.seeds[0] == cfg.seed and len(cfg.seeds) >= 3
assert cfg.stale_steps <= cfg.sweep_steps <= cfg.steps
device = setup(SCALE, seed=cfg.seed)
train = load_dataset(cfg.dataset, "train", image_size=cfg.image_size, device=device,
                     download=SCALE == "gpu", limit=cfg.train_limit)
test = load_dataset(cfg.dataset, "test", image_size=cfg.image_size, device=device,
                    download=SCALE == "gpu", limit=cfg.probe_test)
probe_train = train.subset(cfg.probe_train, seed=1)
# as in lesson 02: on 16-px "shapes" large crops, strong colour jitter and random quarter turns
augment = SimCLRAugment(cfg.image_size, crop_scale=cfg.crop_scale, color_strength=cfg.color_strength,
                        rotate=cfg.rotate)
print(train, test, sep="\n")


MOMENTUM = 0.99        # the recipe's m (the paper: 0.999 at its scale; see the boundary)


def build_moco(momentum=MOMENTUM, queue=cfg.queue, shuffle_keys=True, seed=cfg.seed):
    torch.manual_seed(seed)
    backbone = SmallResNet(width=cfg.width, blocks=cfg.blocks)
    return MoCo(backbone, ProjectionHead(backbone.feature_dim, 128, cfg.dim), queue_size=queue,
                momentum=momentum, temperature=cfg.temperature, bn_groups=2,
                shuffle_keys=shuffle_keys).to(device)

# %% [markdown]
# ## The problem
#
# Contrastive learning wants many candidates; in SimCLR each one is an image whose two views are
# encoded and kept for backward, so in the plain implementation the number of negatives is capped
# by activation memory (lesson 02's gradient caching is one way around that cap). In SimCLR every
# candidate also gets a gradient: the loss pushes it away from the anchor, and that gradient flows
# into its encoder. MoCo gives that up by design: its keys (the positive and the negatives) get no
# gradient, because back-propagating through K keys is what it set out to avoid. Could
# yesterday's encodings serve as negatives, then? Only if they are still comparable with today's
# queries and with each other: the queue holds keys written by many past encoders, so the key
# encoder must change *slowly* (the momentum update below; the MoCo paper reports that m = 0, an
# exact copy of the query encoder at every step, fails to train).

# %% [markdown]
# ## The mechanism
#
# - **Query encoder** f_q (backbone + projection head), trained by backprop.
# - **Key encoder** f_k: a deep copy of f_q with `requires_grad=False`; its parameters are
#   updated only by momentum, θ_k ← m·θ_k + (1−m)·θ_q (`MoCo.momentum_update`, under `no_grad`). It is a second full set of
#   weights kept for the whole run — resident state, like the queue.
# - **Queue** (`FeatureQueue`): a K×d ring buffer, a registered *buffer* of the module — so it is
#   in the state dict, in checkpoints and in the ledger's cache line. Each step enqueues the B new
#   keys at `ptr` and advances `ptr = (ptr + B) % K`, overwriting the oldest.
# - **Logits** [q·k₊ | q·queueᵀ] / T, B×(1+K), positive in column 0; cross-entropy with target 0.
# - **Shuffle-BN on one device**: the batch is encoded as `bn_groups` chunks, each with its own
#   BatchNorm statistics, and the keys are shuffled before chunking, so the group that normalises a
#   key is a random draw rather than its query's own group. The leak it fights: a key normalised
#   with the statistics of the same images as its query's group (other views of them, through the
#   key encoder) carries a fingerprint of that batch, which the
#   queue's older keys lack, so the positive can be picked out by statistics instead of content.
#   With two groups, a key's group still shares about half its members with its query's group:
#   the shuffle *reduces the shared BN statistics*, it does not remove them (measured below);
#   whether that shared part still leaks enough to matter is a separate question, which this
#   lesson does not decide (one run per arm is printed below, no claim is made).

# %% [markdown]
# ## Worked example: one step, line by line

# %%
model = build_moco()
x = train.images[:cfg.batch]
view_q, view_k = augment.two_views(x, torch.Generator().manual_seed(0))
q = model.encode_queries(view_q)                    # B×d, with graph
k = model.encode_keys(view_k, torch.Generator().manual_seed(1))   # B×d, no graph
logits = model.contrastive_logits(q, k)             # B×(1+K)
target = torch.zeros(len(q), dtype=torch.long, device=device)
loss = nn.functional.cross_entropy(logits, target)
print(f"q {tuple(q.shape)} requires_grad={q.requires_grad}; k {tuple(k.shape)} requires_grad={k.requires_grad}")
print(f"logits {tuple(logits.shape)}: 1 positive + K={cfg.queue} negatives per query "
      "(B×(1+K) by construction of the concatenation: an identity, not a measurement)")
loss.backward()

# %% [markdown]
# **Why the first loss is below log(1+K).** If the positive were no more similar to the query than
# the K negatives, the expected loss would be about log(1+K). At the start the freshly built queue
# holds random unit vectors, uncorrelated with everything on average (each cosine has a spread of
# about 1/√d around 0), while *any* real key — from any
# image — comes out of the same random network as the query and points roughly where the query
# points. The temperature T (`cfg.temperature`, MoCo v2's 0.2; v1 used 0.07) divides every cosine
# before the softmax, so a gap in cosine becomes a gap in logits 1/T times larger: the printout
# below gives the positive's lead over the queue in logits: by Jensen's inequality the first loss
# sits at most K/(1+K) times that lead below log(1+K), query by query (an identity, asserted), since the spread of the K negatives' logits around their mean (Jensen's
# inequality on the log-sum-exp) takes some of it back. Two counterfactuals separate "a real key against a random queue" from "the image's own
# key": (a) put a random queue key in the positive's place (averaged over which of the K it is;
# the K keys are then all the candidates, so "no closer than the others" means about log K), and
# (b) put *another image's* key there.

# %%
with torch.no_grad():
    cos_pos = (q * k).sum(1).mean().item()                         # query · its own key
    cos_other = (q @ k.t())[~torch.eye(len(q), dtype=torch.bool, device=device)].mean().item()
    cos_queue = (q @ model.queue.keys.t()).mean().item()           # query · initial queue
    neg = logits[:, 1:]
    # a queue key as "positive", averaged over which of the K it is (the K keys are then all the
    # candidates): log-sum-exp of the K logits minus their mean, per query
    loss_random_pos = (torch.logsumexp(neg, 1) - neg.mean(1)).mean().item()
    loss_other_pos = nn.functional.cross_entropy(
        torch.cat([(q * k.roll(1, 0)).sum(1, keepdim=True) / cfg.temperature, neg], 1), target).item()
start_loss, log_1k = loss.item(), math.log(1 + cfg.queue)
show_table([
    {"positive column holds": "the image's own key (real step)", "mean cos to query": cos_pos, "loss": start_loss},
    {"positive column holds": "another image's key", "mean cos to query": cos_other, "loss": loss_other_pos},
    {"positive column holds": "a random initial queue key (mean over the K)", "mean cos to query": cos_queue, "loss": loss_random_pos},
])
other_share = (log_1k - loss_other_pos) / (log_1k - start_loss)
print(f"log(1+K) = {log_1k:.3f}; the first step's loss is {log_1k - start_loss:.2f} nats below it. "
      f"The positive sits at cosine {cos_pos:.2f}, the random queue at {cos_queue:+.3f}; "
      f"another image's key sits at {cos_other:.2f} ({cos_other / cos_pos:.2f} of the positive's cosine). "
      f"With another image's key as the positive the loss is still {log_1k - loss_other_pos:.2f} nats "
      f"below log(1+K): {100 * other_share:.0f}% of the first step's drop needs only *a real key against "
      f"a random queue*; the image's own key adds the remaining {100 * (1 - other_share):.0f}%.")
print(f"at T = {cfg.temperature}, the positive leads the queue by (cos_pos − cos_queue)/T = "
      f"{(cos_pos - cos_queue) / cfg.temperature:.2f} in logits")

# %%
# NBVAL_CHECK_OUTPUT
assert start_loss < log_1k - 0.5, "the first loss is clearly below log(1+K)"
# with a queue key as the positive there are K candidates: Jensen puts the mean loss at log K or
# above (an identity); the evidence is that it sits near log K, the keys' logits spread little
log_k = math.log(cfg.queue)
assert log_k - 1e-6 <= loss_random_pos < log_k + 0.5, "a positive no closer than a negative gives ~log K"
assert cos_pos > cos_queue + 0.2 and abs(cos_queue) < 0.05, "positive close, random queue orthogonal"
assert loss_other_pos < log_1k - 0.5 and cos_other > 0.7 * cos_pos, \
    "at init any image's key is nearly as close as the positive: the gap is not yet learned"
assert other_share > 0.7, "most of the low start is a real key against a random queue, not the pair"
# identity, not evidence (Jensen: a log-sum-exp is at least the log of the count plus the mean
# logit): per query, log(1+K) − loss ≤ K/(1+K) · (positive logit − mean negative logit)
lead_per_query = logits[:, 0] - logits[:, 1:].mean(1)
assert log_1k - start_loss <= cfg.queue / (1 + cfg.queue) * lead_per_query.mean().item() + 1e-5

# %% [markdown]
# So the low start says little about learning: it is mostly the random initial queue. Once K/B
# steps have replaced the random queue with real keys, the negatives are real keys too and the
# loss rises toward log(1+K) (the loss curve below shows it; the staleness cell prints and asserts
# how far it rises on every seed, and that a queue of real keys keeps it there: a control run
# from the same seeds, whose queue is drawn at random again after every step, stays lower over the
# same steps, by more than half a nat on average, paired by seed; the measured gap is printed
# there. The control differs in its negatives and, from its first step, in its weights too, so the
# gap is what the queue's contents do to the loss over those steps; it does not separate reading
# the loss against random keys from training against them: random keys alone keep a loss low at
# initialisation, as the table above shows).

# %% [markdown]
# ## The evidence
#
# **The key encoder receives no gradient**, the query encoder does. That much is an identity of
# the construction (`MoCo` switches the key encoder's `requires_grad` off); the evidence is what
# *does* move it. Two real training steps (forward, backward, AdamW): the first makes θ_q differ
# from θ_k, and across the second θ_k must become exactly m·θ_k + (1−m)·θ_q of the weights before
# it, the query encoder's weights as they were before that step's update. An optimizer that also
# touched the key encoder, or an update that ignored m, would fail it:

# %%
# NBVAL_CHECK_OUTPUT
assert all(p.grad is None and not p.requires_grad for p in model.key_encoder.parameters())  # identity
assert all(p.grad is not None for p in model.query_encoder.parameters())

ema_model = build_moco()
ema_optimizer = torch.optim.AdamW(ema_model.query_encoder.parameters(), lr=cfg.lr)
ema_views = augment.two_views(x, torch.Generator().manual_seed(2))


def one_training_step():
    ema_optimizer.zero_grad()
    ema_model(*ema_views).backward()
    ema_optimizer.step()


one_training_step()
key_before = [p.detach().clone() for p in ema_model.key_encoder.parameters()]
query_before = [p.detach().clone() for p in ema_model.query_encoder.parameters()]
assert any(not torch.equal(k, q) for k, q in zip(key_before, query_before)), "step 1 moves θ_q away from θ_k"
one_training_step()
m = ema_model.momentum
assert all(torch.equal(p, k.mul(m).add(q, alpha=1 - m)) for p, k, q in
           zip(ema_model.key_encoder.parameters(), key_before, query_before)), "θ_k moves by the EMA alone"
assert all(p.grad is None for p in ema_model.key_encoder.parameters())
print(f"after a second training step, every key-encoder weight equals {m}·θ_k + {1 - m:.2f}·θ_q of the "
      "weights before it, bit for bit")

# %% [markdown]
# **The queue is exactly FIFO.** Tag each key with its global index; after at least K + B keys
# (whole batches) have been enqueued, exactly the newest K remain — also when B does not divide K (the batch
# that reaches the end wraps around to the start).

# %%
# NBVAL_CHECK_OUTPUT
for size, b in [(12, 4), (10, 4)]:
    fifo = FeatureQueue(size, 2)
    for i in range(math.ceil((size + b) / b)):
        tagged = torch.zeros(b, 2)
        tagged[:, 0] = torch.arange(i * b, (i + 1) * b)
        fifo.enqueue(tagged)
    total = math.ceil((size + b) / b) * b
    assert sorted(fifo.keys[:, 0].tolist()) == list(range(total - size, total))
    assert int(fifo.ptr) == total % size

# %% [markdown]
# **Negatives per anchor = K, whatever the batch.** An identity check of the implementation (the
# logits are [positive | queue], so this holds by construction), not evidence of anything learned:

# %%
# NBVAL_CHECK_OUTPUT
for b in (8, 16, cfg.batch):
    xb = train.images[:b]
    assert model.contrastive_logits(model.encode_queries(xb), model.encode_keys(xb)).shape == (b, 1 + cfg.queue)

# %% [markdown]
# **The ledger: what MoCo keeps, and what K in-batch negatives would cost.** One MoCo step is
# measured with the queue registered as a cache. `measure(model=moco, ...)` books the parameters
# of the *whole* module, so its `param_bytes` line holds two encoders: the query encoder and the
# momentum key encoder, a full copy that gets neither gradients nor optimizer state. The table
# splits that line. Beside it, what SimCLR would keep for backward to give every anchor the same
# K negatives (K/2 + 1 images, two views each), extrapolated from its measured bytes per image (a
# lower bound: its 2N×2N similarity matrix grows with the square of the images, not linearly).

# %%
moco = build_moco()
opt = torch.optim.Adam(moco.query_encoder.parameters(), lr=cfg.lr)
mstep = make_step(moco, opt, augment=augment, generator=torch.Generator().manual_seed(0))
mstep((x, None))
rec_moco = measure(lambda: mstep((x, None)), model=moco, optimizer=opt, caches=moco.caches,
                   encoders=moco.ledger_encoders)
query_bytes = 4 * count_parameters(moco.query_encoder)
key_bytes = 4 * count_parameters(moco.key_encoder)
queue_bytes = moco.queue.keys.numel() * 4

torch.manual_seed(cfg.seed)
bb = SmallResNet(width=cfg.width, blocks=cfg.blocks)
simclr = SimCLR(bb, ProjectionHead(bb.feature_dim, 128, cfg.dim)).to(device)
sopt = torch.optim.Adam(simclr.parameters(), lr=cfg.lr)
sstep = make_step(simclr, sopt, augment=augment, generator=torch.Generator().manual_seed(0))
rec_simclr = measure(lambda: sstep((x, None)), model=simclr, optimizer=sopt)
simclr_per_image = rec_simclr.activation_bytes / cfg.batch
simclr_for_k = simclr_per_image * (cfg.queue // 2 + 1)
in_batch_vs_queue = simclr_for_k / rec_moco.cache_bytes
show_table([
    {"MoCo resident state": "query encoder (trained)", "MB": query_bytes / 1e6, "ledger line": "param_bytes"},
    {"MoCo resident state": "key encoder (momentum copy)", "MB": key_bytes / 1e6, "ledger line": "param_bytes"},
    {"MoCo resident state": "gradients (query encoder only)", "MB": rec_moco.grad_bytes / 1e6, "ledger line": "grad_bytes"},
    {"MoCo resident state": "Adam state (query encoder only)", "MB": rec_moco.optimizer_bytes / 1e6, "ledger line": "optimizer_bytes"},
    {"MoCo resident state": f"queue ({cfg.queue}×{cfg.dim} keys + bookkeeping)", "MB": rec_moco.cache_bytes / 1e6, "ledger line": "cache_bytes"},
])
show_table([
    {"": "MoCo step", "negatives per anchor": cfg.queue, "cache MB": rec_moco.cache_bytes / 1e6,
     "activation MB": rec_moco.activation_bytes / 1e6, "encoded": ", ".join(f"{k} {v}" for k, v in rec_moco.encoded.items())},
    {"": f"SimCLR, batch {cfg.batch}", "negatives per anchor": 2 * cfg.batch - 2, "cache MB": 0.0,
     "activation MB": rec_simclr.activation_bytes / 1e6, "encoded": "2B views"},
    {"": f"SimCLR for {cfg.queue} negatives (extrapolated)", "negatives per anchor": cfg.queue,
     "cache MB": 0.0, "activation MB": simclr_for_k / 1e6, "encoded": f"{cfg.queue + 2} views"},
])

# the same two lines at the MoCo paper's scale: a ResNet-50 key encoder (128-d output) and
# K = 65536 keys of d = 128, counted on the meta device (no memory, no arithmetic)
import torchvision
with torch.device("meta"):
    paper_key_bytes = 4 * count_parameters(torchvision.models.resnet50(num_classes=128))   # v1: linear head
    # v2: the MLP head 2048-2048-128 puts one 2048-wide hidden layer before the same output layer
    paper_key_bytes_v2 = paper_key_bytes + 4 * count_parameters(torch.nn.Linear(2048, 2048))
paper_queue_bytes = 65536 * 128 * 4
print(f"Here the key-encoder copy is {key_bytes / 1e6:.2f} MB against {queue_bytes / 1e6:.2f} MB "
      f"of queued keys (keys only, without bookkeeping; {key_bytes / queue_bytes:.1f}x); at the paper's scale {paper_key_bytes / 1e6:.0f} MB "
      f"against {paper_queue_bytes / 1e6:.1f} MB ({paper_key_bytes / paper_queue_bytes:.1f}x with MoCo v1's linear head, "
      f"{paper_key_bytes_v2 / paper_queue_bytes:.1f}x with v2's MLP head).")
print(f"Giving every anchor K={cfg.queue} negatives in-batch would keep {simclr_for_k / 1e6:.1f} MB "
      f"for backward; the queue's cache line alone is {rec_moco.cache_bytes / 1e6:.3f} MB, {in_batch_vs_queue:.0f}x "
      f"less. That compares SimCLR's whole activations with MoCo's cache only: per negative, one view's "
      f"saved activations ({simclr_per_image / 2 / 1e3:.1f} kB) against one key's cache slot ({cfg.dim} floats "
      f"plus two int64 of bookkeeping = {4 * cfg.dim + 16} B), leaving out what a MoCo step keeps for "
      f"backward per key (measured in the queue-size sweep below, where the fair ratio is printed).")

# %%
# NBVAL_CHECK_OUTPUT
# identity checks (the ledger books what the code allocates): the queue is a K×d buffer in the
# state dict; the cache line is the keys plus, per slot, two int64 (written_at, ids) and two int64
# scalars, K·(4d + 16) + 16 bytes
assert moco.queue.keys.shape == (cfg.queue, cfg.dim) and queue_bytes == cfg.queue * cfg.dim * 4
assert "queue.keys" in moco.state_dict(), "the queue is a registered buffer: it is saved with the model"
assert rec_moco.cache_bytes == cfg.queue * (4 * cfg.dim + 16) + 16
# measured: the K negatives come from the cache, so nothing is encoded twice or recomputed
assert rec_moco.re_encoded == {} and rec_moco.recomputed_flops == 0
# identities too: param_bytes = both encoders; only the query encoder has gradients and Adam state
assert key_bytes == query_bytes and rec_moco.param_bytes == query_bytes + key_bytes
assert rec_moco.grad_bytes == query_bytes and rec_moco.optimizer_bytes == 2 * query_bytes
# arithmetic of the configuration (parameter counts and shapes, not measurements):
assert key_bytes > queue_bytes, "in this configuration the key-encoder copy outweighs the queue"
assert 2.5 < paper_key_bytes / paper_queue_bytes < paper_key_bytes_v2 / paper_queue_bytes < 3.5, \
    "paper scale: a ResNet-50 copy is 2.5x to 3.5x the queue, more with v2's MLP head than v1's linear one"
# measured:
assert in_batch_vs_queue > 100, "K in-batch negatives cost over two orders of magnitude more than K keys"
assert rec_moco.encoded["key encoder images"] == cfg.batch  # keys: encoded, never back-propagated

# %% [markdown]
# The claim asserted here is narrow: SimCLR's activations for K in-batch negatives weigh more than
# a hundred times MoCo's queue cache (the printed ratio is this run's figure). The queue's cache line
# is K·(4d + 16) + 16 bytes: per key, d floats plus two int64 of bookkeeping; while an
# in-batch negative is a whole view's saved activations. That ratio leaves out what MoCo keeps for
# backward per key (the logits column and the queue snapshot); the sweep below measures it and
# prints the per-negative and activations-plus-cache ratios with it included. The key encoder is the part of MoCo's
# memory that the "queue is cheap" story leaves out: it does not grow with K, but it is a full
# copy of the network, and in this configuration it weighs more than the queue (also at the
# paper's scale, printed above).

# %% [markdown]
# ### The runs: a main run, its recipe from more seeds, and one-factor arms
#
# The main run (m = 0.99, K = `cfg.queue`, shuffled keys, seed `cfg.seeds[0]`) is trained
# `cfg.steps` steps. The same recipe is trained from each other seed in `cfg.seeds` (its own
# initialisation, batches and views), for the comparison against random init. Every one-factor
# arm below starts from the initialisation of the recipe run of its seed, sees its batches in the
# same order with the same augmentations and uses the same optimizer, changes exactly one thing,
# and is read in the *same window* of steps as that run:
#
# - **momentum**: m = 0 for the first `stale_steps` steps, against the first `stale_steps` steps
#   of the recipe run of the same seed;
# - **queue size**: no training; one step of the main run's final model with each K of
#   `cfg.sweep_queues`, for its ledger lines;
# - **shuffle-BN**: keys normalised in their query's own BN group (`shuffle_keys=False`, still two
#   groups, so the BN batch size is unchanged), `sweep_steps` steps. The key shuffle draws its
#   permutation from the generator the augmentations use; `encode_keys` draws it in the
#   unshuffled arm too (and discards it), so both arms see the same augmentations at every step
#   (checked in the shuffle-BN section).
#
# Two more kinds of run are not one-factor arms of the recipe:
#
# - **the random-queue control**, from every seed: the recipe, but its queue drawn at random again
#   after every step, trained 2·K/B steps and read at steps K/B+1 to 2·K/B (the window where the
#   recipe's queue holds only real keys);
# - **the random-init floors**, from every seed: the encoder as built, probed untouched, and again
#   with its BatchNorm statistics calibrated on the probe's training images (lesson 02).
#
# To measure **drift** we re-encode a fixed set of clean images with the key encoder after every
# step of the staleness window: the cosine between today's key of an image and the key the same
# image got `a` steps ago is the encoder-drift part of the mismatch a queue entry of age `a`
# carries (a real queue entry also differs by its augmentation and its BN group's other members).

# %%
class KeySnapshots(Callback):
    """After each of the first `until` steps: normalised key-encoder embeddings of a fixed batch,
    computed the way keys are computed in training (BatchNorm on batch statistics, the same
    number of BN groups, here of clean fixed images), on a copy so the real encoder's running
    statistics are untouched. At step `until`
    it also records the queue's ages."""

    def __init__(self, model, images, until):
        self.model, self.images, self.until, self.snapshots = model, images, until, []

    def on_step_end(self, state):
        if state.step > self.until:
            return
        enc = copy.deepcopy(self.model.key_encoder).train()
        with torch.no_grad():
            keys = encode_in_groups(enc, self.images, self.model.bn_groups)
        self.snapshots.append(nn.functional.normalize(keys, dim=1).cpu())
        if state.step == self.until:
            self.ages = self.model.queue.ages()[self.model.queue.filled()].cpu()

    def drift(self):
        """mean cos(key at step `until`, key `a` steps earlier) for a = 0 .. until-1."""
        now = self.snapshots[-1]
        return [(now * old).sum(1).mean().item() for old in reversed(self.snapshots)]


fixed = test.images[:64]
class CopyAt(Callback):
    """A copy of the model as it was after `step` updates (to compare arms at equal training)."""

    def __init__(self, model, step):
        self.model, self.step, self.copy = model, step, None

    def on_step_end(self, state):
        if state.step == self.step:
            self.copy = copy.deepcopy(self.model)


class RandomQueue(Callback):
    """The control for the loss's climb: after every step, the queue is drawn at random again
    (fresh unit vectors, from a generator of its own, so the run's other draws are the main
    run's), so it never holds a real key."""

    def __init__(self, model, seed):
        self.model, self.generator = model, torch.Generator().manual_seed(10_000 + seed)

    def on_step_end(self, state):
        keys = self.model.queue.keys
        keys.copy_(nn.functional.normalize(torch.randn(keys.shape, generator=self.generator).to(keys.device), dim=1))


def train_moco(steps, *, probe=True, snapshots=True, copy_at=None, seed=cfg.seed,
               probe_every=cfg.probe_every, progress=True, random_queue=False, **arm):
    """One arm: build, train `steps` steps on the batches and augmentations of `seed` (the same
    for every arm of one seed); `copy_at`: also keep a copy of the model after that many steps
    (as "model_at"); probes every `probe_every` steps and at the end."""
    mm = build_moco(seed=seed, **arm)
    o = torch.optim.AdamW(mm.query_encoder.parameters(), lr=cfg.lr, weight_decay=1e-4)
    snaps = KeySnapshots(mm, fixed, until=cfg.stale_steps if snapshots else 0)
    keep = [CopyAt(mm, copy_at)] if copy_at else []
    control = [RandomQueue(mm, seed)] if random_queue else []
    watch = [EvalEvery(probe_every, lambda: probe_encoder(mm.encoder, probe_train, test))] if probe else []
    h = fit(make_step(mm, o, augment=augment, generator=torch.Generator().manual_seed(seed)),
            train.batches(cfg.batch, seed=seed, with_ids=True), steps=steps,
            callbacks=[snaps, *watch, *keep, *control], desc=f"MoCo {arm or 'main'}, seed {seed}", progress=progress)
    return dict(model=mm, history=h, snaps=snaps, model_at=keep[0].copy if keep else None)


def probe_at(run, step):
    """The linear/kNN probe recorded at `step` (EvalEvery runs every probe_every steps)."""
    return next(e for e in run["history"].evals if e["step"] == step)


def run(job):
    """One of the section's independent runs, named (kind, seed)."""
    kind, seed = job
    if kind == "recipe":     # m = 0.99, K = cfg.queue: the main run is seed cfg.seed, probed along the way
        main_run = seed == cfg.seed   # its copy at sweep_steps is the shuffle arm's twin
        return train_moco(cfg.steps, seed=seed, copy_at=cfg.sweep_steps if main_run else None,
                          probe_every=cfg.probe_every if main_run else cfg.sweep_steps,
                          progress=step_bars())
    if kind == "m=0":        # the staleness claim's pairs: stale_steps steps each
        return train_moco(cfg.stale_steps, probe=False, momentum=0.0, seed=seed, progress=step_bars())
    if kind == "random queue":   # the control: the steps until real keys fill the queue twice over
        return train_moco(2 * math.ceil(cfg.queue / cfg.batch), probe=False, snapshots=False, seed=seed,
                          random_queue=True, progress=step_bars())
    if kind == "unshuffled":
        return train_moco(cfg.sweep_steps, snapshots=False, shuffle_keys=False, seed=seed,
                          progress=step_bars())
    encoder = build_moco(seed=seed).encoder   # "floor": random init, as built and BN-calibrated
    return {**probe_encoder(encoder, probe_train, test), "calibrated linear":
            probe_encoder(batchnorm_calibrated(encoder, probe_train.images), probe_train, test)["linear"]}


# independent runs (their own seed, arm and model), spread over the cores by map_runs, longest first
results = map_runs(run, [("recipe", s) for s in cfg.seeds] + [("unshuffled", cfg.seed)]
                   + [("m=0", s) for s in cfg.seeds] + [("random queue", s) for s in cfg.seeds]
                   + [("floor", s) for s in cfg.seeds],
                   device=device, desc="MoCo runs")
main = results["recipe", cfg.seed]
reseeded = {s: results["recipe", s] for s in cfg.seeds[1:]}
m0_by_seed = {s: results["m=0", s] for s in cfg.seeds}
m0 = m0_by_seed[cfg.seed]
unshuffled = results["unshuffled", cfg.seed]
random_probe = results["floor", cfg.seed]

# %% [markdown]
# ### Experiment: momentum 0 vs 0.99, and how stale the queue is
#
# Same window for both arms: steps 1 to `stale_steps`, from the same initialisation, once per
# seed in `cfg.seeds` (the plots show seed 0). With m = 0
# the key encoder is a copy of the query encoder after every step. The queue records each entry's
# **age** (enqueue steps since it was written).

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3))
for name, r in [("m=0.99", main), ("m=0", m0)]:
    loss_window = r["history"].series("loss")[:cfg.stale_steps]
    axes[0].plot(range(1, len(loss_window) + 1), loss_window, label=name)
    axes[1].plot(range(len(r["snaps"].drift())), r["snaps"].drift(), "o-", ms=3, label=name)
axes[0].axhline(math.log(1 + cfg.queue), color="gray", ls=":", label="log(1+K)")
axes[0].axvline(cfg.queue / cfg.batch, color="gray", ls="--", lw=0.8, label="K/B: random queue gone")
axes[1].axvline(int(main["snaps"].ages.max()), color="gray", ls=":", label="oldest queue entry")
main_probes = main["history"].evals
axes[2].plot([e["step"] for e in main_probes], [e["linear"] for e in main_probes], "o-", label="linear")
axes[2].plot([e["step"] for e in main_probes], [e["knn"] for e in main_probes], "s-", label="kNN")
axes[2].axhline(random_probe["linear"], color="gray", ls=":", label="random init, linear")
axes[0].set_xlabel("step"); axes[0].set_ylabel("InfoNCE loss"); axes[0].legend(fontsize=8)
axes[1].set_xlabel("age a (steps)"); axes[1].set_ylabel(f"cos(key at step {cfg.stale_steps}, key a steps earlier)")
axes[1].legend(fontsize=8)
axes[2].set_xlabel("step"); axes[2].set_ylabel("probe accuracy, main run (m=0.99)"); axes[2].legend(fontsize=8)
plt.show()

staleness = []
for m, r in [(0.99, main), (0.0, m0)]:
    max_age, d = int(r["snaps"].ages.max()), r["snaps"].drift()
    staleness.append({"momentum": m, "window": f"steps 1-{cfg.stale_steps}", "max age in queue": max_age,
                      "mean age": r["snaps"].ages.float().mean().item(),
                      "cos at age 1": d[1], "cos at max age": d[max_age]})
show_table(staleness)
slow, fast = staleness
kb = math.ceil(cfg.queue / cfg.batch)
loss_after_fill = sum(main["history"].series("loss")[kb:2 * kb]) / kb   # steps K/B+1 .. 2K/B
main_first_loss = main["history"].series("loss")[0]
print(f"At step {cfg.stale_steps}, a queue entry of the maximal age {slow['max age in queue']} carries "
      f"cosine {slow['cos at max age']:.3f} to today's key with m=0.99 and {fast['cos at max age']:.3f} "
      f"with m=0 (same steps, same data). Main run's loss over steps {kb + 1}-{2 * kb}, once real keys "
      f"fill the queue: {loss_after_fill:.3f} (log(1+K) = {log_1k:.3f}; its first step: {main_first_loss:.3f}): "
      f"it has risen {100 * (loss_after_fill - main_first_loss) / (log_1k - main_first_loss):.0f}% of the way from the first "
      f"step's loss to log(1+K) and sits {log_1k - loss_after_fill:.2f} nats below it.")


def cos_at_max_age(run):
    return run["snaps"].drift()[int(run["snaps"].ages.max())]


recipe_runs = {s: main if s == cfg.seed else reseeded[s] for s in cfg.seeds}   # m = 0.99, every seed
cos_m099 = {s: cos_at_max_age(run) for s, run in recipe_runs.items()}
fill_loss = {s: sum(run["history"].series("loss")[kb:2 * kb]) / kb for s, run in recipe_runs.items()}
first_loss = {s: run["history"].series("loss")[0] for s, run in recipe_runs.items()}   # each seed's own step 1
# the control: the same seeds and steps with the queue drawn at random after every step
random_queue_loss = {s: sum(results["random queue", s]["history"].series("loss")[kb:2 * kb]) / kb
                     for s in cfg.seeds}
queue_fill_comparison = compare_paired(fill_loss, random_queue_loss, ("real keys in the queue", "a random queue"))
cos_m0 = {s: cos_at_max_age(m0_by_seed[s]) for s in cfg.seeds}
staleness_comparison = compare_paired(cos_m099, cos_m0, ("m=0.99", "m=0"))
show_table([{"seed": s, "cos at max age, m=0.99": cos_m099[s], "cos at max age, m=0": cos_m0[s],
             f"loss, steps {kb + 1}-{2 * kb}": fill_loss[s], "same, random queue": random_queue_loss[s]}
            for s in cfg.seeds])
print(f"loss over steps {kb + 1}-{2 * kb}, paired by seed: " + queue_fill_comparison.describe(digits=3))
print("oldest queue key against today's, paired by seed: " + staleness_comparison.describe(digits=3))
print(f"after {cfg.stale_steps} steps the m = {MOMENTUM} key encoder still holds a share "
      f"m**{cfg.stale_steps} = {MOMENTUM ** cfg.stale_steps:.2f} of its initial weights: still warming up")
if cfg.stale_cos_m099_min is not None:
    print(f"Thresholds asserted below: cos at max age >= {cfg.stale_cos_m099_min} (m=0.99) on seeds "
          f"{list(cfg.seeds[1:])} (seed {cfg.seeds[0]}'s run set it), "
          f"and m = 0.99 above m = 0 by the paired interval; loss over steps {kb + 1}-{2 * kb} within {cfg.loss_climb_tol} nats "
          "of log(1+K) and more than half the way up from that seed's own first-step loss, on every seed "
          f"(first steps: {', '.join(f'{v:.3f}' for v in first_loss.values())}).")

# %%
# NBVAL_CHECK_OUTPUT
expected_max_age = min(cfg.stale_steps, math.ceil(cfg.queue / cfg.batch))
# identity check of the ring buffer (a key is overwritten after K/B enqueues), not a finding
assert slow["max age in queue"] == fast["max age in queue"] == expected_max_age, "a key lives K/B steps"
# a one-seed sanity check (seed 0's m = 0 arm), not a claim: the paired claims follow
assert fast["cos at max age"] < fast["cos at age 1"], "keys go stale with age"
if cfg.stale_cos_m099_min is not None:    # CI: a handful of steps, the encoder barely moves
    assert staleness_comparison.verdict == "m=0.99 > m=0", staleness_comparison.describe(digits=3)
    # the threshold was read off seed 0's run: held on the seeds that did not set it
    assert min(cos_m099[s] for s in cfg.seeds[1:]) >= cfg.stale_cos_m099_min, \
        "m=0.99: the oldest key still matches today's"
if cfg.loss_climb_tol is not None:
    assert start_loss < log_1k - 0.5, "the first loss is clearly below log(1+K)"
    assert all(abs(v - log_1k) < cfg.loss_climb_tol for v in fill_loss.values()), \
        ("once the random queue is replaced by real keys the loss is near log(1+K), every seed", fill_loss)
    assert all(fill_loss[s] - first_loss[s] > 0.5 * (log_1k - first_loss[s]) for s in cfg.seeds), \
        ("the loss rises toward log(1+K) from each seed's own first step", fill_loss, first_loss)
    # ... and training against real keys keeps it there: against a queue drawn at random every
    # step (a different training path too) the same steps stay low
    assert queue_fill_comparison.verdict == "real keys in the queue > a random queue", queue_fill_comparison.describe()
    assert queue_fill_comparison.mean > 0.5, queue_fill_comparison.describe()


# %% [markdown]
# With m = 0.99 the key encoder closes a share 1 − m of its gap to the query encoder per step: once
# warmed up, it is an average of the query encoder over its last 1/(1 − m) or so steps. In this
# experiment's window (the first `stale_steps` steps) it is still warming up: after t steps it
# keeps a share m**t of its initial weights (printed above), so it also moves more slowly than the
# query encoder by construction. Either way it does not jump with each update, which is our
# reading of why a key written K/B steps ago still looks like what the encoder would produce now
# (the smoothing itself is not measured apart). With m = 0, in the same steps, the oldest
# key has drifted further: the key encoder jumps with every update, so the keys in the queue come
# from many different encoders. Asserted at the default scale over every seed, each m = 0 arm
# paired with the main recipe of its seed: the paired difference of the oldest key's cosine resolves m = 0.99 above
# m = 0, and at default the m = 0.99 arms stay at or above `stale_cos_m099_min` (read off seed
# 0's run, then asserted on the other seeds of `cfg.seeds`, which did not set it). How far the m = 0 arms
# drift varies a lot from seed to seed (printed), so no bound is asserted on them alone. The paper reports that training then fails (m = 0: no
# convergence) and hypothesises that the cause is the rapidly changing encoder reducing the keys'
# consistency. *Why* inconsistency breaks training — for instance, that the query learns to tell
# keys apart by which encoder made them rather than by content — is a hypothesis we do not test.
# What this run measures is the stale, inconsistent dictionary in the same window; whether m = 0
# fails to train here is not tested (its arm stops at `stale_steps` steps), so the paper's
# failure is not claimed.

# %% [markdown]
# ### Experiment: probe against random init, from several seeds
#
# The same recipe (m = 0.99, K = `cfg.queue`, `cfg.steps` steps) from each seed in `cfg.seeds`;
# seed s has its own initial weights, batches and views, and its own floor: the same encoder at
# random init, probed untouched (the kit's one random-init baseline, as in lessons 05 and 13 and
# the SSL benchmark). Each claim is a paired difference over the seeds, decided by its 95%
# interval (`course_utils.compare`; one test image is the smallest difference a probe can show).

# %%
runs = {cfg.seed: main, **reseeded}
floors = {s: results["floor", s]["linear"] for s in cfg.seeds}
mid = {s: probe_at(r, cfg.sweep_steps)["linear"] for s, r in runs.items()}
final = {s: r["history"].evals[-1]["linear"] for s, r in runs.items()}
one_image = 1 / len(test.labels)
moco_vs_init = compare_paired(final, floors, (f"MoCo after {cfg.steps} steps", "random init"),
                              resolution=one_image)
# the claim is asserted against the stricter floor, seed by seed (the kit's rule where a lesson
# prints both floors: course_utils.evaluate.batchnorm_calibrated)
calibrated_floors = {s: results["floor", s]["calibrated linear"] for s in cfg.seeds}
stricter_floors = {s: max(floors[s], calibrated_floors[s]) for s in cfg.seeds}
moco_vs_stricter = compare_paired(final, stricter_floors,
                                  (f"MoCo after {cfg.steps} steps", "the stricter random-init floor"),
                                  resolution=one_image)
late_vs_early = compare_paired({s: final[s] - mid[s] for s in cfg.seeds},
                               {s: mid[s] - floors[s] for s in cfg.seeds},
                               (f"gain over steps {cfg.sweep_steps + 1}-{cfg.steps}",
                                f"gain over steps 1-{cfg.sweep_steps}"), resolution=one_image)
# the early window's gain depends on the floor it starts from: the same, from the lower of the
# floor as built and with BatchNorm calibrated on the probe's images (lesson 02), seed by seed
lower_floors = {s: min(floors[s], calibrated_floors[s]) for s in cfg.seeds}
late_vs_early_lower = compare_paired({s: final[s] - mid[s] for s in cfg.seeds},
                                     {s: mid[s] - lower_floors[s] for s in cfg.seeds},
                                     (f"gain over steps {cfg.sweep_steps + 1}-{cfg.steps}",
                                      f"gain over steps 1-{cfg.sweep_steps} from the lower floor"),
                                     resolution=one_image)
moco_gain = moco_vs_init.mean
show_table([{"seed": s, "random init": floors[s], "random init, BN calibrated": calibrated_floors[s],
             f"linear @ {cfg.sweep_steps}": mid[s], f"linear @ {cfg.steps}": final[s]} for s in cfg.seeds])
floor_choice = compare_paired(floors, calibrated_floors, ("random init as built", "BN calibrated"),
                              resolution=one_image)
calibrated_lower_on = sum(calibrated_floors[s] < floors[s] for s in cfg.seeds)
print(moco_vs_init.describe(scale=100, unit=" points"))
print(moco_vs_stricter.describe(scale=100, unit=" points"))
print(f"the two floors: BN calibrated lower on {calibrated_lower_on} of {len(cfg.seeds)} seeds; "
      + floor_choice.describe(scale=100, unit=" points"))
print(late_vs_early.describe(scale=100, unit=" points"))
print(late_vs_early_lower.describe(scale=100, unit=" points"))
print(f"kNN probe along seed {cfg.seed}'s run (one run, printed only): "
      + ", ".join(f"step {e['step']}: {100 * e['knn']:.1f}%" for e in main["history"].evals)
      + f" (random init {100 * random_probe['knn']:.1f}%)")
if cfg.probe_claim:
    print("Asserted below: the stricter floor not resolved above MoCo (the verdict is the direction, or not "
          "resolved with MoCo's mean ahead)" + (f"; and steps {cfg.sweep_steps + 1}-{cfg.steps} adding more than steps "
                         f"1-{cfg.sweep_steps}." if cfg.late_gain_claim else "."))
# where MoCo is trained longer: the kit's SSL benchmark, read where the repository is at hand
ssl = committed_result("ssl_quality")
if ssl is None:
    print("benchmarks/results/ssl_quality.json is not here (the kit runs without its repository)")
else:
    moco_rows = {d: rows["moco"] for d, rows in ssl["datasets"].items()}
    for d, row in moco_rows.items():
        low, high = row["gain_interval_points"]
        steps = sorted({r["steps"] for r in row["seeds"].values()})
        print(f"SSL benchmark, {d}: MoCo {row['linear_gain_points']:+.1f} points over its random init "
              f"[{low:+.1f}, {high:+.1f}], {len(row['seeds'])} seeds of {'/'.join(map(str, steps))} steps "
              f"({steps[0] / cfg.steps:.1f}x this lesson's): {row['goal_verdict']}")

# %%
if cfg.probe_claim:                     # CI trains a handful of steps: nothing to claim there
    # against the stricter floor and against the floor as built, each its own paired comparison (a
    # per-seed maximum of two floors can resolve where the floor as built does not: its interval
    # moves with which floor each seed took)
    for comparison in (moco_vs_stricter, moco_vs_init):
        assert comparison.holds(not_reversed(comparison.direction)), comparison.describe(100, " points")
if ssl is not None:                     # the committed benchmark: every MoCo row's interval above its floor
    assert all(row["gain_interval_points"][0] > 0 for row in moco_rows.values()), \
        {d: r["gain_interval_points"] for d, r in moco_rows.items()}
if cfg.late_gain_claim:                 # a preset whose seeds resolve it, from either floor: the later steps add more
    for comparison in (late_vs_early, late_vs_early_lower):
        assert comparison.verdict == comparison.direction, comparison.describe()

# %% [markdown]
# What this scale can back, by the kit's rule for one run (`course_utils.compare`): over the seeds
# of `cfg.seeds`, **MoCo (m = 0.99) is not resolved below the same encoder at random init** after
# `cfg.steps` steps, with its mean ahead: asserted against the stricter of the two floors, seed by
# seed, and against the floor as built, each as its own paired comparison (CI trains too few
# steps to claim anything). Whether the interval places it above is printed
# with its verdict (and, where it resolves, how far its nearer edge
# stands from zero); the preset records the default run's room and why no more is claimed:
# the seeds land far apart, as the table shows. That MoCo's
# features can leave the floor is the kit's SSL benchmark's result, read from
# its committed file where the repository is at hand (printed above with its seeds, steps and
# intervals, each against the benchmark's goal; asserted: every MoCo row's interval lies above
# its random-init floor). Its recipe (`benchmarks/bench_ssl_quality.py`) is this lesson's encoder,
# head, K, T, m, optimizer and augmentation on shapes (its textures row crops more, 30-100% of the
# area, on other images); its runs are longer, on the whole training set (this
# lesson's `train_limit` caps it), and probed on a seeded subset of the test split (this lesson:
# its first `probe_test` images). So the benchmark shows what more steps on more images buy, not
# what length alone does. The second
# comparison asks when the gain arrives, seed by seed: what steps `sweep_steps`+1 to `steps` add
# against what steps 1 to `sweep_steps` did (equal windows at the default scale). The early
# window's gain is measured from a floor, and the choice of floor moves it: lesson 02 finds the
# BatchNorm-calibrated floor below the floor as built; on how many seeds it is lower here, and
# the paired comparison of the two floors with its verdict, are printed above. So the gain is printed from
# the floor as built and from the lower of the two, seed by seed, and it is not asserted unless a preset sets
# `late_gain_claim` (which asserts the direction from both floors; the preset records why the
# default does not). The staleness figure's probe panel is one seed; the paired comparisons are
# what say when the gain arrives, and only where both floors agree.

# %% [markdown]
# A MoCo step is cheaper than a SimCLR step at the same batch: backward over B images plus a
# forward-only key pass, against backward over 2B views (the FLOP ratio is measured below). That
# rests on MoCo's asymmetric loss, which trains B anchors where SimCLR trains 2B; a symmetrised
# MoCo loss (both views as queries, as MoCo v3 does) would cost about 4/3 of SimCLR's step.

# %%
moco_flops_vs_simclr = rec_moco.flops / rec_simclr.flops
print(f"FLOPs of one MoCo step / one SimCLR step (same batch): {moco_flops_vs_simclr:.3f}, so these "
      f"{cfg.steps} MoCo steps cost as much compute as {cfg.steps * moco_flops_vs_simclr:.0f} SimCLR steps "
      f"at batch {cfg.batch}; lesson 05 compares the objectives at an equal budget.")
assert 0.6 < moco_flops_vs_simclr < 0.75, "one backward over B + a key forward ≈ 2/3 of SimCLR's step"

# %% [markdown]
# ### Experiment: queue size K — candidates from history, whatever the batch
#
# MoCo's central claim is that the number of negatives is set by K, independent of B: the batch
# stays at `cfg.batch` while K changes. One step of the main run's model with each K (same
# weights, batch and views; the queue's contents differ too, trained keys for `cfg.queue` and
# random ones for the others, which the bytes do not depend on): negatives per anchor, the queue's cache bytes
# (ledger), the bytes one step keeps for backward (the B×(1+K) log-softmax cross-entropy keeps and
# the clone of the queue the query's gradient through the negative logits needs grow with K), and the oldest key's age (K/B steps: computed from
# the formula, not measured; the staleness experiment measures it for one K).

# %%
sweep_rows = []
for K in cfg.sweep_queues:
    mm = copy.deepcopy(main["model"])       # one extra step on a copy: the run itself is untouched
    if K != cfg.queue:                      # the same weights with a queue of K keys
        mm.queue = FeatureQueue(K, cfg.dim, generator=torch.Generator().manual_seed(cfg.seed)).to(device)
    oo = torch.optim.AdamW(mm.query_encoder.parameters(), lr=cfg.lr)
    ss = make_step(mm, oo, augment=augment, generator=torch.Generator().manual_seed(0))
    rec = measure(lambda: ss((x, None)), model=mm, optimizer=oo, caches=mm.caches, encoders=mm.ledger_encoders)
    sweep_rows.append({"K": K, "batch": cfg.batch, "negatives per anchor": K,
                       "max key age = K/B (by construction)": math.ceil(K / cfg.batch), "cache MB": rec.cache_bytes / 1e6,
                       "activation MB": rec.activation_bytes / 1e6, "log(1+K)": math.log(1 + K)})
show_table(sweep_rows)
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar([str(row["K"]) for row in sweep_rows], [row["cache MB"] for row in sweep_rows], label="cache")
ax.plot([str(row["K"]) for row in sweep_rows], [row["activation MB"] for row in sweep_rows], "ko-",
        label="kept for backward")
ax.set_xlabel("K"); ax.set_ylabel("MB (ledger)"); ax.legend(fontsize=8)
plt.show()
k_small, k_large = min(cfg.sweep_queues), max(cfg.sweep_queues)
print(f"At batch {cfg.batch} every anchor gets K negatives: {', '.join(str(r['K']) for r in sweep_rows)}. "
      f"The queue's cache grows {sweep_rows[-1]['cache MB'] / sweep_rows[0]['cache MB']:.0f}x "
      f"({sweep_rows[0]['cache MB']:.2f} to {sweep_rows[-1]['cache MB']:.2f} MB) and the bytes kept for backward "
      f"{sweep_rows[0]['activation MB']:.2f} to {sweep_rows[-1]['activation MB']:.2f} MB.")

# the per-key price of a MoCo negative: its cache slot plus what the step keeps for backward per
# extra key (slope of the activation line over the sweep), against one in-batch view's activations
act_per_key = (sweep_rows[-1]["activation MB"] - sweep_rows[0]["activation MB"]) * 1e6 / (k_large - k_small)
moco_per_key = rec_moco.cache_bytes / cfg.queue + act_per_key
per_negative_ratio = (simclr_per_image / 2) / moco_per_key
step_bytes_ratio = simclr_for_k / (rec_moco.activation_bytes + rec_moco.cache_bytes)
print(f"Per extra key a MoCo step keeps {act_per_key:.0f} B for backward (4·(B + d) = {4 * (cfg.batch + cfg.dim)} B: "
      f"one column of the B×(1+K) log-softmax and one d-float row of the queue snapshot), on top of its "
      f"{rec_moco.cache_bytes / cfg.queue:.0f} B cache slot: {moco_per_key:.0f} B per negative against "
      f"{simclr_per_image / 2 / 1e3:.1f} kB for an in-batch view, {per_negative_ratio:.0f}x (the cache-only ratio "
      f"above was {in_batch_vs_queue:.0f}x). The step's activations plus cache at K={cfg.queue}: SimCLR's "
      f"{simclr_for_k / 1e6:.1f} MB against MoCo's {(rec_moco.activation_bytes + rec_moco.cache_bytes) / 1e6:.1f} MB: "
      f"{step_bytes_ratio:.1f}x (MoCo's key-encoder copy, {key_bytes / 1e6:.2f} MB of weights, aside).")
# where that step ratio comes from: SimCLR's step for K negatives back-propagates K + 2 views as
# anchors, MoCo's B queries; per anchor the two cost about the same
simclr_per_anchor = simclr_per_image / 2
moco_per_anchor = (rec_moco.activation_bytes + rec_moco.cache_bytes) / cfg.batch
anchors_ratio = 2 * (cfg.queue // 2 + 1) / cfg.batch
print(f"Per anchor: SimCLR {simclr_per_anchor / 1e3:.0f} kB per view, MoCo {moco_per_anchor / 1e3:.0f} kB per query "
      f"(activations plus cache over B); the step ratio is the anchors' ratio (K+2)/B = {anchors_ratio:.2f} times "
      f"the per-anchor ratio {simclr_per_anchor / moco_per_anchor:.2f} (an identity): MoCo saves by training fewer "
      f"anchors per step, not by a cheaper one")
assert math.isclose(step_bytes_ratio, anchors_ratio * simclr_per_anchor / moco_per_anchor, rel_tol=1e-9)


# %%
# NBVAL_CHECK_OUTPUT
for row in sweep_rows:      # identity check: the cache is K·(4d + 16) + 16 bytes
    assert row["cache MB"] * 1e6 == row["K"] * (4 * cfg.dim + 16) + 16
assert all(a["activation MB"] < b["activation MB"] for a, b in zip(sweep_rows, sweep_rows[1:])), \
    "saved-for-backward grows with K (logits and the queue snapshot)"
assert abs(act_per_key - 4 * (cfg.batch + cfg.dim)) <= 0.05 * 4 * (cfg.batch + cfg.dim), \
    "per extra key: one logits column (B floats) plus one queue-snapshot row (d floats)"
assert per_negative_ratio > 100, "per negative, a view's activations still cost over 100x a key's full price"
assert step_bytes_ratio > 1, "SimCLR for K negatives keeps more than MoCo's activations plus cache"
if cfg.sweep_claims is not None:    # what this budget shows, and what it does not
    # with K/B = 8 at the default scale (CI's K/B = 4 gives a smaller ratio)
    assert step_bytes_ratio > 5, "SimCLR for K negatives keeps several times MoCo's activations plus cache"


# %% [markdown]
# What holds at every scale, and is asserted: the number of negatives per anchor is K at a fixed
# batch, the queue's cache line is K·(4d + 16) + 16 bytes (both identities), and what a step
# keeps for backward grows with K too (the B×(1+K) log-softmax and the snapshot of the queue that the
# query's gradient through the negative logits needs), by 4·(B + d) bytes per key (asserted within 5%), not by a view's
# activations per candidate. A key also lives K/B
# steps, so a larger K means older keys (the staleness experiment above).
#
# Per negative, the fair comparison counts MoCo's per-key activation cost too (printed above:
# one logits column and one queue-snapshot row per key): the ratio drops from the cache-only
# figure of the ledger cell to the per-negative figure printed after the sweep, still over a
# hundred; over the step's activations plus cache the saving is the smaller ratio printed there
# (the key encoder's copy of the weights aside). That step ratio is mostly a count of anchors: the
# SimCLR step that holds K negatives back-propagates K + 2 views, MoCo's B queries, and per anchor
# the two steps keep about the same bytes (printed).
#
# What this lesson does not measure: accuracy against K. A claim about K would need at least three seeds
# per K and a queue filled before the comparison starts (a larger K trains its first K/B steps
# against more random keys, so the arms would differ in more than K); this lesson spends its
# minutes on several seeds of one K instead, the comparison against random init above. The paper's
# gain from a larger dictionary appears over hundreds of ImageNet epochs with a ResNet-50; we do
# not reproduce it here.

# %% [markdown]
# ### Experiment: shuffle-BN on and off
#
# First the exact overlap. For the key of sample i, take the BN group that normalised it and ask
# which fraction of its members also sit in the group that normalised query i. Without the
# shuffle (or with `bn_groups=1`) that fraction is 1: every key is normalised with the statistics
# of the same images as its query's group (other views of them, through the key encoder). With two shuffled groups it is computed below, exactly, for a
# thousand permutations drawn as `encode_keys` draws them; its expected value is
# (1 + (B/G − 1)²/(B − 1)) / (B/G), about 1/G: the key's own sample is always in its query's
# group, and each other member is, with odds of about one in G.

# %%
gen = torch.Generator().manual_seed(0)
overlaps = torch.stack([bn_group_overlap(torch.randperm(cfg.batch, generator=gen), 2) for _ in range(1000)])
g_size = cfg.batch // 2
expected_overlap = (1 + (g_size - 1) ** 2 / (cfg.batch - 1)) / g_size
# the permutation bn_group_overlap is given is the one encode_keys uses: same generator, same keys
check = build_moco()
with torch.no_grad():
    perm_gen, key_gen = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    shuffled, unshuffle = shuffle_batch(x, perm_gen)
    by_hand = nn.functional.normalize(encode_in_groups(check.key_encoder, shuffled, 2)[unshuffle], dim=1)
    keys_shuffled = check.encode_keys(x, key_gen)
unshuffled_overlap = bn_group_overlap(torch.arange(cfg.batch), 2)
one_group_overlap = bn_group_overlap(torch.randperm(cfg.batch, generator=gen), 1)
show_table([
    {"key normalisation": "bn_groups=1 (one group)", "mean overlap with query's group": one_group_overlap.mean().item()},
    {"key normalisation": "bn_groups=2, not shuffled", "mean overlap with query's group": unshuffled_overlap.mean().item()},
    {"key normalisation": "bn_groups=2, shuffled (1000 draws)", "mean overlap with query's group": overlaps.mean().item(),
     "min over draws": overlaps.mean(1).min().item(), "max over draws": overlaps.mean(1).max().item()},
])
print(f"shuffled: {100 * overlaps.mean().item():.1f}% overlap (expected {100 * expected_overlap:.1f}%): "
      "the shared fraction is about halved, not removed.")

# %%
# NBVAL_CHECK_OUTPUT
assert torch.equal(by_hand, keys_shuffled), "encode_keys normalises the keys of x[perm] in chunks"
assert (one_group_overlap == 1).all() and (unshuffled_overlap == 1).all()
assert abs(overlaps.mean().item() - expected_overlap) < 0.01, "measured overlap matches the formula"
assert 0.45 < overlaps.mean().item() < 0.6, "about half: shuffle-BN reduces the shared BN statistics, does not remove them"

# %% [markdown]
# Then training, shuffled against unshuffled keys (two BN groups in both). The shuffle's
# permutation comes from the generator the augmentations use, so an arm that drew no permutation
# would see other augmentations from step 2 on; the unshuffled arm therefore draws it too and
# discards it. The check below runs one step of each arm from the same seed and compares the
# generator's state afterwards: equal means both arms consumed the same random numbers, so the
# next step's augmentations are the same, and the arms differ in the shuffle alone.

# %%
streams = []
for shuffle_keys in (True, False):
    stream = torch.Generator().manual_seed(cfg.seed)
    build_moco(shuffle_keys=shuffle_keys).training_loss(x, augment=augment, generator=stream)
    streams.append(stream.get_state())
assert torch.equal(*streams), "both arms draw the same random numbers per step"
print("random-number stream after one step: shuffled and unshuffled arms equal")

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for name, r in [("shuffled keys (main run)", main), ("unshuffled keys", unshuffled)]:
    ax.plot(range(1, cfg.sweep_steps + 1), r["history"].series("loss")[:cfg.sweep_steps], label=name, lw=0.8)
ax.axhline(math.log(1 + cfg.queue), color="gray", ls=":", label="log(1+K)")
ax.set_xlabel("step"); ax.set_ylabel("InfoNCE loss"); ax.legend(fontsize=8)
plt.show()
tail = min(50, cfg.sweep_steps)
shuffle_rows = []
for name, r in [("shuffled", main), ("unshuffled", unshuffled)]:
    p = probe_at(r, cfg.sweep_steps)
    shuffle_rows.append({"keys": name, f"loss, last {tail} of {cfg.sweep_steps} steps":
                         sum(r["history"].series("loss")[cfg.sweep_steps - tail:cfg.sweep_steps]) / tail,
                         f"linear @ {cfg.sweep_steps}": p["linear"], f"kNN @ {cfg.sweep_steps}": p["knn"]})
show_table(shuffle_rows)
shuf, unshuf = shuffle_rows
loss_key, lin_key = f"loss, last {tail} of {cfg.sweep_steps} steps", f"linear @ {cfg.sweep_steps}"
print(f"unshuffled minus shuffled after {cfg.sweep_steps} steps: loss {unshuf[loss_key] - shuf[loss_key]:+.3f}, "
      f"linear probe {100 * (unshuf[lin_key] - shuf[lin_key]):+.1f} points")

# the fingerprint itself: with each arm's weights after the same sweep_steps updates (the main
# run's copy at that step), how close is a query to its own key
# when the key is normalised with its query's group, against with a group of foreign images
# (the situation of every queue key, normalised with some earlier batch)?
other = train.images[-cfg.batch:]
vq, vk = augment.two_views(x, torch.Generator().manual_seed(5))
_, vo = augment.two_views(other, torch.Generator().manual_seed(6))
fingerprint = {}
with torch.no_grad():
    for name, trained in [("shuffled", main["model_at"]), ("unshuffled", unshuffled["model"])]:
        mm = copy.deepcopy(trained).train()
        qq = mm.encode_queries(vq)
        k_own = nn.functional.normalize(encode_in_groups(mm.key_encoder, vk, 2), dim=1)
        h, step = cfg.batch // 2, max(1, cfg.batch // 16)
        k_foreign = nn.functional.normalize(torch.cat(
            [mm.key_encoder(torch.cat([vk[j:j + step], vo[:h - step]]))[:step] for j in range(0, cfg.batch, step)]), dim=1)
        fingerprint[name] = ((qq * k_own).sum(1).mean() - (qq * k_foreign).sum(1).mean()).item()
print("cos(query, own key) with the key in its query's BN group minus with a foreign group: " +
      ", ".join(f"{n}-trained {v:+.4f}" for n, v in fingerprint.items()) +
      f"; unshuffled minus shuffled: {fingerprint['unshuffled'] - fingerprint['shuffled']:+.4f}")
print("Printed, not asserted: one seed per arm, and a gap this run cannot resolve is not evidence "
      "of no leak (the main run's per-seed probes above show how far seeds spread).")

# %% [markdown]
# What this scale shows, said plainly: **nothing about the leak's effect on training.** The loss
# gap, the probe gap and the fingerprint — how much closer a query is to its own key when that
# key was normalised with its query's BN group rather than with a group of mostly foreign images,
# for the unshuffled-trained encoder against the shuffled-trained one — are printed above, from
# one seed per arm (the two arms saw the same batches and the same augmentations, checked above,
# and are compared after the same `sweep_steps` updates). One seed cannot resolve them, and a gap
# it cannot resolve is not evidence that there is no leak. What the paper reports —
# a loss that drops by cheating and a worse representation — is not tested at this budget;
# here the shuffle's effect is the overlap, measured exactly: from all of a key's BN group
# shared with its query's group to about half of it.

# %% [markdown]
# ## The boundary
#
# - The queue removes the batch-size cap on *negatives*, not on *positives* or on what BatchNorm
#   sees; the query batch is still B images.
# - MoCo's resident state is two encoders plus the queue: the key encoder is a full copy of the
#   network (no gradients, no optimizer state), and it does not shrink when K does.
# - Cached keys are stale by construction: up to K/B steps old, so a larger K means older keys,
#   and the momentum must keep the encoder slow over that many steps (the paper uses m = 0.999 at
#   K = 65,536 and B = 256, keys up to 256 steps old).
# - The queue is training state. Resuming without it restarts with random negatives, and a run
#   saved with the weights only cannot be continued bit for bit (lesson 10 measures this).
# - Shuffle-BN on one device with G groups leaves about 1/G of a key's BN group shared with its
#   query's group. Across real GPUs the groups are the devices (the paper's 8), so far less is
#   shared than with this lesson's G = 2. There the shuffle is two collectives: an all-gather of
#   the key view's *images* and a broadcast of the permutation before the key encoder, then an
#   all-gather of the encoded keys, of which each device keeps its own slice (the official code's
#   `_batch_shuffle_ddp`); the images are far larger than the d-float keys. The single-device
#   split-BN here reproduces per-group statistics, not the communication.

# %% [markdown]
# ## Exercises
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.
#
# Three predictions, each checked against a live measurement: the test builds what the question
# describes, runs the kit on it and compares. The configuration is yours, drawn from `STUDENT_ID`
# (with no ID it is the lesson's own):

# %%
from course_utils.exercises import check_close
from course_utils.variants import exercise_variant

task = exercise_variant("03_moco", STUDENT_ID, width=(16, 8, 24, 32), queue_size=(1024, 256, 1000, 2048, 4096),
                        dim=(64, 32, 48, 128), max_age=(4, 3, 5, 6), momentum=(0.99, 0.85, 0.98, 0.995, 0.998))
task

# %% [markdown]
# The tests measure with these helpers: the lesson's MoCo at another width, queue size and key
# dimension, the age of the oldest key in a queue, and the number of momentum updates the key
# encoder needs to close half its gap to a query encoder that stands still.

# %%
def task_moco(width, queue_size, dim, momentum=0.99):
    """The lesson's MoCo (`build_moco`: SmallResNet with one block per stage, a 128-wide
    projection head to `dim`, two BN groups) at another width, queue size and key dimension."""
    torch.manual_seed(0)
    backbone = SmallResNet(width=width, blocks=(1, 1, 1))
    return MoCo(backbone, ProjectionHead(backbone.feature_dim, 128, dim), queue_size=queue_size,
                momentum=momentum, bn_groups=2).to(device)


def measured_oldest_key_age(queue_size, batch):
    """The largest age (enqueue calls since written) of any real key in a FeatureQueue of
    `queue_size` slots fed batches of `batch` keys, read after each of 3·ceil(K/B) + 2 calls once
    the queue is full of real keys (every call writes one key of each position in a batch, so
    the oldest key's age repeats from call to call)."""
    fifo, oldest = FeatureQueue(queue_size, 1), 0
    fill = math.ceil(queue_size / batch)
    for call in range(3 * fill + 2):
        fifo.enqueue(torch.zeros(batch, 1))
        if call + 1 >= fill:
            oldest = max(oldest, int(fifo.ages()[fifo.filled()].max()))
    return oldest


def measured_updates_to_close_half(momentum):
    """Call `MoCo.momentum_update` on a small MoCo (in float64) whose query encoder stands 1 away
    from the key encoder in every parameter, until the key encoder has closed at least half of
    that gap; return the number of calls."""
    torch.manual_seed(0)
    small = MoCo(nn.Linear(6, 5), nn.Linear(5, 3), queue_size=8, momentum=momentum).double()
    with torch.no_grad():
        for p in small.query_encoder.parameters():
            p.add_(1.0)
    gap = lambda: torch.cat([(q - k).flatten() for q, k in zip(small.query_encoder.parameters(),
                                                                small.key_encoder.parameters())]).norm().item()
    start, calls = gap(), 0
    while gap() > 0.5 * start:
        small.momentum_update()
        calls += 1
    return calls

# %% [raw]
# # BEGIN QUESTION
# name: q1_moco_resident_bytes
# points: 2

# %% [markdown]
# **Exercise 1 — predict, then measure: MoCo's resident bytes, key encoder included.** Your MoCo
# is `task_moco(task.width, task.queue_size, task.dim)`, trained with Adam on the query encoder
# only (as in the lesson), all in fp32. Predict its resident bytes after a step — what the
# ledger's `resident_bytes` sums: parameters, gradients, optimizer state and the queue's cache
# line. You may count the parameters of one encoder (`count_parameters`); the rest is the
# ledger section above. The test trains one step and measures.

# %% [raw]
# # BEGIN SOLUTION

# %%
predicted_resident_bytes = 4 * count_parameters(task_moco(task.width, task.queue_size, task.dim).query_encoder) * (2 + 1 + 2) + task.queue_size * (4 * task.dim + 16) + 16  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_moco = task_moco(task.width, task.queue_size, task.dim)
_opt = torch.optim.Adam(_moco.query_encoder.parameters(), lr=1e-3)
_step = make_step(_moco, _opt, augment=augment, generator=torch.Generator().manual_seed(0))
_images = train.images[:8]
_ = _step((_images, None))
_rec = measure(lambda: _step((_images, None)), model=_moco, optimizer=_opt, caches=_moco.caches)
check_close(predicted_resident_bytes, _rec.resident_bytes, rtol=0,
            what=f"resident bytes of MoCo (width {task.width}, K={task.queue_size}, d={task.dim}) with Adam")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_batch_for_fresh_keys
# points: 2

# %% [markdown]
# **Exercise 2 — predict, then measure: pick B so that no key is older than a few steps.** You
# want K = `task.queue_size` negatives per anchor, and no key in the queue older than
# `task.max_age` steps. Write `smallest_batch(queue_size, max_age)`: the smallest batch B for
# which the queue never holds a key older than `max_age` enqueue calls. Careful where B does not
# divide K. The test feeds the kit's `FeatureQueue` batches of your B, and of B − 1, and
# measures the oldest key's age, for your configuration and for K = 100 keys no older than 7
# steps.

# %% [raw]
# # BEGIN SOLUTION

# %%
def smallest_batch(queue_size, max_age):
    # BEGIN SOLUTION
    # a key lives ceil(K / B) enqueue calls; ceil(K / B) <= a  <=>  B >= K / a
    return math.ceil(queue_size / max_age)
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_b = smallest_batch(task.queue_size, task.max_age)
assert isinstance(_b, int) and 1 <= _b <= task.queue_size, \
    f"the batch must be a whole number between 1 and K={task.queue_size}, got {_b!r}"
assert measured_oldest_key_age(task.queue_size, _b) <= task.max_age, \
    f"with B={_b} the queue holds keys older than {task.max_age} steps: B is too small"
assert _b == 1 or measured_oldest_key_age(task.queue_size, _b - 1) > task.max_age, \
    f"B={_b - 1} also keeps every key within {task.max_age} steps: B={_b} is not the smallest"
# and a queue whose size the age limit does not divide: K = 100 keys, none older than 7 steps
_b = smallest_batch(100, 7)
assert isinstance(_b, int) and measured_oldest_key_age(100, _b) <= 7, \
    f"K=100, at most 7 steps old: with B={_b!r} the queue holds older keys (B too small, or not a whole number)"
assert _b == 1 or measured_oldest_key_age(100, _b - 1) > 7, \
    f"K=100, at most 7 steps old: B={_b - 1} also keeps every key that young, so B={_b} is not the smallest"
# and one it divides (K // a + 1 is one too many there): K = 100, none older than 5 steps
_b = smallest_batch(100, 5)
assert _b == 1 or measured_oldest_key_age(100, _b - 1) > 5, \
    f"K=100, at most 5 steps old: B={_b - 1} also keeps every key that young, so B={_b} is not the smallest"
assert isinstance(_b, int) and measured_oldest_key_age(100, _b) <= 5, \
    f"K=100, at most 5 steps old: with B={_b!r} the queue holds older keys"

# %%
# HIDDEN
_cases = [(_k, _a, smallest_batch(_k, _a)) for _k, _a in [(1000, 3), (10, 4), (64, 1), (12, 12), (4096, 5)]]
for _k, _a, _batch in _cases:
    assert measured_oldest_key_age(_k, _batch) <= _a and \
        (_batch == 1 or measured_oldest_key_age(_k, _batch - 1) > _a), \
        f"K={_k}, at most {_a} steps old: B={_batch} is not the smallest batch that keeps every key that young"

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_key_encoder_half_life
# points: 1

# %% [markdown]
# **Exercise 3 — predict, then measure: how slowly does the key encoder follow?** Hold the query
# encoder still and apply the momentum update θ_k ← m·θ_k + (1 − m)·θ_q again and again. Write
# `updates_to_close_half(m)`: the number of updates after which the key encoder has closed at
# least half of its gap to the query encoder (for your configuration, m = `task.momentum`, and
# for m = 0.75 and 0.4; graded runs also try other m in [0, 1), 0 included). The test calls the
# kit's `MoCo.momentum_update` until half the gap is closed and counts.

# %% [raw]
# # BEGIN SOLUTION

# %%
def updates_to_close_half(m):
    # BEGIN SOLUTION
    # after n updates the gap is m**n of what it was: the smallest n with m**n <= 1/2 (the 1e-9:
    # where m**n is 1/2 exactly, e.g. m = 0.5**0.5, the logs' rounding would add one update)
    return 1 if m == 0 else math.ceil(math.log(0.5) / math.log(m) - 1e-9)
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
check_close(updates_to_close_half(task.momentum), measured_updates_to_close_half(task.momentum), rtol=0,
            what=f"momentum updates to close half the gap at m={task.momentum}")
for _m in (0.75, 0.4):  # round() and int(ln2/(1-m)) miss at 0.75, ceil(ln2/(1-m)) at 0.4
    check_close(updates_to_close_half(_m), measured_updates_to_close_half(_m), rtol=0,
                what=f"momentum updates to close half the gap at m={_m} (a whole number of "
                     "updates: the first after which at least half the gap is closed)")

# %%
# HIDDEN
# round() instead of ceil() fails at 0.6 and 0.8; the time constant ln2/(1 − m) rounded up fails at
# 0.4 and 0.99, rounded down at 0.6, 0.8 and 0.95
for _m in (0.0, 0.4, 0.6, 0.8, 0.95, 0.99):
    check_close(updates_to_close_half(_m), measured_updates_to_close_half(_m), rtol=0,
                what=f"momentum updates to close half the gap at m={_m}")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Summary

# %%
headline(
    negatives_per_anchor=cfg.queue,
    queue_cache_mb=rec_moco.cache_bytes / 1e6,
    simclr_activation_mb_for_same_negatives=simclr_for_k / 1e6,
    in_batch_over_queue_bytes=in_batch_vs_queue,
    in_batch_over_moco_per_negative_bytes=per_negative_ratio,
    in_batch_over_moco_activations_plus_cache_bytes=step_bytes_ratio,
    key_encoder_mb=key_bytes / 1e6,
    start_loss_below_log_1k=log_1k - start_loss,
    key_cos_at_max_age_m0=fast["cos at max age"],
    key_cos_at_max_age_m099=slow["cos at max age"],
    staleness_gap_mean=staleness_comparison.mean,
    staleness_gap_interval=list(staleness_comparison.interval),
    staleness_verdict=staleness_comparison.verdict,
    shuffled_bn_overlap=overlaps.mean().item(),
    probe_random_init_mean=sum(floors.values()) / len(floors),
    probe_moco_mean=sum(final.values()) / len(final),
    moco_gain_points_mean=100 * moco_gain,
    moco_gain_interval_points=[100 * v for v in moco_vs_init.interval],
    moco_gain_verdict=moco_vs_init.verdict,
    moco_gain_verdict_stricter_floor=moco_vs_stricter.verdict,
    moco_gain_room_stricter_floor=moco_vs_stricter.room,
    late_gain_verdict_floor_as_built=late_vs_early.verdict,
    late_gain_room_floor_as_built=late_vs_early.room,
    late_gain_verdict_lower_floor=late_vs_early_lower.verdict,
    late_gain_claimed=bool(cfg.late_gain_claim),
)
