# %% [markdown]
# # 01 · The resource ledger of one update step
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/01_resource_ledger.ipynb)
#
# A learning objective is also a plan for spending compute. Before running an experiment we draw
# up the **resource ledger** (资源账, the source texts' term) of one update step — and in this notebook we predict every
# line of it by hand and then measure it.

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
import torch.nn.functional as F

from course_utils.data import load_dataset
from course_utils.evaluate import classification_accuracy
from course_utils.ledger import measure, predict_step
from course_utils.models import MLP, SmallResNet
from course_utils.optim import OPTIMIZERS
from course_utils.plots import plot_curves
from course_utils.report import format_table, headline, show_table
from course_utils.runtime import setup
from course_utils.scales import config
from course_utils.objectives import Supervised, make_step
from course_utils.train import EvalEvery, fit

cfg = config(
    SCALE,
    ci=dict(image_size=16, batches=[4, 8, 16], width=8, train_limit=512, train_image_size=16,
            train_width=8, steps=20, batch_size=32, eval_every=10, lr=0.05),
    default=dict(image_size=32, batches=[16, 32, 64, 128], width=16, train_limit=None,
                 train_image_size=16, train_width=16, steps=600, batch_size=128, eval_every=100, lr=0.05),
    gpu=dict(image_size=32, batches=[64, 128, 256, 512], width=32, train_limit=None,
             train_image_size=32, train_width=32, steps=2000, batch_size=256, eval_every=200, lr=0.1),
)
device = setup(SCALE, seed=cfg.seed)
dataset = "cifar10" if SCALE == "gpu" else "shapes"
train = load_dataset(dataset, "train", image_size=cfg.image_size, device=device,
                     download=SCALE == "gpu", limit=cfg.train_limit)
test = load_dataset(dataset, "test", image_size=cfg.image_size, device=device,
                    download=SCALE == "gpu", limit=cfg.train_limit)
print(train, test, sep="\n")

# %% [markdown]
# ## The problem
#
# Finding an objective that scales does not make training free. More data, a larger network and
# longer training still need storage, compute and time, and several devices working together add
# their own cost. The question for this course is sharper than "models are expensive": **which
# experiment can this machine actually run?** The objective, the data supply and the compute
# conditions decide that *together*.
#
# So before an experiment we write down, for **one update step**:
#
# | ledger line | question | unit |
# |---|---|---|
# | encoded now | how many new images (views, patches) go through the expensive encoder? | items |
# | kept for backward | how many activation bytes stay alive until backward? | bytes |
# | cached | how many old vectors are reused from earlier steps? | bytes |
# | resident state | weights, gradients, optimizer states | bytes |
# | repeated | what does this step compute a second time (a forward re-run in backward; inputs encoded twice) instead of keeping or caching it? | FLOPs, items |
# | communicated | with several devices: bytes across the wire per step | bytes |
#
# Later lessons change one line at a time: SimCLR grows *kept for backward* with the batch, MoCo
# moves candidates into *cached*, MAE shrinks *encoded now*. Here we build the instrument.

# %% [markdown]
# ## The mechanism
#
# `course_utils.ledger.measure(step, model=..., optimizer=...)` runs one step and reads each line
# off PyTorch itself, counted rather than estimated:
#
# - **FLOPs** come from the per-operator formulas PyTorch's `FlopCounterMode` uses (matmul, conv,
#   attention; element-wise ops such as BatchNorm, ReLU or the optimizer's update are not
#   counted). Each op is booked as *forward* or *backward* by asking the autograd engine whether
#   a backward pass is running at that moment.
# - **Kept for backward**: autograd calls a *pack hook* (`saved_tensors_hooks`) for every tensor
#   it saves for backward. We count each underlying storage once (ReLU's output is also the next
#   layer's input) and skip parameters and buffers, which are resident anyway. The ledger reports
#   the *peak* of what is alive (lesson 02 checks that four micro-batches do not count four times).
# - **Resident state**: bytes of parameters, of their `.grad`, of the optimizer's per-parameter
#   state, and of any cache tensors we register.
# - **Encoded now**: a forward pre-hook counts the items entering the encoder.
#
# The analytic side, `predict_step(model, input_shape)`, uses only shapes and per-layer rules
# (a Linear layer costs 2·n·in·out FLOPs forward and saves its input; ReLU saves its output; ...).

# %% [markdown]
# ## Worked example: a supervised step, predicted by hand
#
# One step of a two-layer MLP classifier on flattened images: `Linear(d, h) → ReLU → Linear(h, c)`,
# cross-entropy, SGD. With batch `B`, input size `d = 3·H·W`, hidden `h`, classes `c`, fp32 (4 bytes):
#
# - forward FLOPs: `2·B·d·h + 2·B·h·c` (a multiply and an add per weight per sample);
# - backward FLOPs: the second layer needs the gradient w.r.t. its weights *and* its input
#   (`2 · 2·B·h·c`); the first layer only w.r.t. its weights (`2·B·d·h`) — nobody needs the
#   gradient of the raw images;
# - kept for backward: the input `B·d`, the ReLU output `B·h` (also the second layer's input), the
#   log-softmax `B·c`, the int64 targets `B·8` bytes, and one scalar (NLL's total weight);
# - resident: parameters `(d+1)·h + (h+1)·c` floats, as many gradient floats, no SGD state.

# %%
B, h = cfg.batches[1], 64
c = len(train.classes)
d = train.images[0].numel()
mlp = MLP(d, h, c, layers=2).to(device)
sgd = torch.optim.SGD(mlp.parameters(), lr=cfg.lr)
x, y = train.images[:B], train.labels[:B]

n_params = (d + 1) * h + (h + 1) * c
by_hand = {
    "forward_flops": 2 * B * d * h + 2 * B * h * c,
    "backward_flops": 2 * B * d * h + 2 * 2 * B * h * c,
    "activation_bytes": 4 * B * d + 4 * B * h + 4 * B * c + 8 * B + 4,
    "param_bytes": 4 * n_params,
    "grad_bytes": 4 * n_params,
    "optimizer_bytes": 0,
}
by_hand["flops"] = by_hand["forward_flops"] + by_hand["backward_flops"]

step = make_step(Supervised(mlp), sgd)
record = measure(lambda: step((x, y)), model=mlp, optimizer=sgd)
comparison = record.compare(by_hand)
print(comparison)

# %% [markdown]
# ## The evidence
#
# The hand prediction and the measurement must agree line by line, exactly (`rtol=0`): these are
# counts, so any term we forgot (even the 8·B bytes of int64 targets, or the biases) or
# any extra tensor autograd keeps makes this cell fail.

# %%
# NBVAL_CHECK_OUTPUT
comparison.assert_close(rtol=0)
assert record.encoded == {"images": B}
assert record.optimizer_bytes == 0 and record.grad_bytes == record.param_bytes

# %% [markdown]
# The same check for a convolutional network, where counting by hand gets tedious:
# `predict_step` applies the per-layer rules (convolutions save their input, BatchNorm its input
# plus two statistics per channel, ReLU its output) to the shapes of a forward pass on PyTorch's
# `meta` device, which computes shapes and nothing else. Adam this time: two extra fp32 moments
# per parameter.

# %%
resnet = SmallResNet(width=cfg.width, num_classes=c).to(device)
adam = torch.optim.Adam(resnet.parameters(), lr=1e-3)
resnet_step = make_step(Supervised(resnet), adam)
resnet_record = measure(lambda: resnet_step((x, y)), model=resnet, optimizer=adam)
resnet_comparison = resnet_record.compare(predict_step(resnet, x.shape, optimizer="adam"))
print(resnet_comparison)

# %%
# NBVAL_CHECK_OUTPUT
resnet_comparison.assert_close(rtol=0)
assert resnet_record.optimizer_bytes == 2 * resnet_record.param_bytes
# repeated (forwards recomputed in backward, inputs encoded twice): measured, and none in a
# supervised step. Cached and communicated are zero by construction here (no cache registered, no
# process group), so they are shown, not tested
assert resnet_record.recomputed_flops == 0 and resnet_record.re_encoded == {}
assert (resnet_record.cache_bytes, resnet_record.comm_bytes) == (0, 0)
backward_over_forward = {"MLP": record.backward_flops / record.forward_flops,
                         "ResNet": resnet_record.backward_flops / resnet_record.forward_flops}
print("backward / forward FLOPs: " + ", ".join(f"{k} {v:.3f}" for k, v in backward_over_forward.items()))
# evidence: every conv but the stem computes two gradients (weights and input), each as costly as
# its forward; fails if backward skipped the input gradients or computed more than the two
assert 1.9 < backward_over_forward["ResNet"] < 2.0, backward_over_forward

# %% [markdown]
# Backward costs about twice the forward: a layer needs the gradient of its weights and of its
# input, each about as costly as its forward (the ResNet's ratio, printed, just under 2: its stem
# needs no input gradient). The MLP's ratio is close to 1 instead (printed), because its first
# layer, which holds almost all of its FLOPs (d ≫ c), is the one that needs no input gradient:
# nobody needs the gradient of the raw images. So "forward a third, backward two thirds" is a rule
# for deep networks, not for every step.
#
# ### Batch size moves one line, not the others
#
# Doubling the batch doubles what is kept for backward; the resident state — weights, gradients,
# optimizer moments — does not care how many images went through.

# %%
sweep = []
for batch in cfg.batches:
    model = SmallResNet(width=cfg.width, num_classes=c).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = make_step(Supervised(model), opt)
    xb, yb = train.images[:batch], train.labels[:batch]
    rec = measure(lambda: run((xb, yb)), model=model, optimizer=opt)
    pred = predict_step(model, xb.shape, optimizer="adam")
    assert (rec.activation_bytes, rec.flops) == (pred["activation_bytes"], pred["flops"]), batch
    sweep.append({"batch": batch, "activation MB": rec.activation_bytes / 1e6,
                  "predicted activation MB": pred["activation_bytes"] / 1e6,
                  "resident MB": rec.resident_bytes / 1e6, "GFLOP": rec.flops / 1e9})
print(format_table(sweep))

fig, ax = plt.subplots(figsize=(5, 3.2))
bs = [r["batch"] for r in sweep]
ax.plot(bs, [r["activation MB"] for r in sweep], "o-", label="kept for backward (measured)")
ax.plot(bs, [r["predicted activation MB"] for r in sweep], "x--", label="kept for backward (predicted)")
ax.plot(bs, [r["resident MB"] for r in sweep], "s-", label="resident state (measured)")
ax.set_xlabel("batch size"); ax.set_ylabel("MB"); ax.legend(); ax.set_title("One SmallResNet step")
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
# kept for backward is an exact straight line in the batch: a·B + b, where b is the part that
# does not scale with the batch (BatchNorm's two statistics per channel, NLL's scalar)
acts = [r["activation MB"] * 1e6 for r in sweep]
slope = (acts[-1] - acts[0]) / (bs[-1] - bs[0])
intercept = acts[0] - slope * bs[0]
for b_, a_ in zip(bs, acts):
    assert abs(slope * b_ + intercept - a_) <= 1e-6 * a_, (b_, a_)
# the part that does not scale, counted: two fp32 statistics per BatchNorm channel, NLL's scalar
batchnorm_channels = sum(m.num_features for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
assert round(intercept) == 8 * batchnorm_channels + 4, (intercept, batchnorm_channels)
assert len({round(r["resident MB"], 9) for r in sweep}) == 1

# %% [markdown]
# ### The step is real: train with it
#
# The ledger describes a step that learns. The same kind of step (`make_step(Supervised(model), opt)`,
# here with SGD and momentum instead of Adam, and smaller images, below), in the course's one
# training loop (`course_utils.train.fit`), trains the ResNet on the embedded shapes dataset
# (class = shape; colour, position, size, rotation and texture are nuisances). On a CPU we train
# at `train_image_size` pixels a side; the ledger's prediction says what that saves against 32
# (printed: a convolution's FLOPs grow with the number of pixels, so halving the side quarters them).

# %%
pixels_saving = {size: predict_step(SmallResNet(width=cfg.train_width, num_classes=c),
                                    (cfg.batch_size, 3, size, size))["flops"] for size in (16, 32)}
print(f"one training step of this ResNet at batch {cfg.batch_size}: {pixels_saving[32] / 1e9:.2f} GFLOP at 32 px, "
      f"{pixels_saving[16] / 1e9:.2f} GFLOP at 16 px ({pixels_saving[32] / pixels_saving[16]:.2f}x)")
assert abs(pixels_saving[32] / pixels_saving[16] - 4) < 0.05, "FLOPs ∝ pixels: 4x for twice the side"

if cfg.train_image_size != cfg.image_size:
    train = load_dataset(dataset, "train", image_size=cfg.train_image_size, device=device,
                         download=SCALE == "gpu", limit=cfg.train_limit)
    test = load_dataset(dataset, "test", image_size=cfg.train_image_size, device=device,
                        download=SCALE == "gpu", limit=cfg.train_limit)
torch.manual_seed(cfg.seed)
model = SmallResNet(width=cfg.train_width, num_classes=c).to(device)
opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
history = fit(
    make_step(Supervised(model), opt),
    train.batches(cfg.batch_size, seed=cfg.seed),
    steps=cfg.steps,
    callbacks=[EvalEvery(cfg.eval_every, lambda: {"test_acc": classification_accuracy(model, test)})],
    desc="supervised",
)
test_acc = history.last("test_acc", evals=True)
chance = 1 / c
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
plot_curves({"step": history.series("step"), "loss": history.series("loss")}, ax=axes[0])
plot_curves({"step": history.series("step", evals=True), "test_acc": history.series("test_acc", evals=True)},
            ax=axes[1])
plt.show()
# the test set's noise at chance: an accuracy this many standard errors above chance is not luck
chance_se = (chance * (1 - chance) / len(test.labels)) ** 0.5
print(f"test accuracy {test_acc:.3f} (chance {chance:.3f}; {(test_acc - chance) / chance_se:.0f} binomial "
      f"standard errors of {len(test.labels)} test images above it)")

# %%
losses = history.series("loss")
k = max(1, len(losses) // 5)
assert sum(losses[-k:]) / k < sum(losses[:k]) / k, "the loss should fall"
if SCALE != "ci":
    # one seed: the bar is far beyond the test set's noise, so the claim "it learns" does not
    # rest on a lucky draw; how far above the bar this seed landed is printed above
    assert test_acc > chance + 10 * chance_se, f"accuracy {test_acc:.3f} should be clearly above chance {chance:.3f}"

# %% [markdown]
# ### Explore: move batch, image size and width
#
# The prediction needs only shapes, so it is instant. Drag the sliders and watch which lines move:
# batch and image size move *kept for backward* and FLOPs; width moves everything: resident state
# and FLOPs roughly quadratically (most weights sit in width × width convolutions; the stem and the
# head grow only linearly), kept for backward linearly (the activations have width channels).

# %%
import ipywidgets as widgets


def predicted_ledger(batch=64, image_size=32, width=16, optimizer="adam"):
    model = SmallResNet(width=width, num_classes=c)
    p = predict_step(model, (batch, 3, image_size, image_size), optimizer=optimizer)
    lines = {"kept for backward": p["activation_bytes"], "parameters": p["param_bytes"],
             "gradients": p["grad_bytes"], "optimizer state": p["optimizer_bytes"]}
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.barh(list(lines), [v / 1e6 for v in lines.values()])
    ax.set_xlabel("MB"); ax.set_title(f"{p['flops'] / 1e9:.2f} GFLOP per step")
    plt.show()
    for name, value in lines.items():     # the bars as text, in one unit: readable and testable
        print(f"{name}: {value / 1e6:.3f} MB")


widgets.interact(predicted_ledger, batch=widgets.IntSlider(64, 8, 512, 8),
                 image_size=widgets.IntSlider(32, 16, 96, 8), width=widgets.IntSlider(16, 4, 64, 4),
                 optimizer=list(OPTIMIZERS));

# %% [markdown]
# What the sliders show, checked once on predictions (instant): doubling the width multiplies the
# resident state and the FLOPs by between 3 and 4 (roughly quadratic, the stem and head linear)
# and kept for backward by about 2; doubling the batch doubles kept for backward and FLOPs
# exactly, doubling the image's side quadruples them (the pixels), and neither touches the
# weights.

# %%
def predicted_lines(batch=64, image_size=32, width=16):
    return predict_step(SmallResNet(width=width, num_classes=c), (batch, 3, image_size, image_size),
                        optimizer="adam")


base = predicted_lines()
moved = {"width x2": predicted_lines(width=32), "batch x2": predicted_lines(batch=128),
         "image size x2": predicted_lines(image_size=64)}
show_table([{"change": name, **{line: p[line] / base[line] for line in
                                ("param_bytes", "optimizer_bytes", "activation_bytes", "flops")}}
            for name, p in moved.items()])
assert 3 < moved["width x2"]["param_bytes"] / base["param_bytes"] < 4, "width: roughly quadratic"
assert 3 < moved["width x2"]["flops"] / base["flops"] < 4, "width: FLOPs roughly quadratic"
assert 1.9 < moved["width x2"]["activation_bytes"] / base["activation_bytes"] < 2.1, "width: kept, linear"
for name, factor in (("batch x2", 2), ("image size x2", 4)):
    assert moved[name]["param_bytes"] == base["param_bytes"], f"{name} leaves the weights alone"
    for line in ("activation_bytes", "flops"):
        assert abs(moved[name][line] / base[line] - factor) < 0.01, (name, line, moved[name][line] / base[line])

# %% [markdown]
# ## The boundary
#
# What this ledger does **not** let you conclude:
#
# - **FLOPs are not seconds.** The counter books matmuls and convolutions (the bulk of the work) but
#   not element-wise ops, and time also depends on memory bandwidth, kernel launch overhead and
#   how well a shape fits the hardware. Speed claims belong in `benchmarks/`.
# - **Saved tensors are not peak memory.** The peak is about the weights, the optimizer state and
#   what is kept, plus the gradients as backward forms them (`make_step` frees them before each
#   step, so they do not exist during the forward) and the temporaries of each op and of the
#   update; on CPU we do not see allocator caching or fragmentation either. On CUDA the record
#   adds `torch.cuda.max_memory_allocated` (`peak_bytes`) so you can compare; lesson 06 measures
#   the peak.
# - **One step is not a run.** The ledger says whether a step fits and what it costs, not whether
#   the objective learns a useful representation — that needs the probes of the next lessons.
# - **Not yet shown**: *repeated* is measured zero for a supervised step (asserted above);
#   *cached* and *communicated* are zero here by construction (no cache registered, one device).
#   MoCo (03) fills *cached*, gradient caching (02) and recomputation (06) *repeated*, data
#   parallel (07) *communicated*.
# - **A step that does not fit.** The same `measure` runs on fake tensors (`FakeTensorMode`),
#   which have shapes and no memory: the lines of a paper-scale step without the machine
#   (lesson 11).

# %% [markdown]
# ## Exercises
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.
#
# Predict, then measure: each answer is a number or a formula you write *before* looking at a
# ledger, and the test cells run the step with `measure` and compare, exactly (these are counts).
# The worked example counted a two-layer MLP; the exercises go deeper, and your configuration is
# drawn from `STUDENT_ID` (parameters cell), so your numbers are your own:

# %%
from course_utils.exercises import check_close
from course_utils.optim import make_optimizer
from course_utils.variants import exercise_variant

task = exercise_variant("01_resource_ledger", STUDENT_ID, batch=(32, 16, 24, 48, 64),
                        image_size=(16, 8, 12, 24), hidden=(64, 32, 48, 96), layers=(3, 4, 5),
                        classes=(8, 5, 10, 4), width=(16, 8, 12, 24),
                        optimizer=("adam", "sgd-momentum", "adamw", "sgd"))
task


# %%
def _check_mlp_formula(formula, ledger_line, config, hint):
    """Compare formula(*config) exactly with ``ledger_line`` of one measured cross-entropy SGD step
    of MLP(d, hidden, classes, layers) on random data; config = (batch, d, hidden, classes, layers)."""
    batch, d, hidden, classes, layers = config
    gen = torch.Generator().manual_seed(0)
    mlp_ = MLP(d, hidden, classes, layers=layers)
    sgd_ = torch.optim.SGD(mlp_.parameters(), lr=0.1)
    xs, ys = torch.rand(batch, d, generator=gen), torch.randint(0, classes, (batch,), generator=gen)
    measured = measure(lambda: make_step(Supervised(mlp_), sgd_)((xs, ys)), model=mlp_, optimizer=sgd_)
    check_close(formula(*config), getattr(measured, ledger_line), rtol=0,
                what=f"{ledger_line} of an MLP step with (batch, d, hidden, classes, layers) = {config}: {hint}")


# the hidden tests' other configurations: logistic regression (layers=1) and a deep, narrow MLP
_OTHER_MLPS = [((task.batch, 3 * task.image_size ** 2, task.hidden, task.classes, 1), "layers=1 is logistic regression"),
               ((5, 7, 3, 2, 6), "a deep, narrow MLP")]


# %% [raw]
# # BEGIN QUESTION
# name: q1_deep_mlp_activation_bytes
# points: 1

# %% [markdown]
# **Exercise 1 — predict, then measure.** Write `deep_mlp_activation_bytes(batch, d, hidden,
# classes, layers)`: the bytes a cross-entropy step of `MLP(d, hidden, classes, layers=layers)`
# keeps for backward (fp32 activations, int64 targets). `layers` counts the Linear layers, with a
# ReLU between consecutive ones. The test measures your configuration: `task.batch` images of
# 3×`task.image_size`×`task.image_size` values, `task.hidden` units, `task.classes` classes,
# `task.layers` layers; hidden tests try other depths, including `layers=1`.

# %% [raw]
# # BEGIN SOLUTION

# %%
def deep_mlp_activation_bytes(batch, d, hidden, classes, layers):
    # BEGIN SOLUTION
    # the input (saved by the first Linear), each ReLU output (also the next Linear's input),
    # the log-softmax, the int64 targets and NLL's fp32 scalar
    return 4 * batch * (d + (layers - 1) * hidden + classes) + 8 * batch + 4
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_check_mlp_formula(deep_mlp_activation_bytes, "activation_bytes",
                   (task.batch, 3 * task.image_size ** 2, task.hidden, task.classes, task.layers),
                   "which tensors does backward read? walk the graph from the input to the loss, targets included")

# %%
# HIDDEN
for _config, _hint in _OTHER_MLPS:
    _check_mlp_formula(deep_mlp_activation_bytes, "activation_bytes", _config, _hint)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_deep_mlp_backward_flops
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** Backward FLOPs of the same deeper step:
# `deep_mlp_backward_flops(batch, d, hidden, classes, layers)`. Which layers need the gradient
# with respect to their input, and which only with respect to their weights? The test measures
# your configuration; hidden tests other depths, including `layers=1` (logistic regression).

# %% [raw]
# # BEGIN SOLUTION

# %%
def deep_mlp_backward_flops(batch, d, hidden, classes, layers):
    # BEGIN SOLUTION
    dims = [d] + [hidden] * (layers - 1) + [classes]
    # weight gradient of every layer; input gradient of every layer but the first
    return sum((2 if i == 0 else 4) * batch * fan_in * fan_out
               for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])))
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_check_mlp_formula(deep_mlp_backward_flops, "backward_flops",
                   (task.batch, 3 * task.image_size ** 2, task.hidden, task.classes, task.layers),
                   "which gradients does each layer compute in backward, and does the first layer need them all?")

# %%
# HIDDEN
for _config, _hint in _OTHER_MLPS:
    _check_mlp_formula(deep_mlp_backward_flops, "backward_flops", _config, _hint)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_resident_bytes
# points: 1

# %% [markdown]
# **Exercise 3 — predict, then measure.** `SmallResNet(width=task.width, num_classes=task.classes)`
# takes one step with `make_optimizer(task.optimizer, model.parameters())` (the optimizers are
# listed in `course_utils.optim.OPTIMIZERS`, with how many fp32 copies of each parameter each
# keeps). Predict its resident state after the step: parameters, gradients and optimizer state,
# all fp32, in bytes. You may count the parameters with code;
# the test runs the step and reads the ledger.

# %% [raw]
# # BEGIN SOLUTION

# %%
resnet_params = sum(p.numel() for p in SmallResNet(width=task.width, num_classes=task.classes).parameters())  # SOLUTION
optimizer_copies = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}[task.optimizer]  # SOLUTION
predicted_resident_bytes = 4 * resnet_params * (1 + 1 + optimizer_copies)  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_model = SmallResNet(width=task.width, num_classes=task.classes)
_opt = make_optimizer(task.optimizer, _model.parameters())
_xs, _ys = torch.rand(2, 3, 16, 16), torch.tensor([0, 1])
_rec = measure(lambda: make_step(Supervised(_model), _opt)((_xs, _ys)), model=_model, optimizer=_opt)
check_close(predicted_resident_bytes, _rec.resident_bytes, rtol=0,
            what=f"resident bytes of SmallResNet(width={task.width}) with {task.optimizer}: "
                 "weights, gradients and the optimizer's per-parameter copies, 4 bytes each")

# %%
# HIDDEN
# resident state does not depend on the batch or the image size
_model = SmallResNet(width=task.width, num_classes=task.classes)
_opt = make_optimizer(task.optimizer, _model.parameters())
_xs, _ys = torch.rand(5, 3, 24, 24), torch.tensor([0, 1, 1, 0, 1])
_rec = measure(lambda: make_step(Supervised(_model), _opt)((_xs, _ys)), model=_model, optimizer=_opt)
check_close(predicted_resident_bytes, _rec.resident_bytes, rtol=0,
            what="resident bytes after a step on another batch size and image size")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Summary

# %%
headline(
    mlp_ledger_max_rel_error=comparison.max_relative_error(),
    resnet_ledger_max_rel_error=resnet_comparison.max_relative_error(),
    activation_bytes_per_image=int(sweep[-1]["activation MB"] * 1e6 / sweep[-1]["batch"]),
    supervised_test_acc=test_acc,
)
