# %% [markdown]
# # 10 · Checkpoint and resume, done right
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/training-ledger/course-kit/blob/main/notebooks/student/10_checkpoint_resume.ipynb)
#
# A checkpoint is the *resident state* line of the ledger written to disk — weights, optimizer
# state and caches, not just the weights; less the gradients (every step rebuilds them), plus
# what the ledger does not list: RNG states, the data position and the counters. This lesson
# checks what that means by resuming a run and comparing bit for bit.

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
import inspect
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

import course_utils
from course_utils import checkpoint
from course_utils.distributed import train as train_script
from course_utils.data import load_dataset
from course_utils.exercises import check_equal
from course_utils.models import MLP
from course_utils.objectives.moco import FeatureQueue
from course_utils.report import headline, show_table
from course_utils.runtime import seed_everything, setup
from course_utils.scales import config
from course_utils.train import CheckpointEvery, EarlyStopping, EvalEvery, fit

cfg = config(
    SCALE,
    ci=dict(seed=0, steps=24, batch=32, hidden=32, lr=3e-3, moco_steps=12, queue=64,
            es_steps=60, crash_mib=4, dist_steps=12, dist_every=4, dist_crash=10),
    default=dict(seed=0, steps=160, batch=32, hidden=128, lr=3e-3, moco_steps=100, queue=256,
                 es_steps=800, crash_mib=64, dist_steps=60, dist_every=20, dist_crash=50),
    gpu=dict(seed=0, steps=400, batch=64, hidden=256, lr=3e-3, moco_steps=200, queue=1024,
             es_steps=1500, crash_mib=256, dist_steps=60, dist_every=20, dist_crash=50),
)
device = setup(SCALE, seed=cfg.seed)
train = load_dataset("digits", "train", device=device)
val = load_dataset("digits", "test", device=device)
# removed by the last cell (the checkpoints stay to be looked at until then)
workdir_handle = tempfile.TemporaryDirectory(prefix="lesson10_")
workdir = Path(workdir_handle.name)
print(device, train, workdir)

# %% [markdown]
# ## 1 · The problem: a run that stops halfway
#
# Long runs get interrupted: a preempted Colab, a crash, a full disk. The course's source text
# contrasts two ways back (MMDetection 2.x's config keys; 3.x spells the first `resume=True`):
# **`resume_from`** loads the weights *and the optimizer state* and
# continues from the checkpoint's step — for runs that were cut off; **`load_from`** loads only the
# weights and starts at step 0 — for fine-tuning. Using the second to continue a run is a quiet
# mistake: Adam's moments restart from zero and the learning-rate schedule starts over.
#
# Everything below uses one small run: an MLP on 8×8 digits, AdamW, a cosine schedule, input noise
# drawn from torch's RNG, data reshuffled every epoch.

# %%
def make_run(model_seed=0, steps=cfg.steps):
    """Model, optimizer, schedule, data order and step function of one run."""
    torch.manual_seed(model_seed)
    model = MLP(64, cfg.hidden, 10, layers=3).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    data = train.batches(cfg.batch, seed=1)

    def step(batch):
        x, y = batch
        x = x + 0.05 * torch.randn_like(x)  # augmentation: uses the torch RNG
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lr = opt.param_groups[0]["lr"]      # the learning rate this update uses
        opt.step()
        sched.step()
        return {"loss": loss, "lr": lr}
    return model, opt, sched, data, step


def val_accuracy(model):
    with torch.no_grad():
        return (model(val.images).argmax(1) == val.labels).float().mean().item()


half = cfg.steps // 2
seed_everything(cfg.seed)
model_s, opt_s, sched_s, data_s, step_s = make_run()
straight = fit(step_s, data_s, steps=cfg.steps, desc="straight")
print(f"straight run: {cfg.steps} steps, final loss {straight.last('loss'):.4f}, "
      f"val acc {val_accuracy(model_s):.3f}")

# %% [markdown]
# ## 2 · The mechanism: what the next step depends on
#
# | piece | why resuming needs it |
# |---|---|
# | model `state_dict` | parameters *and buffers* (BatchNorm's running statistics; saving `parameters()` loses them) |
# | optimizer state | Adam's two moments per weight (2× the weights) and its step count |
# | LR scheduler | where on the schedule we are |
# | GradScaler | the fp16 loss scale (when AMP uses one) |
# | RNG states | Python, NumPy, torch CPU and CUDA: dropout, augmentation, noise |
# | data position | epoch, batch index, and the shuffling seed: which batch comes next |
# | step counter + history | for the schedule, logging and callbacks |
# | objective caches | MoCo's queue of keys and its pointer; any other buffer that persists |
# | callback state | an `EarlyStopping`'s best score, patience count and best weights (`callbacks={...}`) |
#
# `checkpoint.capture_training_state(...)` gathers these into plain tensors, numbers and dicts (NumPy's RNG
# as a tensor plus ints) so that `torch.load(weights_only=True)` — which refuses to run arbitrary
# pickled code — can read it back. `checkpoint.save` writes atomically: a temporary file in the same
# folder, flush + fsync, `os.replace` over the old name, fsync of the folder. A save killed while
# writing (tested below at a quarter of the file) leaves the old file whole and loadable; the
# fsyncs are for what a process kill cannot show, an OS or power failure, not tested here.
#
# This lesson's run measures the rows it uses (weights, optimizer, schedule, torch's RNG, data
# position, step counter and history; a MoCo queue in claim 3). Its run draws nothing from Python's
# or NumPy's RNG and has no GradScaler, so those rows, the callback state and the refusal to drop
# state the checkpoint holds are checked by the kit's tests instead (`tests/test_checkpoint.py`:
# the RNG round trip, resuming an early stopper mid-patience, refusing to drop its state).

# %% [markdown]
# ## 3 · Worked example: stop at half time, then resume
#
# Run the first half with a `CheckpointManager` (keeps the last 2 files) saving every quarter of
# it through the training loop's `CheckpointEvery` callback, so the newest file is the half-way
# state; then build everything fresh — other initial weights, scrambled RNGs, as a new process
# would — load the newest checkpoint and continue.

# %%
seed_everything(cfg.seed)
model_a, opt_a, sched_a, data_a, step_a = make_run()
manager = checkpoint.CheckpointManager(workdir / "run", keep_last=2)
every = half // 4
assert every >= 1 and half % every == 0, "the interval must land on the half-way step"
saver = CheckpointEvery(every, lambda st: manager.save(checkpoint.capture_training_state(
    model=model_a, optimizer=opt_a, scheduler=sched_a, train_state=st, data=data_a), st.step))
fit(step_a, data_a, steps=half, callbacks=[saver], desc="first half")
print("kept:", [p.name for p in manager.paths()])

state, path = manager.load_latest()
assert state["position"]["step"] == half, "the newest checkpoint is the half-way state"
sizes = {k: sum(t.numel() * t.element_size() for t in _tensors)
         for k, _tensors in [("model", list(state["model"].values())),
                             # Adam's moments; its per-tensor "step" counters are 4 bytes each
                             ("optimizer", [t for s in state["optimizer"]["state"].values()
                                            for name, t in s.items() if name != "step"])]}
show_table([{"entry": k, "tensor bytes": v} for k, v in sizes.items()]
           + [{"entry": "position", "tensor bytes": str(state["position"])}])

# %%
# NBVAL_CHECK_OUTPUT
assert [ck_path.name for ck_path in manager.paths()] == [f"ckpt_{s:08d}.pt" for s in (half - every, half)]
assert sizes["optimizer"] == 2 * sizes["model"]  # Adam: two fp32 moments per fp32 weight

# %% [markdown]
# The second arm isolates what `load_from` drops. It restores the same checkpoint — weights, data
# position, RNG states — but leaves the optimizer and the schedule as a new run builds them
# (`skip=("optimizer", "scheduler")`): Adam with no moments, a cosine schedule over the remaining
# steps starting at its peak. Both arms see the same batches and the same noise, so any difference
# between them is the optimizer state and the schedule, nothing else.

# %%
def adam_moment_sum(opt):
    """Sum of |first moment| over every weight: 0 for an Adam that has not stepped yet."""
    return sum(s["exp_avg"].abs().sum().item() for s in opt.state.values() if "exp_avg" in s)


seed_everything(12345)  # a new process: other RNG states ...
model_b, opt_b, sched_b, data_b, step_b = make_run(model_seed=7)  # ... and other initial weights
ts = checkpoint.restore_training_state(state, model=model_b, optimizer=opt_b, scheduler=sched_b, data=data_b)
moments_resumed = adam_moment_sum(opt_b)
print("resuming at", ts.position())
resumed = fit(step_b, data_b, steps=cfg.steps, state=ts, desc="resumed")

# load_from's fresh optimizer and schedule; weights, data position and RNG from the checkpoint
seed_everything(12345)
model_w, opt_w, sched_w, data_w, step_w = make_run(model_seed=7, steps=cfg.steps - half)
ts_w = checkpoint.restore_training_state(state, model=model_w, optimizer=opt_w, scheduler=sched_w,
                                 data=data_w, skip=("optimizer", "scheduler"))
moments_fresh = adam_moment_sum(opt_w)
weights_only = fit(step_w, data_w, steps=cfg.steps, state=ts_w, desc="weights only")

lr_resumed, lr_fresh = resumed.series("lr")[half], weights_only.series("lr")[half]
wo_gap = max(abs(a - b) for a, b in zip(weights_only.series("loss")[half:], straight.series("loss")[half:]))
print(f"first update after loading, step {half + 1}: learning rate {lr_resumed:.2e} resumed, "
      f"{lr_fresh:.2e} weights only (peak {cfg.lr:.0e}); Adam first moments sum "
      f"{moments_resumed:.3g} resumed, {moments_fresh:.3g} weights only; "
      f"largest loss gap of the weights-only arm: {wo_gap:.4f}")

fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(10, 3.5))
ax.plot(straight.series("step"), straight.series("loss"), label="straight", lw=3, alpha=0.4)
ax.plot(resumed.series("step")[half:], resumed.series("loss")[half:], label="resumed (resume_from)", ls="--")
ax.plot(weights_only.series("step")[half:], weights_only.series("loss")[half:],
        label="fresh optimizer + schedule", lw=1)
ax_lr.plot(straight.series("step"), straight.series("lr"), label="straight", lw=3, alpha=0.4)
ax_lr.plot(resumed.series("step")[half:], resumed.series("lr")[half:], label="resumed", ls="--")
ax_lr.plot(weights_only.series("step")[half:], weights_only.series("lr")[half:], label="fresh optimizer + schedule", lw=1)
for a, label in ((ax, "training loss"), (ax_lr, "learning rate")):
    a.axvline(half, color="k", lw=0.5)
    a.set_xlabel("step")
    a.set_ylabel(label)
    a.legend()
plt.show()

# %% [markdown]
# ## 4 · The evidence
#
# **Claim 1.** Resuming gives the run that never stopped: the same loss at every step after the
# resume (the steps before it are the first run's history, restored from the checkpoint) and the
# same final parameters, bit for bit, on CPU and on CUDA (the lesson's setup asks torch for
# deterministic algorithms; the kit's recorded H200 run of this lesson resumed bit for bit).

# %%
# NBVAL_CHECK_OUTPUT
assert resumed.series("loss")[half:] == straight.series("loss")[half:], "the steps after the resume"
assert resumed.series("loss") == straight.series("loss")        # the restored history, too
for p, q in zip(model_s.parameters(), model_b.parameters()):
    assert torch.equal(p, q)

# %% [markdown]
# **Claim 2.** Loading only the weights is a different run: two things differ from a full
# resume, Adam restarts from zero moments and the cosine schedule restarts at its peak learning
# rate. Two construction checks show the load skipped both (a fresh AdamW has no moments, a fresh
# schedule starts at its peak); the evidence is that the two arms agree until the first update
# and differ after it. It does not split the loss gap between the two causes: both change
# at once here (restoring one and not the other would).

# %%
# NBVAL_CHECK_OUTPUT
assert moments_resumed > 0                          # Adam's moments: kept ...
assert moments_fresh == 0                            # ... or none (construction: a fresh AdamW)
assert lr_resumed == straight.series("lr")[half]                # the schedule continues ...
assert abs(lr_resumed - cfg.lr / 2) < 1e-9 * cfg.lr             # ... half-way down the cosine
assert lr_fresh == cfg.lr                                       # ... or restarts at its peak (construction)
# same weights, batch and noise: the first loss after loading agrees; the update then differs
assert weights_only.series("loss")[half] == straight.series("loss")[half]
assert wo_gap > 1e-4, "a fresh optimizer and schedule must change the losses that follow"
assert any(not torch.equal(p, q) for p, q in zip(model_s.parameters(), model_w.parameters()))

# %% [markdown]
# **Claim 3.** An objective's cache is training state. A MoCo-style run compares each query with a
# queue of keys from earlier batches (lesson 03). Resume it with the queue and it continues
# exactly; resume it from a checkpoint that forgot the queue (a fresh random queue, pointer 0)
# and its losses differ from the uninterrupted run's (by the gap printed below).

# %%
class MoCoToy(nn.Module):
    """Query encoder, momentum key encoder (in the state dict, so it is checkpointed)."""

    def __init__(self):
        super().__init__()
        self.q = MLP(64, cfg.hidden, 16, layers=2)
        self.k = MLP(64, cfg.hidden, 16, layers=2)
        self.k.load_state_dict(self.q.state_dict())
        self.k.requires_grad_(False)


def make_moco(model_seed=0):
    torch.manual_seed(model_seed)
    net, queue = MoCoToy().to(device), FeatureQueue(cfg.queue, 16).to(device)
    opt = torch.optim.SGD(net.q.parameters(), lr=0.1, momentum=0.9)
    data = train.batches(cfg.batch, seed=2)

    def step(batch):
        x, _ = batch
        q = F.normalize(net.q(x + 0.1 * torch.randn_like(x)), dim=1)
        with torch.no_grad():
            for pk, pq in zip(net.k.parameters(), net.q.parameters()):
                pk.mul_(0.99).add_(pq, alpha=0.01)
            k = F.normalize(net.k(x + 0.1 * torch.randn_like(x)), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.keys.T], dim=1) / 0.2
        loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long, device=x.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        queue.enqueue(k)
        return loss
    return net, queue, opt, data, step


mhalf = cfg.moco_steps // 2
seed_everything(cfg.seed)
net, queue, opt, data, step = make_moco()
moco_straight = fit(step, data, steps=cfg.moco_steps, desc="moco straight")

def moco_resume(keep_queue):
    seed_everything(cfg.seed)
    net, queue, opt, data, step = make_moco()
    caches = {"queue": queue} if keep_queue else {}
    saver = CheckpointEvery(mhalf, lambda st: checkpoint.save(workdir / "moco.pt", checkpoint.capture_training_state(
        model=net, optimizer=opt, train_state=st, data=data, caches=caches)))
    fit(step, data, steps=mhalf, callbacks=[saver], desc="moco first half")
    seed_everything(99)
    net2, queue2, opt2, data2, step2 = make_moco(model_seed=5)
    ts = checkpoint.restore_training_state(checkpoint.load(workdir / "moco.pt"), model=net2, optimizer=opt2,
                                   data=data2, caches={"queue": queue2} if keep_queue else {})
    return fit(step2, data2, steps=cfg.moco_steps, state=ts, desc="moco resumed"), net2

moco_with, net_with = moco_resume(keep_queue=True)
moco_without, net_without = moco_resume(keep_queue=False)
gap = max(abs(a - b) for a, b in zip(moco_without.series("loss"), moco_straight.series("loss")))
print(f"largest loss difference without the queue: {gap:.4f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(moco_straight.series("loss"), label="straight", lw=3, alpha=0.4)
ax.plot(moco_with.series("loss"), label="resumed with queue", ls="--")
ax.plot(moco_without.series("loss"), label="resumed without queue", lw=1)
ax.axvline(mhalf, color="k", lw=0.5)
ax.set_xlabel("step")
ax.set_ylabel("InfoNCE loss")
ax.legend()
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
assert moco_with.series("loss") == moco_straight.series("loss")
assert all(torch.equal(p, q) for p, q in zip(net.parameters(), net_with.parameters()))
assert gap > 1e-3, "without its queue the resumed MoCo run must differ"

# %% [markdown]
# **Claim 4.** A save killed midway leaves the previous checkpoint loadable. A child process
# (multiprocessing) overwrites the checkpoint with a large state and is killed by the kernel after
# writing part of it. Both arms start from the same old file. With `checkpoint.save` the old
# file survives (the half-written temporary file is left behind, printed below;
# `CheckpointManager` deletes such leftovers of its own checkpoints when it next saves, as
# `tests/test_checkpoint.py` checks); with a plain `torch.save(state, path)` the old checkpoint
# is gone and `checkpoint.load` says so, naming the file and what to do.

# %%
last = workdir / "last.pt"
checkpoint.save(last, checkpoint.capture_training_state(model=model_s, optimizer=opt_s, scheduler=sched_s))
n = cfg.crash_mib * 2**20
code_atomic = checkpoint.crash_during_save(last, n_bytes=n, kill_after_bytes=n // 4, atomic=True)
survivor = checkpoint.load(last)
print(f"atomic save: child exit code {code_atomic}; the old checkpoint loads "
      f"({len(survivor['model'])} weight tensors); leftover temp files: "
      f"{[p.name for p in workdir.glob('.last.pt.*.tmp')]}")

naive = workdir / "naive.pt"     # the same old state as last.pt: the arms differ in `atomic` only
checkpoint.save(naive, checkpoint.capture_training_state(model=model_s, optimizer=opt_s, scheduler=sched_s))
code_naive = checkpoint.crash_during_save(naive, n_bytes=n, kill_after_bytes=n // 4, atomic=False)
try:
    checkpoint.load(naive)
    naive_error = None
except checkpoint.CorruptCheckpointError as err:
    naive_error = err
print(f"naive save: child exit code {code_naive}; load says:\n  {naive_error}")

# %%
# NBVAL_CHECK_OUTPUT
assert code_atomic < 0 and code_naive < 0, "both children must have been killed"
# every tensor of the old file as it was saved (checkpoint.load maps to the CPU)
assert survivor["model"].keys() == model_s.state_dict().keys()
survivor_intact = all(torch.equal(survivor["model"][k], v.cpu()) for k, v in model_s.state_dict().items())
assert survivor_intact
assert isinstance(naive_error, checkpoint.CorruptCheckpointError) and "naive.pt" in str(naive_error)
assert list(workdir.glob(".last.pt.*.tmp")), "the killed atomic save leaves its temporary file behind"

# %% [markdown]
# **Claim 5.** Early stopping on a validation metric: evaluate every few steps, stop when the
# validation accuracy has not improved for `patience` evaluations, and keep the best weights.
# Every evaluation counts, and the weights kept are the ones that were evaluated. (`EvalEvery`
# also evaluates once when training ends off its interval, since the last weights can be the
# best: `tests/test_train.py::test_final_evaluation_at_train_end_counts_for_early_stopping`
# checks it; whether this run needs it depends on where it stops.) A checkpoint of that
# best model is what you would fine-tune from (with `load_weights`).

# %%
seed_everything(cfg.seed)
model_e, opt_e, sched_e, data_e, step_e = make_run(steps=cfg.es_steps)
evaluator = EvalEvery(max(cfg.es_steps // 30, 2), lambda: {"val_acc": val_accuracy(model_e)})
stopper = EarlyStopping("val_acc", mode="max", patience=4, model=model_e)
es_hist = fit(step_e, data_e, steps=cfg.es_steps, callbacks=[evaluator, stopper], desc="early stopping")
final_acc = val_accuracy(model_e)
eval_steps = es_hist.series("step", evals=True)
evals_after_best = [t for t in eval_steps if t > stopper.best_step]
stopped_early = es_hist.last("step") < cfg.es_steps
print(f"ran {es_hist.last('step')} of {cfg.es_steps} steps; best val acc {stopper.best:.3f} at step "
      f"{stopper.best_step}; restored model: {final_acc:.3f}; {len(evals_after_best)} evaluations after "
      f"the best, patience {stopper.patience}: {'stopped early' if stopped_early else 'ran to the end'}")
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(es_hist.series("step", evals=True), es_hist.series("val_acc", evals=True), marker="o")
ax.axvline(stopper.best_step, color="g", ls="--", label="best")
ax.set_xlabel("step")
ax.set_ylabel("val accuracy")
ax.legend()
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
assert abs(final_acc - stopper.best) < 1e-9, "EarlyStopping must restore the best weights"
assert final_acc == max(es_hist.series("val_acc", evals=True))  # the best of *every* evaluation
# the rule: stopped at the patience-th evaluation without improvement, or never reached it
if stopped_early:
    assert len(evals_after_best) == stopper.patience, (evals_after_best, stopper.patience)
else:
    assert len(evals_after_best) < stopper.patience, (evals_after_best, stopper.patience)
if SCALE != "ci":   # the claim's demonstration: at default and gpu scale the run does stop early
    assert stopped_early, "early stopping never triggered at this scale"

# %% [markdown]
# **Claim 6.** A distributed run resumes exactly too, after one of its ranks dies.
# `course_utils.distributed.train` is a complete training script for `torchrun` (DDP or FSDP2 by
# `--strategy`, DDP below; gloo on CPUs, NCCL on GPUs; a `DistributedSampler` with `set_epoch`). Every
# `--checkpoint-every` steps the model and AdamW state go through `torch.distributed.checkpoint`
# (DCP), and each rank writes its own RNG state, schedule and data position to `rank{r}.pt`; the
# folder becomes the newest checkpoint only once every rank has written. Two DCP calls need a
# word before you read them. `get_state_dict` names the optimizer's state by the parameters'
# fully qualified names (not by their position in the optimizer), so a checkpoint can be loaded
# into a differently built or differently sharded run; `dcp.load` loads *in place*, into tensors
# already allocated with the run's own layout. Under DDP the state is the same on every rank and
# DCP writes each tensor once; under FSDP2 each rank holds a shard and writes its part, and
# loading on another number of ranks reshards it:

# %%
print(inspect.getsource(train_script.save_checkpoint))
print(inspect.getsource(train_script.load_checkpoint))

# %% [markdown]
# Two runs start at once: one uninterrupted, and one in which a rank kills itself (SIGKILL, no
# clean-up) before a chosen step. `torchrun --max-restarts 1` sees the dead worker, stops the
# others and starts the whole group again; each rank loads the newest checkpoint and continues.
# The last line each run prints is the sha256 of its final parameters.

# %%
RANKS = 2
script = ["-m", "course_utils.distributed.train", "--steps", str(cfg.dist_steps)]
commands = {
    "uninterrupted": ["--standalone", "--nproc_per_node", str(RANKS), *script],
    "killed and restarted": ["--standalone", "--nproc_per_node", str(RANKS), "--max-restarts", "1",
                             *script, "--checkpoint-dir", str(workdir / "dist"),
                             "--checkpoint-every", str(cfg.dist_every),
                             "--crash-at-step", str(cfg.dist_crash), "--crash-rank", "1"],
}
env = {**os.environ, "OMP_NUM_THREADS": "1",  # torchrun's workers must import this kit
       "PYTHONPATH": os.pathsep.join([str(Path(course_utils.__file__).parents[1]),
                                      os.environ.get("PYTHONPATH", "")])}
running = {name: subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name, args in commands.items()}  # `python -m torch.distributed.run` is torchrun
printed, hashes = {}, {}
for name, proc in running.items():
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{name} failed:\n{out}\n{err[-3000:]}"
    printed[name] = out.strip().splitlines()
    hashes[name] = printed[name][-1].removeprefix(train_script.HASH_PREFIX)
    agent_saw = [line.split("]", 1)[-1].split(" of binary")[0].strip() for line in err.splitlines() if "exitcode" in line]
    print(f"$ torchrun {' '.join(commands[name])}")
    print("\n".join(printed[name] + [f"(torchrun: {line})" for line in agent_saw]), end="\n\n")
dist_resumed_from = int(next(line for line in printed["killed and restarted"]
                             if line.startswith(train_script.RESUME_PREFIX)).split()[-1])
print(f"killed before step {cfg.dist_crash}, resumed from step {dist_resumed_from}; final hashes "
      f"{'equal' if len(set(hashes.values())) == 1 else 'DIFFERENT'}")

# %%
# NBVAL_CHECK_OUTPUT
assert f"rank 1: killing myself before step {cfg.dist_crash}" in printed["killed and restarted"]
# the newest checkpoint before the crash: the last multiple of the interval below it
assert dist_resumed_from == (cfg.dist_crash - 1) // cfg.dist_every * cfg.dist_every
assert all(len(h) == 64 for h in hashes.values())
assert hashes["killed and restarted"] == hashes["uninterrupted"], "the resumed run must end bit for bit equal"

# %% [markdown]
# ## 5 · The boundary
#
# - **Bitwise** resume needs the same code, library versions, device and thread count, and on
#   GPUs deterministic algorithms (some CUDA kernels are otherwise non-deterministic, e.g. atomic
#   adds in some backward passes); the lesson's setup turns them on.
# - The distributed run above is gloo on the CPUs of one machine. The kit's tests also run it as
#   two torchrun agents rendezvousing over TCP (two "nodes" on one machine) and get the same hash
#   as one agent with both processes. Across real machines the checkpoint folder must be on a file
#   system every node shares. The script also resumes on another number of ranks if the global
#   batch is kept: DCP reshards the model and optimizer (lesson 08), the schedule and the data
#   position carry over (global batch i is the same examples at any world size), but each rank's
#   own RNG stream (input noise, dropout) has no counterpart, so the continuation is another
#   random draw. With no input noise and no dropout, in fp64, a 2-rank run resumed on 1 rank ends
#   equal to the uninterrupted 2-rank run up to summation order (checked by
#   `tests/test_distributed_train.py`, not run here). On GPUs the script asks torch
#   for deterministic algorithms; whether NCCL runs end bit for bit equal is for a GPU to show.
# - The checkpoint covers what you hand it. A cache you forget (a queue, an EMA teacher, a memory
#   bank), a data loader with worker processes holding their own RNG, or a callback you leave out
#   of `callbacks={...}` (an early stopper's best weights) are lost — the MoCo example shows the
#   run going elsewhere. Its loss even drops at the resume: random unit vectors are easy
#   negatives, so the objective got easier, not the training better; whether the features suffer
#   would take a probe and seeds, which this lesson does not run. What the checkpoint holds and
#   you do not pass back on resume raises instead (`tests/test_checkpoint.py`).
# - Atomic rename protects against a crash *during* a save on one file system; it is not a backup.
#   Keeping the last k files on the same disk does not survive losing the disk.
# - `weights_only=True` makes loading safe from code execution, not from wrong content; the CRC
#   check catches damaged bytes, not a state that was wrong when it was written.

# %% [markdown]
# ## Exercises
#
# Your exercises' configuration, drawn from `STUDENT_ID`: a batch size and a step at which your
# run stops, a hidden width for the lesson's MLP, and a checkpoint interval with how many files
# the `CheckpointManager` keeps. The checks run the kit for your configuration (the loop, the
# checkpoint capture, the manager) and compare with what it does.
#
# When graded, a function you write runs on its own: with Python (`math` included), `torch` and
# `numpy`, but not the kit (`course_utils`), plus the helpers you define in your own cells, on
# the inputs the tests give it; it must return numbers, lists, tuples, dicts or tensors.

# %%
from course_utils.train import TrainState
from course_utils.variants import exercise_variant

task = exercise_variant("10_checkpoint_resume", STUDENT_ID, batch=(32, 24, 48, 64, 100),
                        stop_step=(80, 70, 130, 200, 95), hidden=(128, 32, 48, 64, 96),
                        every=(20, 7, 12, 15, 25), keep_last=(2, 1, 3, 4), run_steps=(160, 90, 100, 150))
task


def run_noop_loop(batch, steps, callbacks=()):
    """The lesson's loop over the digits training batches (seed 1), with a step that trains
    nothing: what the loop, its position and its callbacks do does not depend on the model."""
    state = TrainState()
    fit(lambda b: 0.0, train.batches(batch, seed=1), steps=steps, callbacks=callbacks, state=state,
        progress=False)
    return state

# %% [raw]
# # BEGIN QUESTION
# name: q1_data_position
# points: 1

# %% [markdown]
# **Exercise 1 — predict, then measure.** The run of section 3 uses `train.batches(B, seed=1)`,
# which drops the last incomplete batch of every epoch. With B = `task.batch`, the run stops
# after `task.stop_step` updates. Predict the data position its checkpoint stores:
# `predicted_position = (epoch, batch_index)`, the epoch (from 0) of the last batch used and how
# many of that epoch's batches were used. The loop moves to a new epoch when it draws that epoch's
# first batch, so a run that stops right after an epoch's last batch is still in that epoch, all
# its batches used. (`len(train)` is the number of training images.) The check runs the training
# loop for that many steps and reads its `TrainState.position()`.

# %% [raw]
# # BEGIN SOLUTION

# %%
batches_per_epoch = len(train) // task.batch  # SOLUTION
predicted_position = ((task.stop_step - 1) // batches_per_epoch, (task.stop_step - 1) % batches_per_epoch + 1)  # SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_measured = run_noop_loop(task.batch, task.stop_step).position()
check_equal(predicted_position, (_measured["epoch"], _measured["batch_index"]),
            what=f"(epoch, batch_index) after {task.stop_step} steps of batch {task.batch} (measured by fit)")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q2_checkpoint_bytes
# points: 1

# %% [markdown]
# **Exercise 2 — predict, then measure.** The lesson's model with hidden width `task.hidden`,
# `MLP(64, task.hidden, 10, layers=3)` in fp32, has taken one AdamW step. Predict the tensor bytes
# of its resume checkpoint's `model` and `optimizer` entries together (every tensor, AdamW's
# per-parameter-tensor `step` counter included: a 4-byte fp32 scalar each), and of a weights-only
# checkpoint: complete `checkpoint_bytes(hidden)`, returning `(resume_bytes, weights_only_bytes)`.
# The check builds that model, takes the step, captures it with `checkpoint.capture_training_state` and
# counts (hidden: other widths).

# %% [raw]
# # BEGIN SOLUTION

# %%
def checkpoint_bytes(hidden):
    """(resume_bytes, weights_only_bytes) of MLP(64, hidden, 10, layers=3) after one AdamW step."""
    # BEGIN SOLUTION
    dims = [64, hidden, hidden, 10]
    n_params = sum((fan_in + 1) * fan_out for fan_in, fan_out in zip(dims[:-1], dims[1:]))
    n_tensors = 2 * (len(dims) - 1)                    # a weight and a bias per Linear
    return 3 * 4 * n_params + 4 * n_tensors, 4 * n_params  # weights + 2 moments, + step counters
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
_model = MLP(64, task.hidden, 10, layers=3)
_opt = torch.optim.AdamW(_model.parameters())
_model(torch.randn(2, 64)).sum().backward()
_opt.step()
_state = checkpoint.capture_training_state(model=_model, optimizer=_opt)
_weights = sum(t.numel() * t.element_size() for t in _state["model"].values())
_moments = sum(t.numel() * t.element_size() for s in _state["optimizer"]["state"].values()
               for t in s.values() if torch.is_tensor(t))
check_equal(checkpoint_bytes(task.hidden), (_weights + _moments, _weights),
            what=f"(resume, weights-only) checkpoint bytes, hidden={task.hidden} (measured)")

# %%
# HIDDEN
for _width in (1, 200):
    _net = MLP(64, _width, 10, layers=3)
    _adamw = torch.optim.AdamW(_net.parameters())
    _net(torch.randn(2, 64)).sum().backward()
    _adamw.step()
    _captured = checkpoint.capture_training_state(model=_net, optimizer=_adamw)
    _w = sum(t.numel() * t.element_size() for t in _captured["model"].values())
    _o = sum(t.numel() * t.element_size() for s in _captured["optimizer"]["state"].values()
             for t in s.values() if torch.is_tensor(t))
    check_equal(checkpoint_bytes(_width), (_w + _o, _w),
                what=f"(resume, weights-only) checkpoint bytes, hidden={_width} (measured)")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [raw]
# # BEGIN QUESTION
# name: q3_kept_checkpoints
# points: 1

# %% [markdown]
# **Exercise 3 — predict, then measure.** Section 3 saved through `CheckpointEvery(every, ...)`
# into a `CheckpointManager(keep_last=k)`. Write `kept_steps(steps, every, keep_last)`: the steps
# whose checkpoint files are on disk, oldest first, after a run of `steps` updates — which also
# tells you how much work a crash at the end would cost. Think about runs shorter than one
# interval. The check runs the loop with your `task.run_steps`, `task.every` and
# `task.keep_last` (hidden: other settings) into a fresh folder and lists the files.

# %% [raw]
# # BEGIN SOLUTION

# %%
def kept_steps(steps, every, keep_last):
    # BEGIN SOLUTION
    saved = list(range(every, steps + 1, every))      # a save at every multiple of the interval
    return saved[-keep_last:]
    # END SOLUTION

# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
with tempfile.TemporaryDirectory() as _folder:
    _manager = checkpoint.CheckpointManager(_folder, keep_last=task.keep_last)
    _ = run_noop_loop(32, task.run_steps, [CheckpointEvery(task.every, lambda st: _manager.save({}, st.step))])
    _on_disk = [int(p.stem.split("_")[-1]) for p in _manager.paths()]
check_equal(list(kept_steps(task.run_steps, task.every, task.keep_last)), _on_disk,
            what=f"checkpoint steps kept after {task.run_steps} steps, every {task.every}, keep_last={task.keep_last}")

# %%
# HIDDEN
for _steps, _every, _keep in ((5, 7, 2), (21, 7, 5), (30, 1, 3), (14, 7, 1)):
    with tempfile.TemporaryDirectory() as _scratch:
        _mgr = checkpoint.CheckpointManager(_scratch, keep_last=_keep)
        _ = run_noop_loop(32, _steps, [CheckpointEvery(_every, lambda st: _mgr.save({}, st.step))])
        _kept = [int(p.stem.split("_")[-1]) for p in _mgr.paths()]
    check_equal(list(kept_steps(_steps, _every, _keep)), _kept,
                what=f"checkpoint steps kept after {_steps} steps, every {_every}, keep_last={_keep}")

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %%
headline(
    resume_bitwise_identical=all(torch.equal(p, q) for p, q in zip(model_s.parameters(), model_b.parameters())),
    moco_loss_gap_without_queue=gap,
    killed_save_old_checkpoint_intact=survivor_intact,
    early_stop_step=es_hist.last("step"),
    early_stop_best_val_acc=stopper.best,
    distributed_resumed_from_step=dist_resumed_from,
    distributed_resume_hash_equal=hashes["killed and restarted"] == hashes["uninterrupted"],
)

# %%
workdir_handle.cleanup()   # the lesson's checkpoints, kept until here to be looked at
