"""Checkpoint and resume: atomic writes, clear errors, bitwise-exact resume, caches matter."""
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils import checkpoint as ck
from course_utils.batches import Batches
from course_utils.runtime import seed_everything
from course_utils.train import CheckpointEvery, fit

try:
    from course_utils.objectives.moco import FeatureQueue
except ImportError:  # stand-in with the API.md contract, until the MoCo module exists
    class FeatureQueue(nn.Module):
        def __init__(self, size, dim):
            super().__init__()
            self.register_buffer("keys", F.normalize(torch.randn(size, dim), dim=1))
            self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

        @torch.no_grad()
        def enqueue(self, keys):
            p = int(self.ptr)
            self.keys[(torch.arange(len(keys)) + p) % len(self.keys)] = keys
            self.ptr.fill_((p + len(keys)) % len(self.keys))


# --------------------------------------------------------------------------- save / load
def test_round_trip_with_weights_only(tmp_path):
    state = {"w": torch.randn(3, 4), "step": 7, "name": "run", "nested": {"t": (1, 2.5)}}
    path = ck.save(tmp_path / "a.pt", state)
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file must be renamed away"
    back = ck.load(path)
    assert torch.equal(back["w"], state["w"]) and back["step"] == 7 and back["nested"]["t"] == (1, 2.5)


def test_save_rejects_non_dict(tmp_path):
    with pytest.raises(TypeError, match="dict"):
        ck.save(tmp_path / "a.pt", [1, 2])


def test_missing_file_error_names_file(tmp_path):
    with pytest.raises(ck.MissingCheckpointError, match="nope.pt") as info:
        ck.load(tmp_path / "nope.pt")
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "flip"])
def test_corrupt_file_raises_clear_error(tmp_path, damage):
    path = ck.save(tmp_path / "c.pt", {"w": torch.arange(20000.0)})
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(1000))
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # one byte inside the tensor data: only the CRC check can see it
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    with pytest.raises(ck.CorruptCheckpointError, match="c.pt") as info:
        ck.load(path)
    assert "previous checkpoint" in str(info.value)


def test_weights_only_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "unsafe.pt"
    torch.save({"arr": np.zeros(3)}, path)  # a NumPy array needs pickle's full power
    with pytest.raises(ck.UnsafeCheckpointError, match="weights_only"):
        ck.load(path)


def test_rng_state_round_trips_through_weights_only(tmp_path):
    seed_everything(3)
    ck.save(tmp_path / "r.pt", {"rng": ck.rng_state()})
    expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
    seed_everything(99)
    ck.set_rng_state(ck.load(tmp_path / "r.pt")["rng"])
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected


# --------------------------------------------------------------------------- atomicity
@pytest.mark.skipif(os.name != "posix", reason="needs RLIMIT_FSIZE")
def test_killed_save_leaves_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "last.pt"
    ck.save(path, {"version": 1, "w": torch.zeros(4)})
    code = ck.crash_during_save(path, n_bytes=4 * 2**20, kill_after_bytes=2**20, atomic=True)
    assert code < 0, f"the child should have been killed by a signal, exit code {code}"
    leftovers = list(tmp_path.glob(".last.pt.*.tmp"))
    assert len(leftovers) == 1 and 0 < leftovers[0].stat().st_size <= 2**20, "killed mid-write"
    assert ck.load(path)["version"] == 1


@pytest.mark.skipif(os.name != "posix", reason="needs RLIMIT_FSIZE")
def test_manager_removes_a_killed_saves_leftover_when_it_next_saves(tmp_path):
    """Lesson 10 says CheckpointManager deletes the temporary file a killed save of its own
    checkpoints leaves behind, when it next saves; a file of another name is not its own."""
    mgr = ck.CheckpointManager(tmp_path, keep_last=2)
    first = mgr.save({"step": 1}, 1)
    assert ck.crash_during_save(first, n_bytes=4 * 2**20, kill_after_bytes=2**20, atomic=True) < 0
    (tmp_path / ".other.pt.123.tmp").write_bytes(b"not the manager's")
    assert len(list(tmp_path.glob(f".{first.name}.*.tmp"))) == 1, "the killed save's leftover"
    mgr.save({"step": 2}, 2)
    assert not list(tmp_path.glob(f".{first.name}.*.tmp")), "removed when the manager next saves"
    assert (tmp_path / ".other.pt.123.tmp").exists()
    assert ck.load(first) == {"step": 1}


@pytest.mark.skipif(os.name != "posix", reason="needs RLIMIT_FSIZE")
def test_naive_save_killed_midway_destroys_the_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    ck.save(path, {"version": 1})
    assert ck.crash_during_save(path, n_bytes=4 * 2**20, kill_after_bytes=2**20, atomic=False) < 0
    with pytest.raises(ck.CorruptCheckpointError):
        ck.load(path)


def test_manager_keeps_last_k_and_skips_corrupt(tmp_path):
    mgr = ck.CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        mgr.save({"step": step}, step)
    assert [p.name for p in mgr.paths()] == ["ckpt_00000003.pt", "ckpt_00000004.pt"]
    mgr.latest().write_bytes(b"broken")
    state, path = mgr.load_latest()
    assert state["step"] == 3 and path.name == "ckpt_00000003.pt"
    with pytest.raises(ValueError):
        ck.CheckpointManager(tmp_path, keep_last=0)


# --------------------------------------------------------------------------- exact resume
X = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
Y = torch.randint(3, (40,), generator=torch.Generator().manual_seed(1))


def _run(model_seed=0):
    torch.manual_seed(model_seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    data = Batches(X, Y, batch_size=8, seed=5)  # 5 batches per epoch

    def step(batch):
        x, y = batch
        # every RNG the run uses: torch (dropout), NumPy and Python (noise)
        x = x + 0.01 * float(np.random.randn()) + 0.01 * random.random()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        return loss
    return model, opt, sched, data, step


def test_resume_is_bitwise_identical(tmp_path):
    n = 14  # the save at step 7 falls mid-epoch (epoch 1, batch 2)
    seed_everything(0)
    model, opt, sched, data, step = _run()
    straight = fit(step, data, steps=n, progress=False)

    seed_everything(0)
    model_a, opt_a, sched_a, data_a, step_a = _run()
    mgr = ck.CheckpointManager(tmp_path)
    save = CheckpointEvery(n // 2, lambda st: mgr.save(ck.capture_training_state(
        model=model_a, optimizer=opt_a, scheduler=sched_a, train_state=st, data=data_a), st.step))
    fit(step_a, data_a, steps=n // 2, callbacks=[save], progress=False)

    seed_everything(123)  # a fresh process would start from other RNG states and other weights
    model_b, opt_b, sched_b, data_b, step_b = _run(model_seed=7)
    state, _ = mgr.load_latest()
    ts = ck.restore_training_state(state, model=model_b, optimizer=opt_b, scheduler=sched_b, data=data_b)
    assert ts.position() == {"step": 7, "epoch": 1, "batch_index": 2}
    resumed = fit(step_b, data_b, steps=n, state=ts, progress=False)

    assert resumed.series("loss") == straight.series("loss")
    for p, q in zip(model.parameters(), model_b.parameters()):
        assert torch.equal(p, q), "resumed parameters must match bit for bit"
    assert sched_b.state_dict() == sched.state_dict()
    for p, q in zip(model.parameters(), model_b.parameters()):
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt_b.state[q]["exp_avg_sq"])


def test_load_weights_starts_a_new_run(tmp_path):
    model, opt, sched, data, step = _run()
    fit(step, data, steps=3, progress=False)
    ck.save(tmp_path / "w.pt", ck.capture_training_state(model=model, optimizer=opt))
    fresh = _run(model_seed=9)[0]
    ck.load_weights(tmp_path / "w.pt", fresh)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
    with pytest.raises(ValueError, match="optimizer"):
        ck.restore_training_state(ck.load(tmp_path / "w.pt"), model=fresh)  # optimizer not passed


def test_skip_keeps_a_fresh_optimizer_and_schedule_with_everything_else_restored(tmp_path):
    seed_everything(0)
    model, opt, sched, data, step = _run()
    fit(step, data, steps=5, progress=False)
    state = ck.capture_training_state(model=model, optimizer=opt, scheduler=sched, data=data)
    seed_everything(123)
    fresh, fresh_opt, fresh_sched, fresh_data, _ = _run(model_seed=7)
    ts = ck.restore_training_state(state, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched,
                                   data=fresh_data, skip=("optimizer", "scheduler"))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
    assert torch.equal(torch.get_rng_state(), state["rng"]["torch"])
    assert len(fresh_opt.state) == 0 and fresh_sched.last_epoch == 0   # left as built
    assert ts.position() == {"step": 0, "epoch": 0, "batch_index": 0}  # no train_state captured
    with pytest.raises(ValueError, match="skip"):
        ck.restore_training_state(state, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched,
                                  skip=("model",))


# --------------------------------------------------------------------------- caches are state
class _MoCoToy(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 4)
        self.k = nn.Linear(8, 4)
        self.k.load_state_dict(self.q.state_dict())
        self.k.requires_grad_(False)


def _moco_run(model_seed=0):
    torch.manual_seed(model_seed)
    net, queue = _MoCoToy(), FeatureQueue(16, 4)
    opt = torch.optim.SGD(net.q.parameters(), lr=0.5, momentum=0.9)
    data = Batches(X, batch_size=8, seed=2)

    def step(batch):
        (x,) = batch
        q = F.normalize(net.q(x + 0.1 * torch.randn_like(x)), dim=1)
        with torch.no_grad():
            for pk, pq in zip(net.k.parameters(), net.q.parameters()):
                pk.mul_(0.9).add_(pq, alpha=0.1)
            k = F.normalize(net.k(x + 0.1 * torch.randn_like(x)), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.keys.T], dim=1) / 0.2
        loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        queue.enqueue(k)
        return loss
    return net, queue, opt, data, step


def _moco_resume(tmp_path, keep_queue: bool):
    seed_everything(0)
    net, queue, opt, data, step = _moco_run()
    out = {}
    caches = {"queue": queue} if keep_queue else {}
    cb = CheckpointEvery(5, lambda st: out.setdefault("s", ck.capture_training_state(
        model=net, optimizer=opt, train_state=st, data=data, caches=caches)))
    fit(step, data, steps=5, callbacks=[cb], progress=False)
    ck.save(tmp_path / "m.pt", out["s"])
    seed_everything(1)
    net2, queue2, opt2, data2, step2 = _moco_run(model_seed=3)
    ts = ck.restore_training_state(ck.load(tmp_path / "m.pt"), model=net2, optimizer=opt2,
                                   data=data2, caches={"queue": queue2} if keep_queue else {})
    fit(step2, data2, steps=10, state=ts, progress=False)
    return net2.q.weight.detach().clone()


def test_moco_resume_needs_the_queue(tmp_path):
    seed_everything(0)
    net, _, _, data, step = _moco_run()
    fit(step, data, steps=10, progress=False)
    with_queue = _moco_resume(tmp_path, keep_queue=True)
    without_queue = _moco_resume(tmp_path, keep_queue=False)
    assert torch.equal(with_queue, net.q.weight), "with its queue the MoCo run resumes exactly"
    assert (without_queue - net.q.weight).abs().max() > 1e-4, "without the queue it diverges"


# --------------------------------------------------------------------------- callbacks are state
SCORES = [0.5, 0.9, 0.7, 0.6, 0.8, 0.6, 0.5, 0.4]   # best at the 2nd eval (step 4), then 3 worse


def _early_stopping_run(tmp_path=None, resume_with_callbacks=True):
    """Train with EvalEvery(2) + EarlyStopping(patience 3, restores the best weights). The score is
    scripted by eval count so the best eval (step 4) falls before the checkpoint (step 6) and the
    stop (step 10) after it. Returns (final weights, history, stop step)."""
    from course_utils.train import EarlyStopping, EvalEvery, TrainState
    seed_everything(0)
    model, opt, sched, data, step = _run()
    ts = TrainState()
    evaluate = lambda: {"score": SCORES[len(ts.history.evals)]}
    stopper = EarlyStopping("score", mode="max", patience=3, model=model)
    callbacks = [EvalEvery(2, evaluate, at_end=False), stopper]
    if tmp_path is None:
        fit(step, data, steps=20, callbacks=callbacks, state=ts, progress=False)
        return [p.detach().clone() for p in model.parameters()], ts.history, ts.step
    save = CheckpointEvery(6, lambda st: ck.save(tmp_path / "es.pt", ck.capture_training_state(
        model=model, optimizer=opt, scheduler=sched, train_state=st, data=data,
        callbacks={"eval": callbacks[0], "early_stop": stopper})))
    fit(step, data, steps=6, callbacks=callbacks + [save], state=ts, progress=False)

    seed_everything(123)
    model, opt, sched, data, step = _run(model_seed=7)
    evaluate2 = lambda: {"score": SCORES[len(ts2.history.evals)]}
    stopper2 = EarlyStopping("score", mode="max", patience=3, model=model)
    eval2 = EvalEvery(2, evaluate2, at_end=False)
    if resume_with_callbacks:
        ts2 = ck.restore_training_state(ck.load(tmp_path / "es.pt"), model=model, optimizer=opt,
                                        scheduler=sched, data=data,
                                        callbacks={"eval": eval2, "early_stop": stopper2})
    else:
        ts2 = _restore_dropping_callbacks(tmp_path / "es.pt", model, opt, sched, data)
    fit(step, data, steps=20, callbacks=[eval2, stopper2], state=ts2, progress=False)
    return [p.detach().clone() for p in model.parameters()], ts2.history, ts2.step


def _restore_dropping_callbacks(path, model, opt, sched, data):
    state = ck.load(path)
    state["callbacks"] = {}          # what a checkpoint without callback state would hold
    return ck.restore_training_state(state, model=model, optimizer=opt, scheduler=sched, data=data)


def test_resume_keeps_early_stopping_state(tmp_path):
    weights, history, stopped_at = _early_stopping_run()
    assert stopped_at == 10 and [e["step"] for e in history.evals] == [2, 4, 6, 8, 10]
    r_weights, r_history, r_stopped_at = _early_stopping_run(tmp_path)
    assert r_stopped_at == stopped_at and r_history.evals == history.evals
    assert r_history.series("loss") == history.series("loss")
    assert all(torch.equal(a, b) for a, b in zip(weights, r_weights)), \
        "the best weights (step 4) were saved with the callback and restored at the stop"
    d_weights, _, d_stopped_at = _early_stopping_run(tmp_path, resume_with_callbacks=False)
    assert d_stopped_at == stopped_at          # the history alone still says when to stop ...
    assert not all(torch.equal(a, b) for a, b in zip(weights, d_weights)), \
        "... but without its state the callback restores the wrong 'best' weights"


def test_restore_refuses_to_drop_callback_state(tmp_path):
    from course_utils.train import EvalEvery
    seed_everything(0)
    model, opt, sched, data, step = _run()
    cb = EvalEvery(2, lambda: {"x": 1.0})
    state = ck.capture_training_state(model=model, optimizer=opt, scheduler=sched, data=data,
                                      callbacks={"eval": cb})
    ck.save(tmp_path / "c.pt", state)
    with pytest.raises(ValueError, match="callback state"):
        ck.restore_training_state(ck.load(tmp_path / "c.pt"), model=model, optimizer=opt,
                                  scheduler=sched, data=data)
    with pytest.raises(ValueError, match="not in the checkpoint"):
        ck.restore_training_state(ck.load(tmp_path / "c.pt"), model=model, optimizer=opt, scheduler=sched,
                                  data=data, callbacks={"eval": cb, "other": EvalEvery(3, lambda: {})})
    with pytest.raises(TypeError, match="state_dict"):
        ck.capture_training_state(model=model, callbacks={"eval": object()})
