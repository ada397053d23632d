# %% [markdown]
# # 06 · Training memory is more than one copy of the weights
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/06_training_memory.ipynb)
#
# The *resident state* and *kept for backward* lines of the ledger, for real: how many bytes one
# training step needs, predicted by formula before running, then checked against measurement.

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
import torch

from course_utils import memory
from course_utils.exercises import check_close, check_equal
from course_utils.ledger import cuda_peak_bytes, record_memory_snapshot
from course_utils.experiments.training_memory import (measure_tinygpt, recompute_tradeoff,
                                                       tinygpt_kept_under_rules_of)
from course_utils.optim import OPTIMIZERS
from course_utils.plots import plot_memory_breakdown, what_fits_widget
from course_utils.ledger import measure
from course_utils.report import headline, show_table
from course_utils.models.transformer import TinyGPT, random_tokens, tinygpt_param_count
from course_utils.runtime import setup
from course_utils.scales import config

# TinyGPT configurations: (layers, hidden, heads, vocab, seq, batch)
cfg = config(
    SCALE,
    ci=dict(seed=0, example=(2, 64, 4, 97, 32, 3),
            sweep=[(1, 32, 4, 50, 16, 2), (2, 64, 4, 97, 32, 3), (3, 48, 6, 64, 24, 4)],
            recompute_model=(4, 96, 4, 128, 48, 4), repeats=1),
    default=dict(seed=0, example=(4, 128, 8, 256, 64, 8),
                 sweep=[(1, 32, 4, 50, 16, 2), (2, 64, 4, 97, 32, 3), (3, 48, 6, 64, 24, 4),
                        (4, 128, 8, 256, 64, 8), (6, 96, 4, 256, 64, 4), (2, 128, 8, 256, 96, 8)],
                 recompute_model=(4, 128, 8, 256, 96, 8), repeats=3),
    gpu=dict(seed=0, example=(12, 768, 12, 50257, 256, 8),
             sweep=[(4, 128, 8, 256, 64, 8), (6, 192, 8, 256, 128, 4), (12, 768, 12, 50257, 256, 4),
                    (12, 768, 12, 50257, 256, 8), (24, 1024, 16, 50257, 256, 4),
                    (12, 768, 12, 50257, 512, 4)],
             recompute_model=(12, 768, 12, 50257, 512, 8), repeats=5),
)
device = setup(SCALE, seed=cfg.seed)
GiB = 2**30
print(device, cfg.example)

# %% [markdown]
# ## 1 · The problem: the weights are the smallest line (tied with their gradients)
#
# A GPT-2-small-sized model's weights in 16 bits take a small fraction of a T4's memory (printed below),
# so "it fits" is the tempting conclusion. But training keeps much more than one copy of the
# weights: a gradient per weight, Adam's two moments, an fp32 master copy under mixed precision —
# and the activations the forward pass keeps until backward, which grow with batch × sequence.

# %%
small = memory.PRESETS["GPT-2 small (124M)"]   # 12 layers of width 768, 12 heads
# 16-bit mixed precision (bf16 and fp16 take the same bytes; a T4 would run fp16), eager
# attention (it keeps the s² scores; fused attention, section 4, does not): batch 8 of 1,024 tokens
gpt2 = memory.transformer_memory(small["layers"], small["hidden"], small["heads"], 50257, 1024, 8,
                                 optimizer="adamw", precision="bf16-mixed", attention="eager")
gpt2_params = tinygpt_param_count(small["layers"], small["hidden"], 50257, 1024)
print(f"GPT-2 small: {gpt2_params / 1e6:.0f} M parameters, {gpt2['params'] / GiB:.2f} GiB of 16-bit weights")
show_table([{"line": k, "GiB": round(v / GiB, 2)} for k, v in gpt2.items()])
t4_bytes = memory.DEVICES["T4 (Colab) 16 GB"]   # what torch reports on Colab, not the marketed 16 GB
print(f"the 16-bit weights are {gpt2['params'] / t4_bytes:.1%} of a T4's {t4_bytes / GiB:.1f} GiB and "
      f"{gpt2['params'] / gpt2['total']:.0%} of the predicted total; the total is "
      f"{gpt2['total'] / t4_bytes:.0%} of the T4")
# identities of the predictor's constants (2 bytes each, the smallest line), shown for the reading
assert gpt2["params"] == min(v for k, v in gpt2.items() if k != "total") == gpt2["grads"]
assert gpt2["params"] < 0.05 * t4_bytes, "a small fraction of the device"

# %% [markdown]
# ## 2 · The mechanism: bytes per parameter, and activations per token
#
# **Resident state** is a fixed number of bytes *per parameter*:
#
# | precision | weights | gradients | fp32 master | optimizer (SGD / momentum / Adam) | Adam total |
# |---|---|---|---|---|---|
# | fp32 | 4 | 4 | — | 0 / 4 / 8 | 16 |
# | 16-bit mixed (ZeRO's count, fp16 there; bf16 read back from one step below) | 2 | 2 | 4 | 0 / 4 / 8 | **16** |
# | Megatron: bf16 weights, fp32 gradients | 2 | 4 | 4 | 0 / 4 / 8 | **18** |
# | Megatron: fp16 weights and gradients, an fp32 copy of the gradients | 2 | 2 + 4 | 4 | 0 / 4 / 8 | **20** |
#
# The 16 is Rajbhandari et al.'s accounting for mixed-precision Adam in the ZeRO paper (2020,
# §3.1: 2Ψ + 2Ψ + 12Ψ; not re-checked here); Megatron-Core's distributed-optimizer
# documentation (checked) gives 18 and 20 for its two layouts, whose gradients stay in fp32 or
# gain an fp32 copy for the whole step.
#
# Mixed precision does not shrink Adam's resident state at all: the moments and the master
# copy stay fp32 so that small updates are not rounded away (bf16 keeps 8 significant bits: a
# weight near 1.0, such as a LayerNorm gain, cannot take a step as small as a typical AdamW
# update, and stepped in bf16 directly it rounds back to where it was; measured below on the
# LayerNorm gains of a fresh model, with and without the master).
#
# The bf16-mixed row, on one real step kept the way ZeRO counts it: the model in bf16 (weights
# and gradients 2 bytes), an fp32 master copy that AdamW updates (its moments are created in the
# master's dtype), gradients copied up to fp32 only for the update, then the master copied back
# into the model. The 16 is read after the step; during the update the fp32 gradient copies
# exist too, 4 bytes per parameter more (20 at that moment, an identity of this code: it makes
# every fp32 gradient before AdamW runs) until the step frees them. The
# first table's entries are the dtypes this code chose, read back: identities, not evidence.
# What is measured is what the master's choice costs, against the arm without it: AdamW
# stepping the bf16 model directly keeps its moments in bf16, 4 bytes per parameter instead of
# 8 (the second table).

# %%
torch.manual_seed(cfg.seed)
mixed_model = TinyGPT(*cfg.example[3:5], *cfg.example[:3]).to(device=device, dtype=torch.bfloat16)
master = [p.detach().float() for p in mixed_model.parameters()]
master_opt = torch.optim.AdamW(master, lr=1e-3)
tokens, targets = random_tokens(2, cfg.example[4], cfg.example[3], generator=torch.Generator().manual_seed(0), device=device)


def mixed_precision_step(model, master, opt):
    """One step of the bf16 `model` whose update AdamW (`opt`) makes on its fp32 `master` copy."""
    model.zero_grad(set_to_none=True)
    model.loss(tokens, targets).backward()
    for p32, p16 in zip(master, model.parameters()):
        p32.grad = p16.grad.float()          # transient fp32 gradient for the update
    opt.step()
    with torch.no_grad():
        for p32, p16 in zip(master, model.parameters()):
            p16.copy_(p32)
            p32.grad = None


mixed_record = measure(lambda: mixed_precision_step(mixed_model, master, master_opt), model=mixed_model,
                       optimizer=master_opt)
n_mixed = sum(p.numel() for p in mixed_model.parameters())
mixed_per_param = {"weights": mixed_record.param_bytes / n_mixed, "gradients": mixed_record.grad_bytes / n_mixed,
                   "fp32 master": sum(p.numel() * p.element_size() for p in master) / n_mixed,
                   "Adam moments": mixed_record.optimizer_bytes / n_mixed}
show_table([{**mixed_per_param, "total bytes/param": sum(mixed_per_param.values())}])
direct_opt = torch.optim.AdamW(mixed_model.parameters(), lr=1e-3)   # no master: AdamW on the bf16 weights


def direct_bf16_step(model, opt):
    """One step of the bf16 `model` whose update AdamW (`opt`) makes on the bf16 weights."""
    opt.zero_grad(set_to_none=True)
    model.loss(tokens, targets).backward()
    opt.step()


direct_bf16_step(mixed_model, direct_opt)   # creates the moments
direct_record = measure(lambda: direct_bf16_step(mixed_model, direct_opt), model=mixed_model, optimizer=direct_opt)
show_table([{"arm": "fp32 master + AdamW", "Adam moments bytes/param": mixed_record.optimizer_bytes / n_mixed},
            {"arm": "AdamW on the bf16 weights", "Adam moments bytes/param": direct_record.optimizer_bytes / n_mixed}])

# %%
# NBVAL_CHECK_OUTPUT
predicted_per_param = memory.state_bytes_per_param("adamw", "bf16-mixed")
# identities: the dtypes this code chose, read back, agree with the kit's table and sum to ZeRO's 16
assert mixed_per_param == {"weights": predicted_per_param["params"], "gradients": predicted_per_param["grads"],
                           "fp32 master": predicted_per_param["master_params"],
                           "Adam moments": predicted_per_param["optimizer"]}
assert sum(mixed_per_param.values()) == 16
# evidence: would fail if AdamW kept fp32 moments whatever the model's dtype
assert direct_record.optimizer_bytes / n_mixed == 4   # without the master, the moments follow the model


def layernorm_gains_after(steps, with_master):
    """The LayerNorm gains (built at 1.0) of a fresh bf16 TinyGPT after `steps` of the steps
    above, AdamW at lr 1e-3: on an fp32 master of every weight (the gains returned from it), or on
    the bf16 weights directly; the two arms differ in the master only."""
    torch.manual_seed(cfg.seed)
    net = TinyGPT(*cfg.example[3:5], *cfg.example[:3]).to(device=device, dtype=torch.bfloat16)
    weights = [p.detach().float() for p in net.parameters()] if with_master else list(net.parameters())
    opt = torch.optim.AdamW(weights, lr=1e-3)
    for _ in range(steps):
        if with_master:
            mixed_precision_step(net, weights, opt)
        else:
            direct_bf16_step(net, opt)
    names = [n for n, _ in net.named_parameters()]
    return torch.cat([w.detach().float() for n, w in zip(names, weights) if ".ln" in n and n.endswith("weight")])


# evidence for "small updates are rounded away": fails if bf16 could hold a step of lr 1e-3 at 1.0
direct_gains, master_gains = layernorm_gains_after(3, False), layernorm_gains_after(3, True)
print(f"LayerNorm gains after 3 AdamW steps at lr 1e-3: on the bf16 weights directly, "
      f"{(direct_gains == 1).float().mean():.0%} still exactly 1.0; on the fp32 master, "
      f"{(master_gains == 1).float().mean():.0%}")
assert (direct_gains == 1).all() and (master_gains != 1).any()

# %% [markdown]
# **Activations** are per token. Korthikanti et al. (2022) count one Megatron GPT layer, 16-bit
# activations with dropout, s = sequence, b = batch, h = hidden, a = heads:
# s·b·h·(34 + 5·a·s/h) bytes: 34·sbh for the linear layers, GELU, layer norms and dropout masks,
# 5·a·s²·b for the attention scores (softmax output, dropout mask, dropout output).
#
# **Recomputation** (`torch.utils.checkpoint`, `use_reentrant=False`) drops stored tensors and
# recomputes them in backward: *selective* recomputes only the attention core (the s² terms go,
# 34·sbh stay; cheap, since those ops have few FLOPs), *full* stores only each layer's input
# (2·sbh) and re-runs the layer's forward in backward (at most one extra forward pass; claim 3
# measures how much less).
#
# Our measurable stand-in is `course_utils.models.transformer.TinyGPT`: the same pre-norm block, no dropout,
# fp32 on CPU. Counting its saved tensors op by op (the module docstring lists them) gives
# 4·(16·sbh + a·s²·b) + 16·sb bytes per layer — the same structure without dropout masks and
# dropout outputs, with 4-byte elements.

# %%
s, b, h, a = 1024, 8, 768, 12
rows = [{"recompute": r,
         "Korthikanti 16-bit (MiB/layer)": memory.korthikanti_layer_activation_bytes(s, b, h, a, r) / 2**20,
         "TinyGPT fp32 (MiB/layer)": memory.tinygpt_layer_activation_bytes(s, b, h, a, r) / 2**20}
        for r in memory.RECOMPUTE_MODES]
show_table(rows)

# %% [markdown]
# ## 3 · Worked example: predict, then measure one step
#
# Predict every line for the example TinyGPT, then run one AdamW step under the ledger
# (`course_utils.ledger.measure`: saved-for-backward bytes through saved-tensor hooks, resident
# state from the model and optimizer). A first step runs before measuring so Adam's moments exist.

# %%
layers, hidden, heads, vocab, seq, batch = cfg.example
pred = memory.transformer_memory(*cfg.example, optimizer="adamw", precision="fp32")
record, model = measure_tinygpt(*cfg.example, optimizer="adamw", steps=2, device=device)
n_params = tinygpt_param_count(layers, hidden, vocab, seq)
print(f"{n_params:,} parameters")
comparison = record.compare({"activation_bytes": pred["activations"], "param_bytes": pred["params"],
                             "grad_bytes": pred["grads"], "optimizer_bytes": pred["optimizer"]})
print(comparison)

# %% [markdown]
# ## 4 · The evidence
#
# **Claim 1.** The predictor matches the measured stored activations byte for byte for every
# configuration swept below and every recomputation mode, and the resident state exactly.

# %%
sweep = []
for c in cfg.sweep:
    for mode in memory.RECOMPUTE_MODES:
        rec, _ = measure_tinygpt(*c, recompute=mode, steps=2, device=device)
        p = memory.transformer_memory(*c, recompute=mode)
        sweep.append({"layers,hidden,heads,vocab,seq,batch": str(c), "recompute": mode,
                      "predicted MiB": p["activations"] / 2**20,
                      "measured MiB": rec.activation_bytes / 2**20,
                      "measured − predicted (bytes)": rec.activation_bytes - p["activations"],
                      "resident exact": (rec.param_bytes, rec.grad_bytes, rec.optimizer_bytes)
                      == (p["params"], p["grads"], p["optimizer"])})
show_table(sweep)

# %%
# NBVAL_CHECK_OUTPUT
worst = max(abs(r["measured − predicted (bytes)"]) for r in sweep)   # bytes
assert worst == 0, sweep
assert all(r["resident exact"] for r in sweep)
comparison.assert_close(rtol=0)
assert all(p == m for n, p, m in comparison.lines if n in ("param_bytes", "grad_bytes", "optimizer_bytes")), \
    "the resident state is predicted exactly"

# %% [markdown]
# **Claim 2.** Optimizer state is 0 bytes for plain SGD, 1× the parameter bytes for SGD with
# momentum and 2× for Adam/AdamW — measured from `optimizer.state`, step counters excluded.

# %%
opt_rows = []
for name in OPTIMIZERS:
    rec, _ = measure_tinygpt(*cfg.sweep[0], optimizer=name, steps=2, device=device)
    opt_rows.append({"optimizer": name, "param_bytes": rec.param_bytes,
                     "optimizer_bytes": rec.optimizer_bytes,
                     "ratio": rec.optimizer_bytes / rec.param_bytes})
show_table(opt_rows)

# %%
# NBVAL_CHECK_OUTPUT
ratios = {r["optimizer"]: r["ratio"] for r in opt_rows}
assert ratios == {"sgd": 0.0, "sgd-momentum": 1.0, "adam": 2.0, "adamw": 2.0}, ratios

# %% [markdown]
# **Claim 3.** Recomputation trades compute for memory: full recomputation stores a small
# fraction of the activations at the end of the forward (the fraction printed below, equal to the
# op-by-op count's; during backward the block being recomputed adds its own internals again, one
# block at a time, which `what_fits` books as `recompute_workspace`) for less than the third more
# FLOPs that a whole extra forward pass would cost
# (a forward is a third of a step's matmul FLOPs here: backward runs two matmuls for each of
# forward's, asserted); selective drops the s² attention tensors for a few FLOPs. Why less than a
# third: the non-reentrant checkpoint stops recomputing as soon as backward has every tensor it
# needs (its *early stop*, torch's default), and autograd saves an op's inputs before the op runs,
# so the last op re-run is the one whose inputs complete the set. For a block under full
# recomputation that is the MLP's down-projection: its matmul (8·bsh² of the block's 24·bsh²) is
# never re-run, and the LM head sits outside the checkpoints, so full recomputation adds exactly
# L·(16·bsh² + 4·bs²h) FLOPs. Selective recomputation re-runs the attention core up to the
# probabilities·values product, which it skips for the same reason: L·2bs²h. Both are asserted
# exactly against the ledger's counts.

# %%
tradeoff = recompute_tradeoff(*cfg.recompute_model, device=device, repeats=cfg.repeats)
show_table(tradeoff)
tr = {r["mode"]: r for r in tradeoff}
_L, _h, _a, _v, _s, _b = cfg.recompute_model
predicted_full_ratio = 1 + _L * (16 * _b * _s * _h**2 + 4 * _b * _s**2 * _h) / tr["none"]["flops"]
predicted_full_memory_ratio = (memory.tinygpt_activation_bytes(*cfg.recompute_model, recompute="full")
                               / memory.tinygpt_activation_bytes(*cfg.recompute_model))
print(f"full recomputation stores {tr['full']['memory_ratio']:.4f} of the activations at the end of the forward "
      f"({predicted_full_memory_ratio:.4f} predicted by the op-by-op count); during backward one re-run "
      f"block's internals are alive again on top of that")
print(f"full recomputation: {tr['full']['flops_ratio']:.3f}x the FLOPs measured, {predicted_full_ratio:.3f}x "
      f"predicted with the early stop; a whole extra forward pass would be "
      f"{1 + tr['none']['forward_flops'] / tr['none']['flops']:.3f}x (forward: "
      f"{tr['none']['forward_flops'] / tr['none']['flops']:.3f} of a step's matmul FLOPs)")
fig, ax = plt.subplots(figsize=(5, 3.5))
for r in tradeoff:
    ax.scatter(r["flops_ratio"], r["memory_ratio"], s=60)
    ax.annotate(r["mode"], (r["flops_ratio"], r["memory_ratio"]), textcoords="offset points", xytext=(6, 4))
ax.set_xlabel("FLOPs per step (relative to none)")
ax.set_ylabel("stored activations (relative to none)")
ax.set_title("recomputation: memory kept vs compute paid")
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
assert tr["full"]["activation_bytes"] == memory.tinygpt_activation_bytes(*cfg.recompute_model, recompute="full")
assert tr["full"]["memory_ratio"] == predicted_full_memory_ratio < 0.3, "full recomputation keeps a small fraction"
assert tr["none"]["flops"] == 3 * tr["none"]["forward_flops"], "a step is three forwards' matmul FLOPs"
assert tr["full"]["flops"] - tr["none"]["flops"] == _L * (16 * _b * _s * _h**2 + 4 * _b * _s**2 * _h), \
    "full: each block re-run up to the MLP down-projection's inputs (the early stop)"
assert tr["full"]["flops_ratio"] < 4 / 3, "full: less than one whole extra forward pass"
# the ledger's *repeated* line (lesson 01) books exactly that extra work, and nothing without recomputation
assert tr["none"]["recomputed_flops"] == 0
assert all(tr[m]["recomputed_flops"] == tr[m]["flops"] - tr["none"]["flops"] > 0 for m in ("selective", "full"))
assert tr["selective"]["flops"] - tr["none"]["flops"] == _L * 2 * _b * _s**2 * _h, \
    "selective: the attention scores re-run, the probabilities·values product skipped"
assert tr["none"]["activation_bytes"] - tr["selective"]["activation_bytes"] == _L * 4 * _a * _s**2 * _b, \
    "selective: exactly the fp32 s² probabilities, a·s²·b per layer, are no longer kept"

# %% [markdown]
# **Claim 4.** At this shape, bf16 autocast shrinks the activations, not the optimizer state. Autocast runs the
# matmuls in bf16, so their saved inputs are 2-byte; the residual stream and layer-norm inputs
# stay fp32. It also saves bf16 *copies of the weights* for backward, which the ledger counts as
# saved tensors although they do not grow with the batch — so we compare the per-sample slope
# (bytes at batch 2b minus bytes at batch b), in which the weight copies cancel.
#
# How much they shrink depends on the device, and the prediction says so before we measure.
# Counted op by op (`memory.tinygpt_layer_activation_bytes`), a block keeps 36·sbh bytes under
# autocast instead of 64·sbh, plus the softmax output P: on a **CPU** autocast runs softmax in
# bf16 and P is one 2-byte tensor shared by softmax's backward and P @ v (2·as²b instead of
# 4·as²b); on **CUDA** autocast runs softmax in fp32, so P is kept in fp32 for softmax's backward
# *and* as the bf16 copy P @ v saves: 6·as²b, more than fp32's 4·as²b. CUDA also keeps two
# bytes per logit that a CPU does not (2·sbv): our loss runs inside autocast on bf16 logits, and
# cross-entropy is log-softmax then NLL. CUDA autocast runs log-softmax in bf16 and keeps its
# output, then NLL, an fp32 op, keeps an fp32 copy of it (2 + 4 bytes per logit); CPU autocast
# runs log-softmax in fp32 and NLL keeps that one tensor (4). The first GPU run of this lesson
# found that term before it was explained; the explanation is checked on a CPU by
# `tests/test_memory.py::test_cuda_autocast_keeps_log_softmax_in_bf16_and_an_fp32_copy`, which
# reads the dtype of each tensor the two ops keep.
#
# **No GPU is needed for the CUDA row.** Autocast's rules are entries of PyTorch's dispatcher,
# keyed by device, and fake tensors (shapes and dtypes, no data; lesson 11 plans with them) can
# claim to live on CUDA. So on a CPU we run the forward on fake CUDA tensors under CUDA's rules
# (`ledger.autocast_rules`) and read what it keeps for backward (`ledger.kept_after_forward`; the
# forward only, as backward on CUDA tensors needs a GPU). The same reading under CPU's rules must
# equal the real step measured here, which checks the reading itself. What it cannot check here
# is that a real GPU's kernels keep what the dispatcher's fake kernels declare; that anchor is
# the H200 run: `tests/test_memory.py::test_cuda_autocast_rules_on_fake_cuda_tensors_reproduce_the_h200_run`
# finds this reading equal, byte for byte, to all four of its recorded rows (two shapes, with
# and without full recomputation).

# %%
ex = list(cfg.sweep[1])
def measured(batch, autocast):
    return measure_tinygpt(*ex[:5], batch, autocast=autocast, steps=2, device=device)[0]
def predicted_slope(autocast_device):
    return (memory.tinygpt_activation_bytes(*ex[:5], 8, autocast=autocast_device)
            - memory.tinygpt_activation_bytes(*ex[:5], 4, autocast=autocast_device))
def fake_slope(device_type):   # the forward under device_type's autocast rules, fake tensors
    return (tinygpt_kept_under_rules_of(device_type, *ex[:5], 8)
            - tinygpt_kept_under_rules_of(device_type, *ex[:5], 4))
slope = {ac: measured(8, ac).activation_bytes - measured(4, ac).activation_bytes for ac in (False, True)}
slope_under_rules = {dev: fake_slope(dev) for dev in ("cpu", "cuda")}
opt_bytes = {ac: measured(4, ac).optimizer_bytes for ac in (False, True)}
bf16_ratio = slope[True] / slope[False]
predicted_ratio = {dev: predicted_slope(dev) / predicted_slope(None) for dev in ("cpu", "cuda")}
show_table([{"device": dev, "predicted per-sample bf16/fp32": r,
             "fake tensors, that device's rules": slope_under_rules[dev] / slope[False],
             "real step measured here": bf16_ratio if dev == device.type else "not on this machine"}
            for dev, r in predicted_ratio.items()])
print(f"per-sample activations bf16/fp32 = {bf16_ratio:.3f} measured on {device.type} "
      f"(predicted {predicted_ratio[device.type]:.3f}); optimizer bytes bf16/fp32 = "
      f"{opt_bytes[True] / opt_bytes[False]:.3f}")

# %%
# NBVAL_CHECK_OUTPUT
# exact, byte for byte: the real step on this device, and both devices' rules on fake tensors
assert slope[False] == predicted_slope(None)
assert slope[True] == predicted_slope(device.type), (slope[True], predicted_slope(device.type))
assert slope_under_rules[device.type] == slope[True]     # the fake reading agrees with the real step
assert slope_under_rules["cuda"] == predicted_slope("cuda") != predicted_slope("cpu") == slope_under_rules["cpu"]
assert predicted_ratio["cpu"] < predicted_ratio["cuda"] < 1, "autocast shrinks activations on both, less on CUDA"
# identity, not evidence: autocast never changes the parameters' dtype, so the optimizer state
# cannot differ (section 2's bf16-model arm is where the moments really shrink)
assert opt_bytes[True] == opt_bytes[False]

# %% [markdown]
# **Not at every shape.** With eager attention a layer keeps 36·sbh + 6·as²b bytes under CUDA
# autocast against 64·sbh + 4·as²b in fp32: more, once a·s > 14·h. GPT-2 small's width and
# heads put that point between the two sequence lengths below. One layer's bytes under CUDA's
# rules, read on fake CUDA tensors at GPT-2 small's width (a two-layer model minus a one-layer
# one, per sample: batch 2 minus batch 1, so autocast's weight copies cancel), against fp32's
# op-by-op count:

# %%
def layer_under_cuda_rules(seq):
    reading = {(layers, batch): tinygpt_kept_under_rules_of("cuda", layers, small["hidden"], small["heads"],
                                                             50257, seq, batch)
               for layers in (1, 2) for batch in (1, 2)}
    return (reading[2, 2] - reading[2, 1]) - (reading[1, 2] - reading[1, 1])
crossover_seq = 14 * small["hidden"] / small["heads"]
layer_ratio = {seq: layer_under_cuda_rules(seq) / memory.tinygpt_layer_activation_bytes(seq, 1, small["hidden"], small["heads"])
               for seq in (768, 1024)}
for seq, ratio in layer_ratio.items():
    print(f"GPT-2 small's layer, sequence {seq} (a·s = {small['heads'] * seq:,} vs 14·h = {14 * small['hidden']:,}), "
          f"eager attention: CUDA bf16 autocast keeps {ratio:.3f}x fp32's bytes")

# %%
# NBVAL_CHECK_OUTPUT
assert 768 < crossover_seq < 1024     # arithmetic on GPT-2 small's shape (identity); the evidence is next
assert layer_ratio[768] < 1 < layer_ratio[1024], layer_ratio   # the crossover, on both sides of it

# %% [markdown]
# The table's wall-clock columns are printed, not claimed: on these tiny CPU shapes a checkpoint's
# per-op and hook overhead and the memory-bound softmax weigh more than the FLOPs say, and a
# median of a few runs on a shared CPU is noisy; no claim rests on time.
#
# Checkpointing every block is one end of a range. Keeping the inputs of every k-th block instead
# stores n/k block inputs plus, during backward, the k blocks of one segment re-run at once:
# n/k + k is smallest at k = √n, which is Chen et al.'s (2016) √n memory for one extra forward.
#
# Section 1's 16-bit activations are Korthikanti et al.'s count for Megatron's layer (fused
# softmax, 5 bytes per score), not plain PyTorch autocast's; fused attention
# (`scaled_dot_product_attention`) keeps no s² tensor at all, which is why real runs use it.
#
# **On a GPU** the allocator reports what the step really took: `torch.cuda.max_memory_allocated`
# (everything allocated at the peak; the lesson's `cuda_peak_bytes` subtracts what existed before
# the step), and a snapshot of every allocation that
# [pytorch.org/memory_viz](https://pytorch.org/memory_viz) draws over time. On a CPU both helpers
# return `None` and record nothing.

# %%
def one_step():
    measure_tinygpt(*cfg.example, steps=2, device=device)
peak = cuda_peak_bytes(one_step, device)
snapshot = record_memory_snapshot(one_step, "build/06_memory_snapshot.pickle")
print("CUDA peak:", "n/a on CPU" if peak is None else f"{peak / 2**20:.1f} MiB",
      "| snapshot:", snapshot or "n/a on CPU")
# At the end of the forward pass the weights, Adam's moments and every stored activation are alive
# together, so the allocator's peak cannot be below their predicted sum (it is above it by the
# temporaries, gradients and workspaces the predictor leaves out). Checked where there is a GPU.
stored_at_end_of_forward = pred["params"] + pred["optimizer"] + pred["activations"]
if peak is not None:
    print(f"predicted stored at the end of forward: {stored_at_end_of_forward / 2**20:.1f} MiB")
    assert peak >= stored_at_end_of_forward, (peak, stored_at_end_of_forward)

# %% [markdown]
# **What fits.** The widget below (live kernel only) sets model, batch, sequence, precision,
# optimizer, recomputation and attention and draws the predicted breakdown against a device. It
# counts fused attention (`scaled_dot_product_attention`, what a GPU run uses) unless told
# "eager": the fused kernel keeps its output and one log-sum-exp per row and head instead of the
# s² probabilities this lesson's TinyGPT writes out (in fp32 both counts are TinyGPT's, measured
# byte for byte in `tests/test_memory.py`; the 16-bit eager one is Korthikanti's count for
# Megatron's layer, and the 16-bit fused one, 36·sbh + 4·asb, the kit's own derivation from
# the same layer with the s² terms replaced by the kernel's output and log-sum-exp, not a
# published figure). Megatron's layer keeps less than plain PyTorch autocast does on CUDA
# (claim 4's count), so with eager attention the widget's headroom is optimistic. The static
# plot shows three settings of GPT-2 small on a T4.

# %%
# the two counts for one GPT-2 small layer at sequence 1024, batch 8, eager attention: 34·sbh +
# 5·as²b against 36·sbh + 6·as²b + 16·sb, smaller term by term and so at every shape (an identity
# of the formulas; the assert checks the two functions at this one shape)
layer_shape = dict(seq=1024, batch=8, hidden=small["hidden"], heads=small["heads"])
megatron_layer = memory.korthikanti_layer_activation_bytes(**layer_shape)
autocast_layer = memory.tinygpt_layer_activation_bytes(**layer_shape, autocast="cuda")
print(f"one layer keeps {megatron_layer / GiB:.2f} GiB in Megatron's count, {autocast_layer / GiB:.2f} GiB "
      f"under CUDA autocast ({autocast_layer / megatron_layer:.2f}×)")
assert megatron_layer < autocast_layer

# %%
what_fits_widget()

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 4), sharey=True)
# like for like: panels 1 and 2 differ in precision only, panels 2 and 3 in attention only
settings = [dict(precision="fp32", batch=8, attention="sdpa"), dict(precision="fp16-mixed", batch=8, attention="sdpa"),
            dict(precision="fp16-mixed", batch=8, attention="eager")]
for ax, kw in zip(axes, settings):
    rep = memory.what_fits("GPT-2 small (124M)", seq=1024, **kw)
    plot_memory_breakdown(rep, ax=ax, title=", ".join(f"{k}={v}" for k, v in kw.items()))
    print(", ".join(f"{k}={v}" for k, v in kw.items()) + f": {rep['total'] / GiB:.2f} GiB, fits a T4: {rep['fits']}")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5 · The boundary
#
# - On CPU we measure what autograd **stores**, not peak memory. The predictor leaves out the CUDA
#   context, allocator caching and fragmentation, kernel workspaces, temporaries inside and between
#   ops, the activation gradients (dL/dx) alive during backward, and the one layer full recomputation
#   re-materialises (`what_fits` adds that one as "recompute_workspace"). A real peak is higher:
#   treat a small headroom as "does not fit". Its "total" is a conservative sum of lines, not one
#   instant: with gradients freed before each step, they do not exist at the end of the forward,
#   and activations are freed as gradients appear; the real peak usually falls early in backward
#   or at the optimizer step. And the caching allocator keeps freed blocks *reserved*: an
#   out-of-memory error and `nvidia-smi` see reserved memory plus fragmentation, more than
#   `max_memory_allocated`.
# - The 16-bit formula assumes Megatron's layer (dropout, fused kernels, fp32 logits). Our fp32
#   TinyGPT has no dropout, so its count is the derived one above; the two agree in structure, not
#   in constants. Autocast's per-op dtypes differ between devices (softmax is fp32 on CUDA, bf16
#   on CPU), which is why claim 4 predicts per device. Its CUDA row is checked here on fake CUDA
#   tensors, which see the dispatcher's dtypes but not the GPU's allocator (caching,
#   temporaries) nor which attention kernel a real GPU would pick; on a GPU the lesson also
#   asserts the real step.
# - The T4 (Colab) and the V100 have no bf16: there mixed precision is fp16 autocast with a
#   GradScaler, which stores the same bytes as bf16 would (both 16-bit types take 2 bytes, and
#   the fp32 copies are the same); "what fits" picks it for them (`precision=None`),
#   refuses bf16 on them, and counts the T4 below its marketed 16 GB, at the total memory torch
#   is commonly quoted to report for it (an assumption held in `memory.DEVICES`, not checked
#   here: no T4 was lent); the CUDA context's share is not subtracted. The other devices are counted at their marketed size
#   in GiB, which is at or above what a GPU reports: a plan near the edge needs headroom.
# - Wall-time ratios on a shared CPU are noisy (on a busy machine full recomputation can even
#   *look* faster); FLOP ratios are exact counts of matmul FLOPs, so the evidence asserts those.
# - Activation memory is one line. Sharding the resident state across devices (lesson 08) or
#   splitting the layers (lesson 09) mostly changes which device holds which bytes; not always
#   the total: tensor parallelism without sequence parallelism keeps some activations on every
#   rank, and 1F1B holds fewer micro-batches at once than GPipe.

# %% [markdown]
# ## Exercises
#
# Your exercises' configuration, drawn from `STUDENT_ID`: a TinyGPT (`task.layers`, `task.hidden`,
# `task.heads`, `task.vocab`, `task.seq`, `task.batch`: the order of `measure_tinygpt`'s arguments and of
# section 3's `cfg.example`), an optimizer `task.optimizer`, and a preset model, sequence length
# and GPU for the last question. The first two checks build your TinyGPT and measure one step
# with `measure_tinygpt`, as section 4 did.
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.

# %%
from course_utils.variants import exercise_variant

task = exercise_variant("06_training_memory", STUDENT_ID, layers=(2, 1, 3), hidden=(64, 32, 48, 96),
                        heads=(4, 2, 8), vocab=(97, 50, 64, 128), seq=(32, 16, 24, 48), batch=(3, 2, 4, 5),
                        optimizer=("adamw", "sgd-momentum", "sgd", "adam"),
                        model=("GPT-2 medium (350M)", "GPT-2 small (124M)", "GPT-2 large (774M)"),
                        gpt_seq=(1024, 512, 2048), gpu=("T4 (Colab) 16 GB", "V100 16 GB", "L4 24 GB"))
task

# %% [raw]
# # BEGIN QUESTION
# name: q1_resident_bytes
# points: 1

# %% [markdown]
# **Exercise 1 — predict, then measure.** Your TinyGPT trains in fp32 with `task.optimizer`
# (a name in `course_utils.optim.OPTIMIZERS`). Write `resident_bytes(n_params, optimizer)`: the
# bytes of weights, gradients and optimizer state after a step of a model with `n_params` fp32
# parameters trained with `optimizer`. The check counts your TinyGPT's parameters with
# `tinygpt_param_count`, passes that count to your function and compares with your
# configuration's measured `param_bytes + grad_bytes + optimizer_bytes` after two steps; the
# answer must be exact.

# %% [raw]
# # BEGIN SOLUTION

# %%
def resident_bytes(n_params, optimizer):
    # BEGIN SOLUTION
    state_per_param = {"sgd": 0, "sgd-momentum": 4, "adam": 8, "adamw": 8}[optimizer]  # fp32 buffers
    return n_params * (4 + 4 + state_per_param)     # weight + gradient + optimizer state
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_rec, _ = measure_tinygpt(task.layers, task.hidden, task.heads, task.vocab, task.seq, task.batch,
                          optimizer=task.optimizer, steps=2)
check_close(resident_bytes(tinygpt_param_count(task.layers, task.hidden, task.vocab, task.seq), task.optimizer),
            _rec.param_bytes + _rec.grad_bytes + _rec.optimizer_bytes, rtol=0,
            what=f"resident bytes of your TinyGPT with {task.optimizer}")

# %%
# HIDDEN
for _cfg, _opt in (((1, 32, 2, 50, 16, 2), "sgd"), ((3, 48, 8, 64, 24, 4), "sgd-momentum"),
                   ((2, 96, 4, 128, 48, 2), "adamw")):
    _hrec, _ = measure_tinygpt(*_cfg, optimizer=_opt, steps=2)
    check_close(resident_bytes(tinygpt_param_count(_cfg[0], _cfg[1], _cfg[3], _cfg[4]), _opt),
                _hrec.param_bytes + _hrec.grad_bytes + _hrec.optimizer_bytes, rtol=0,
                what=f"resident bytes of TinyGPT{_cfg} with {_opt}")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_selective_saving
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** How many bytes of stored activations does *selective*
# recomputation save on your TinyGPT (fp32, no autocast), compared with no recomputation? Write
# `selective_saving(layers, hidden, heads, seq, batch)` from section 2's op-by-op count. The check
# measures your configuration's `activation_bytes` with `recompute="none"` and with
# `recompute="selective"` and takes the difference; the answer must be exact.

# %% [raw]
# # BEGIN SOLUTION

# %%
def selective_saving(layers, hidden, heads, seq, batch):
    # BEGIN SOLUTION
    # per layer, selective drops the a·s²·b softmax output (4 bytes each) and keeps every sbh term
    return layers * 4 * heads * seq * seq * batch
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_kept = {mode: measure_tinygpt(task.layers, task.hidden, task.heads, task.vocab, task.seq, task.batch,
                               recompute=mode, steps=2)[0].activation_bytes for mode in ("none", "selective")}
check_close(selective_saving(task.layers, task.hidden, task.heads, task.seq, task.batch),
            _kept["none"] - _kept["selective"], rtol=0,
            what="stored-activation bytes selective recomputation saves on your TinyGPT")

# %%
# HIDDEN
for _cfg in ((1, 32, 2, 50, 16, 2), (3, 48, 8, 64, 24, 4), (2, 96, 4, 128, 48, 5)):
    _hkept = {mode: measure_tinygpt(*_cfg, recompute=mode, steps=2)[0].activation_bytes
             for mode in ("none", "selective")}
    check_close(selective_saving(_cfg[0], _cfg[1], _cfg[2], _cfg[4], _cfg[5]),
                _hkept["none"] - _hkept["selective"], rtol=0,
                what=f"bytes selective recomputation saves on TinyGPT{_cfg}")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_largest_batch
# points: 1

# %% [markdown]
# **Exercise 3 — search.** Using `memory.what_fits`, find the largest batch (1–64) at which
# `task.model` trains with mixed-precision AdamW at sequence `task.gpt_seq` on a `task.gpu`
# (`precision=None`: the device's own, fp16 where there is no bf16; fused attention, its default), without recomputation and
# with `recompute="full"`; 0 where none fits. Search in cells of your own, then set
# `largest_batches = {"none": ..., "full": ...}` to the two batches (whole numbers). The check
# holds each against `what_fits` itself: it must fit, and one more must not (unless you answered
# 64 or 0). How many more sequences does full recomputation buy?

# %% [raw]
# # BEGIN SOLUTION

# %%
largest_batches = {mode: max([b for b in range(1, 65) if memory.what_fits(task.model, batch=b, seq=task.gpt_seq, device=task.gpu, recompute=mode)["fits"]], default=0) for mode in ("none", "full")}  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
assert isinstance(largest_batches, dict) and set(largest_batches) == {"none", "full"}, \
    f'largest_batches must be a dict with the keys "none" and "full", got {largest_batches!r}'
for _mode, _b in largest_batches.items():
    assert isinstance(_b, int) and 0 <= _b <= 64, \
        f"largest_batches[{_mode!r}] must be a whole number from 0 to 64, got {_b!r}"
    assert _b == 0 or memory.what_fits(task.model, batch=_b, seq=task.gpt_seq, device=task.gpu,
                                  recompute=_mode)["fits"], \
        f"recompute={_mode!r}: batch {_b} does not fit {task.model} at seq {task.gpt_seq} on a {task.gpu}: too large"
    assert _b == 64 or not memory.what_fits(task.model, batch=_b + 1, seq=task.gpt_seq, device=task.gpu,
                                       recompute=_mode)["fits"], \
        f"recompute={_mode!r}: batch {_b + 1} still fits {task.model} at seq {task.gpt_seq} on a {task.gpu}: " \
        f"{_b} is not the largest"

# %%
# HIDDEN
# the same search, every batch from 1 to 64 (not only your answer and one more)
for _mode in ("none", "full"):
    _fitting = [b for b in range(1, 65) if memory.what_fits(task.model, batch=b, seq=task.gpt_seq,
                                                       device=task.gpu, recompute=_mode)["fits"]]
    check_equal(largest_batches[_mode], max(_fitting, default=0),
                what=f"largest batch for {task.model}, seq {task.gpt_seq}, {task.gpu}, recompute={_mode}")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(
    predictor_worst_error_bytes=worst,
    adam_state_over_params=ratios["adam"],
    full_recompute_stored_fraction=tr["full"]["memory_ratio"],
    full_recompute_flops_paid=tr["full"]["flops_ratio"],
    selective_memory_kept=tr["selective"]["memory_ratio"],
    bf16_per_sample_activation_ratio=bf16_ratio,
    gpt2_small_16bit_eager_adam_gib=gpt2["total"] / GiB,
)
