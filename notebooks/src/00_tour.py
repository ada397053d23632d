# %% [markdown]
# # 00 · Tour of the kit
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/00_tour.ipynb)
#
# This course follows one question through lessons 01–12: *how does a learning objective turn
# into one training step that a machine can actually run?* Lesson 13 returns to the objectives
# of 02–03 and takes their negatives away. This tour shows the machine you are on,
# the datasets (those the kit ships work offline; CIFAR-10 and STL-10 are downloaded once, for the
# gpu scale), and how scales, the ledger and the exercises work.
# The course is built on a set of Chinese source texts; where a lesson names one of their terms,
# the Chinese is given once in parentheses beside the English (the resource ledger, 资源账).

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

# %% [markdown]
# ## Scales
#
# The cell above is the notebook's **parameters** cell. `SCALE` picks one of three presets of the
# same experiment:
#
# - `"ci"` — tiny, proves the notebook runs (this is what `make test` uses);
# - `"default"` — teaches: real curves within minutes on a laptop CPU;
# - `"gpu"` — a Colab GPU with a real dataset (CIFAR-10; `load_dataset` also knows STL-10).
#
# Left alone, the cell lets the device choose: `"gpu"` on a CUDA runtime (a Colab GPU), `"default"`
# elsewhere. Choose yourself by editing the cell (`SCALE = "ci"`), with `COURSE_SCALE=ci` in the
# environment (on Colab: a cell `%env COURSE_SCALE=ci` before this one), or with papermill
# (`papermill nb.ipynb out.ipynb -p SCALE gpu`). The next cell prints the scale and who chose it.
# Every scale runs the same code path; sizes, datasets, augmentation recipes and which claims
# are asserted change with it (each lesson prints its configuration).

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_utils.augment import SimCLRAugment
from course_utils.data import DatasetUnavailableError, available_datasets, available_photos, load_dataset, load_photo
from course_utils.ledger import measure
from course_utils.models import SmallResNet
from course_utils.plots import show_images
from course_utils.report import format_table, headline
from course_utils.runtime import describe_device, setup
from course_utils.scales import config
from course_utils.objectives import Supervised, make_step

cfg = config(SCALE, ci=dict(grid=16), default=dict(grid=32), gpu=dict(grid=32))
device = setup(SCALE, seed=cfg.seed)   # prints the scale, why, and the device

# %% [markdown]
# ## The machine
#
# `describe_device()` reports what torch sees. On Colab choose *Runtime → Change runtime type → GPU*
# for `SCALE="gpu"`; without a GPU that scale stops at `setup()` (the cell after the parameters)
# with a message saying so.

# %%
info = describe_device()
print(format_table([{"fact": k, "value": v} for k, v in info.items()]))

# %% [markdown]
# ## The datasets
#
# `load_dataset(name, split)` returns the whole split as tensors on a device: `.images`
# (N×C×H×W, float in [0, 1]), `.labels`, `.classes`. Nothing is downloaded unless you pass
# `download=True` (CIFAR-10, for the gpu scale; STL-10 too, which no lesson uses yet). The list
# below is every dataset `load_dataset` knows; the ones that need a download are marked by the
# cell after the pictures.

# %%
print("datasets load_dataset knows:", ", ".join(available_datasets()))
shapes = load_dataset("shapes", "train", device=device)
print(shapes)
assert shapes.images.dtype == torch.float32 and shapes.images.device.type == device.type
assert 0 <= shapes.images.min() and shapes.images.max() <= 1, "images are floats in [0, 1]"
show_images(shapes.images[:cfg.grid], labels=shapes.labels[:cfg.grid], classes=shapes.classes,
            title="shapes (the embedded default): the class is the shape")
plt.show()

# %% [markdown]
# The class is the **shape**; colour, position, scale, rotation and texture are *nuisances*. A
# self-supervised objective has to learn to ignore them — lesson 02 shows what happens when the
# augmentations leave one of them (colour) as a shortcut.

# %%
digits = load_dataset("digits", "train", image_size=32)
textures = load_dataset("textures", "train")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
show_images(digits.images[:16], labels=digits.labels[:16], classes=digits.classes, ax=axes[0], title="digits (scikit-learn)")
show_images(textures.images[:16], labels=textures.labels[:16], classes=textures.classes, ax=axes[1], title="textures (scikit-image)")
plt.show()

# %%
photos = [load_photo(name, size=64) for name in available_photos()[:6]]
show_images(torch.stack(photos), labels=available_photos()[:6], nrow=6, title="sample photos for MAE")
plt.show()

# %% [markdown]
# A dataset that needs a download says so instead of failing deep inside torchvision:

# %%
try:
    load_dataset("cifar10", download=False)
    cifar_message = None     # already downloaded into data/ (after a gpu run): nothing to say
except DatasetUnavailableError as err:
    cifar_message = str(err)
    print(err)
assert cifar_message is None or "download" in cifar_message, cifar_message

# %% [markdown]
# ## Augmentations run on the device, batched
#
# Self-supervised lessons make two random *views* of each image. The kit does this as batched
# tensor operations on the same device as the model — random resized crop, flip, colour jitter,
# grayscale — with per-image randomness drawn from a seeded `torch.Generator`: on a GPU the
# augmentation runs where the model does, not on the host's few CPU cores (a design choice; its
# GPU speed is not measured here), and a rerun gives the same views.

# %%
augment = SimCLRAugment(32)
g = torch.Generator().manual_seed(0)
batch = shapes.images[:8]
view1, view2 = augment(batch, g), augment(batch, g)
show_images(torch.cat([batch, view1, view2]), nrow=8, title="originals / view 1 / view 2")
plt.show()
again = augment(batch, torch.Generator().manual_seed(0))
assert torch.equal(again, view1), "same seed, same views"
assert view1.device == batch.device and not torch.equal(view1, view2), "two draws, two views, on the device"
same_image = augment(batch[:1].expand(8, -1, -1, -1), torch.Generator().manual_seed(1))
assert all(not torch.equal(same_image[0], same_image[i]) for i in range(1, 8)), "randomness per image"

# %% [markdown]
# ## The ledger
#
# Most lessons measure their cost claims with `course_utils.ledger.measure`, which runs one
# training step and returns its resource ledger (the distributed lessons count their
# collectives with `course_utils.distributed`'s tools too); claims about learned features go through the probes
# (`course_utils.evaluate`) and paired seeds (`course_utils.compare`). Lesson 01 predicts each
# ledger line by hand and checks it.

# %%
model = SmallResNet(width=8, num_classes=len(shapes.classes)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = make_step(Supervised(model), opt)       # every objective trains through make_step
record = measure(lambda: step((shapes.images[:16], shapes.labels[:16])), model=model, optimizer=opt)
print(record)
assert record.encoded == {"images": 16}
assert record.optimizer_bytes == 0 and record.recomputed_flops == 0    # plain SGD; no checkpointing

# %% [markdown]
# The ledger's lines, each the answer to one question about the step:
#
# | line | the question |
# |---|---|
# | **encoded now** | how many inputs went through the encoder this step |
# | **kept for backward** | what autograd holds from the forward until the backward needs it |
# | **cached** | what is kept from *earlier* steps to use again (MoCo's queue, lesson 03) |
# | **resident state** | what lives for the whole run: weights, gradients, optimizer state |
# | **repeated** | work done twice: forwards re-run by recomputation, inputs encoded twice |
# | **communicated** | bytes sent between devices (lessons 07–10) |
#
# Here, on one device with plain SGD, several lines are zero and the printout says which:
# no optimizer state (SGD without momentum keeps none; Adam would keep two moments per weight),
# nothing repeated (no recomputation, each image encoded once), and nothing cached or
# communicated (no cache registered, one process): the later lessons fill each of them.

# %% [markdown]
# ## Exercises
#
# Every lesson ends with 2–4 short exercises. Most ask you to **predict, then measure**: you write
# a number (or a small formula) first, and the check below it measures the same quantity live
# with the kit and compares (in this edition the test cells; in your copy, the student edition, a
# cell `exercises.check("q1_...")`; `exercises.reveal("q1_...")` shows the solution once you have
# tried). Locally, `make lab` opens your copies in `my-work/` (`COURSE_SCALE=ci make lab` for a
# quick pass), and `make course` runs every lesson at the teaching scale. An instructor grades the same
# notebooks with [otter-grader](https://otter-grader.readthedocs.io) (see `docs/instructor.md`),
# with a few hidden tests on edge cases.
#
# Your numbers are your own: the configuration of each lesson's exercises (a batch size, an image
# size, ...) is drawn from `STUDENT_ID` in the parameters cell at the top. Set it to the name you
# hand your notebook in under; the test cells measure *your* configuration, so a classmate's number
# is not your answer. Without an ID you get the lesson's own configuration.

# %%
from course_utils.exercises import check_close
from course_utils.variants import exercise_variant

task = exercise_variant("00_tour", STUDENT_ID, image_size=(32, 16, 24, 48, 64),
                        images=(100, 64, 200, 128, 50), batch=(32, 8, 24, 64, 48))
task

# %% [raw]
# # BEGIN QUESTION
# name: q1_dataset_bytes
# points: 1

# %% [markdown]
# **Exercise 1 — predict, then measure.** `load_dataset("shapes", "test", image_size=task.image_size,
# limit=task.images)` loads `task.images` RGB images of `task.image_size`×`task.image_size` pixels
# as one float32 tensor. Before loading it, predict how many bytes that tensor's values take. The
# test loads it and reads the tensor's size.

# %% [raw]
# # BEGIN SOLUTION

# %%
predicted_image_bytes = 4 * task.images * 3 * task.image_size ** 2  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_ds = load_dataset("shapes", "test", image_size=task.image_size, limit=task.images)
check_close(predicted_image_bytes, _ds.images.numel() * _ds.images.element_size(), rtol=0,
            what=f"bytes of {task.images} float32 RGB images of {task.image_size}×{task.image_size} "
                 "pixels (how many values, and how many bytes per value?)")

# %%
# HIDDEN
_ds = load_dataset("shapes", "test", image_size=task.image_size, limit=task.images)
check_close(predicted_image_bytes, _ds.images.untyped_storage().nbytes(), rtol=0,
            what="bytes the images' storage actually owns")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_step_flops
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** The ledger above measured `record.flops` for one SGD step
# of `SmallResNet(width=8)` on 16 images. Predict the FLOPs of the same step on `task.batch`
# images, from that record alone (no new measurement). The test builds the model, runs the step on
# `task.batch` images and reads the ledger.

# %% [raw]
# # BEGIN SOLUTION

# %%
predicted_flops = record.flops * task.batch // 16  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_model = SmallResNet(width=8, num_classes=len(shapes.classes)).to(device)
_opt = torch.optim.SGD(_model.parameters(), lr=0.1)
_step = make_step(Supervised(_model), _opt)
_rec = measure(lambda: _step((shapes.images[:task.batch], shapes.labels[:task.batch])),
               model=_model, optimizer=_opt)
check_close(predicted_flops, _rec.flops, rtol=0, what=f"FLOPs of one step on {task.batch} images")

# %%
# HIDDEN
# other images, other labels, other initial weights: the FLOPs of a step depend on the shapes alone
_ = torch.manual_seed(1)
_model = SmallResNet(width=8, num_classes=len(shapes.classes)).to(device)
_opt = torch.optim.SGD(_model.parameters(), lr=0.1)
_step = make_step(Supervised(_model), _opt)
_images, _labels = shapes.images[-task.batch:], shapes.labels[-task.batch:]
_rec = measure(lambda: _step((_images, _labels)), model=_model, optimizer=_opt)
check_close(predicted_flops, _rec.flops, rtol=0, what=f"FLOPs of one step on {task.batch} other images")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(device=str(device), datasets=len(available_datasets()), shapes_train_images=len(shapes),
         ledger_flops_16_images=record.flops)
