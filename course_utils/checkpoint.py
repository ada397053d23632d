"""Checkpoints that survive a crash and resume a run exactly.

Two ways to use a checkpoint (the source's ``resume_from`` vs ``load_from``):

- **resume** (``restore_training_state``): continue the *same* run. Needs everything the next
  step depends on: model weights, optimizer state (Adam's moments), LR-scheduler position,
  GradScaler scale (fp16 AMP), RNG states (Python, NumPy, torch CPU and CUDA), the data-order
  position (epoch, batch index, the shuffling seed), the step counter and history, and the
  objective's caches (MoCo's queue and its pointer). Miss one and the run silently diverges.
- **load weights** (``load_weights``): start a *new* run (fine-tuning) from the weights only;
  step 0, fresh optimizer, fresh schedule.

Writes are atomic: ``save`` writes a temporary file in the same folder, flushes and fsyncs it,
``os.replace``s it over the target (atomic on POSIX and Windows) and fsyncs the folder, so a
crash mid-write leaves the previous checkpoint intact. ``load`` uses
``torch.load(weights_only=True)`` (no arbitrary code runs while unpickling), checks the zip
archive's CRCs, and raises ``CorruptCheckpointError`` / ``MissingCheckpointError`` naming the file
and what to do. Everything stored is tensors, numbers, strings, lists, tuples and dicts, which is
what ``weights_only=True`` accepts (so NumPy's RNG state is stored as a tensor plus ints).
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import random
import re
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .files import save_atomically
from .train import History, TrainState


class CheckpointError(RuntimeError):
    """Base class of the errors ``load`` raises."""


class CorruptCheckpointError(CheckpointError):
    """The file exists but is truncated or damaged."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """No file at the given path."""


class UnsafeCheckpointError(CheckpointError):
    """The file holds objects ``torch.load(weights_only=True)`` refuses to build."""


# --------------------------------------------------------------------------- save / load

def rng_state(device: torch.device | None = None) -> dict:
    """Python, NumPy (legacy global), torch CPU and CUDA RNG states, as a dict ``checkpoint.save``
    can write. CUDA: every device's state, or only ``device``'s when one is given (a distributed
    rank owns one GPU and must not save its neighbours')."""
    py_version, py_internal, py_gauss = random.getstate()
    bitgen, key, pos, has_gauss, cached = np.random.get_state()
    if device is not None and torch.device(device).type == "cuda":
        cuda = [torch.cuda.get_rng_state(device)]
    else:
        cuda = torch.cuda.get_rng_state_all() if device is None and torch.cuda.is_available() else []
    return {
        "python": {"version": py_version, "internal": list(py_internal), "gauss_next": py_gauss},
        "numpy": {"bit_generator": bitgen, "key": torch.from_numpy(key.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Inverse of ``rng_state`` (same ``device``). CUDA states are restored only where CUDA is."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state((npy["bit_generator"], npy["key"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state["cuda"]:
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.set_rng_state(state["cuda"][0], device)
        elif device is None:
            torch.cuda.set_rng_state_all(state["cuda"])


def save(path, state: dict) -> Path:
    """Write ``state`` (a dict) to ``path`` atomically; returns the path.

    See ``course_utils.files.save_atomically``: temp file in the same folder -> torch.save ->
    flush + fsync -> os.replace over ``path`` -> fsync the folder.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict (e.g. capture_training_state(...)), got {type(state).__name__}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; pass a file path such as {path / 'last.pt'}")
    return save_atomically(state, path)


def load(path, *, map_location="cpu", verify: bool = True) -> dict:
    """Read a checkpoint written by ``save`` with ``torch.load(weights_only=True)``.

    ``verify`` checks every member's CRC first (reads the whole file once), which catches
    truncation and flipped bytes that torch.load alone might not notice.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingCheckpointError(
            f"no checkpoint at {path}; pass the path of a file written by "
            "course_utils.checkpoint.save (CheckpointManager.latest() finds the newest), "
            "or start the run from scratch")
    advice = (f"{path} is truncated or corrupt ({{why}}); it was probably cut off mid-write by a "
              "crash or a full disk. Delete it and resume from the previous checkpoint "
              "(CheckpointManager keeps the last k).")
    if not zipfile.is_zipfile(path):
        raise CorruptCheckpointError(advice.format(why="not a zip archive"))
    if verify:
        try:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            raise CorruptCheckpointError(advice.format(why=str(err))) from err
        if bad is not None:
            raise CorruptCheckpointError(advice.format(why=f"CRC mismatch in member {bad}"))
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" in str(err).lower():
            raise UnsafeCheckpointError(
                f"{path} contains objects that torch.load(weights_only=True) will not build "
                f"({str(err).splitlines()[-1][:200]}); store only tensors, numbers, strings, "
                "lists, tuples and dicts (state_dict()s), e.g. via capture_training_state") from err
        raise CorruptCheckpointError(advice.format(why=str(err).splitlines()[0])) from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as err:
        raise CorruptCheckpointError(advice.format(why=str(err).splitlines()[0])) from err
    if not isinstance(state, dict):
        raise CorruptCheckpointError(advice.format(why=f"top level is a {type(state).__name__}, not a dict"))
    return state


# --------------------------------------------------------------------------- training state
def _check_module(name, obj, kind=nn.Module):
    if obj is not None and not isinstance(obj, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(obj).__name__}")


def capture_training_state(*, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                           train_state=None, data=None, caches: dict | None = None,
                           callbacks: dict | None = None, extra: dict | None = None) -> dict:
    """Everything needed to continue a run, as a dict ``save`` can write.

    ``train_state``: a ``course_utils.train.TrainState`` (step, epoch, batch_index, history);
    ``data``: a ``course_utils.batches.Batches`` (its seed/batch size, checked on resume); ``caches``: name ->
    nn.Module whose buffers persist across steps (a MoCo ``FeatureQueue``: keys and ptr), or a
    tensor; ``callbacks``: name -> ``course_utils.train.Callback`` whose counters must survive
    (an ``EarlyStopping``'s best value and patience count, an ``EvalEvery``'s last step), so a
    resumed run stops and evaluates where the uninterrupted one would; ``extra``: plain values of
    your own.
    """
    _check_module("model", model)
    caches = caches or {}
    callbacks = callbacks or {}
    state = {
        "kind": "training_state",
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "rng": rng_state(),
        "position": train_state.position() if train_state is not None else None,
        "history": train_state.history.state_dict() if train_state is not None else None,
        "data": data.state_dict() if data is not None else None,
        "caches": {},
        "callbacks": {},
        "extra": dict(extra or {}),
    }
    for name, cb in callbacks.items():
        if not callable(getattr(cb, "state_dict", None)):
            raise TypeError(f"callbacks[{name!r}] must have state_dict() (a course_utils.train.Callback), "
                            f"got {type(cb).__name__}")
        state["callbacks"][name] = cb.state_dict()
    for name, cache in caches.items():
        if isinstance(cache, nn.Module):
            state["caches"][name] = cache.state_dict()
        elif torch.is_tensor(cache):
            state["caches"][name] = cache.detach().clone()
        else:
            raise TypeError(f"caches[{name!r}] must be an nn.Module or a tensor, got {type(cache).__name__}")
    return state


def restore_training_state(state: dict, *, model: nn.Module, optimizer=None, scheduler=None,
                           scaler=None, data=None, caches: dict | None = None,
                           callbacks: dict | None = None, restore_rng: bool = True,
                           skip: tuple = ()):
    """Resume: load every piece ``capture_training_state`` stored into the live objects and
    return a ``course_utils.train.TrainState`` to pass to ``fit(..., state=...)``.

    Anything the checkpoint has but you do not pass (an optimizer state with no optimizer, a
    cache with no module) raises, because silently dropping it changes the run. To leave a piece
    fresh on purpose, name it in ``skip`` (any of "optimizer", "scheduler", "scaler"): e.g.
    ``skip=("optimizer", "scheduler")`` continues from the same weights, data position and RNG
    with a new optimizer and schedule, which isolates what those two carry.
    """
    if not isinstance(state, dict) or state.get("kind") != "training_state":
        raise ValueError("state is not a training state; pass what load() returns for a file "
                         "written from capture_training_state(...)")
    _check_module("model", model)
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    unknown = set(skip) - {"optimizer", "scheduler", "scaler"}
    if unknown:
        raise ValueError(f"skip={sorted(unknown)} is not a piece that can be left fresh; pass any of "
                         "'optimizer', 'scheduler', 'scaler'")
    model.load_state_dict(state["model"])
    for name, obj, saved in (("optimizer", optimizer, state["optimizer"]),
                             ("scheduler", scheduler, state["scheduler"]),
                             ("scaler", scaler, state["scaler"])):
        if name in skip:
            continue
        if saved is not None and obj is None:
            raise ValueError(f"the checkpoint holds {name} state but no {name} was passed; pass "
                             f"{name}=... to resume exactly, or use load_weights() for a new run")
        if saved is not None:
            obj.load_state_dict(saved)
    caches = caches or {}
    missing = set(state["caches"]) - set(caches)
    if missing:
        raise ValueError(f"the checkpoint holds caches {sorted(missing)} but they were not passed; "
                         "pass caches={name: module} (e.g. the MoCo queue) to resume exactly")
    for name, cache in caches.items():
        if name not in state["caches"]:
            raise ValueError(f"cache {name!r} is not in the checkpoint (it has {sorted(state['caches'])})")
        if isinstance(cache, nn.Module):
            cache.load_state_dict(state["caches"][name])
        else:
            cache.copy_(state["caches"][name])
    callbacks = callbacks or {}
    saved_callbacks = state.get("callbacks", {})   # checkpoints written before callbacks were stored
    missing = set(saved_callbacks) - set(callbacks)
    if missing:
        raise ValueError(f"the checkpoint holds callback state {sorted(missing)} but those callbacks were "
                         "not passed; pass callbacks={name: callback} to resume exactly")
    for name, cb in callbacks.items():
        if name not in saved_callbacks:
            raise ValueError(f"callback {name!r} is not in the checkpoint (it has {sorted(saved_callbacks)})")
        cb.load_state_dict(saved_callbacks[name])
    if data is not None and state["data"] is not None:
        data.load_state_dict(state["data"])
    if restore_rng:
        set_rng_state(state["rng"])
    pos = state["position"] or {"step": 0, "epoch": 0, "batch_index": 0}
    history = History.from_state_dict(state["history"]) if state["history"] else History()
    return TrainState(step=pos["step"], epoch=pos["epoch"], batch_index=pos["batch_index"],
                      history=history)


def load_weights(path_or_state, model: nn.Module, *, strict: bool = True) -> nn.Module:
    """Fine-tuning start (``load_from``): copy only the model weights; the caller builds a fresh
    optimizer and schedule and starts at step 0. Accepts a path or a loaded state."""
    _check_module("model", model)
    state = load(path_or_state) if isinstance(path_or_state, (str, os.PathLike)) else path_or_state
    weights = state.get("model", state) if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise ValueError("expected a training state with a 'model' entry, or a state_dict")
    model.load_state_dict(weights, strict=strict)
    return model


# --------------------------------------------------------------------------- keep the last k
class CheckpointManager:
    """Writes ``<dir>/<prefix>_<step>.pt`` atomically and keeps the newest ``keep_last``.

    ``save(state, step)`` deletes older files only after the new one is safely in place.
    ``latest()`` / ``paths()`` list what is there; ``load_latest()`` skips (and reports) a
    corrupt newest file and falls back to the one before.
    """

    def __init__(self, directory, keep_last: int = 3, prefix: str = "ckpt"):
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
            raise ValueError(f"prefix must be letters, digits, '_' or '-', got {prefix!r}")
        self.directory, self.keep_last, self.prefix = Path(directory), keep_last, prefix
        self._pattern = re.compile(rf"{re.escape(prefix)}_(\d+)\.pt")

    def path_for(self, step: int) -> Path:
        return self.directory / f"{self.prefix}_{step:08d}.pt"

    def paths(self) -> list[Path]:
        """Checkpoint files, oldest first (by step)."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := self._pattern.fullmatch(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        paths = self.paths()
        return paths[-1] if paths else None

    def save(self, state: dict, step: int) -> Path:
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        path = save(self.path_for(step), state)
        for old in self.paths()[:-self.keep_last]:
            old.unlink()
        self.remove_stale_temp_files()
        return path

    def remove_stale_temp_files(self) -> list[Path]:
        """Delete ``.<name>.*.tmp`` left by a save that was killed mid-write."""
        stale = list(self.directory.glob(f".{self.prefix}_*.tmp"))
        for p in stale:
            with contextlib.suppress(OSError):
                p.unlink()
        return stale

    def load_latest(self) -> tuple[dict, Path]:
        """(state, path) of the newest readable checkpoint; corrupt newer ones are skipped."""
        errors = []
        for path in reversed(self.paths()):
            try:
                return load(path), path
            except CorruptCheckpointError as err:
                errors.append(str(err))
        raise MissingCheckpointError(
            f"no readable checkpoint in {self.directory}"
            + (f" ({len(errors)} corrupt: {errors[0]})" if errors else "")
            + "; start the run from scratch")


# --------------------------------------------------------------------------- crash simulation
def _save_until_killed(path: str, n_bytes: int, kill_after_bytes: int, atomic: bool) -> None:
    """Child process: write a state of ``n_bytes`` and be killed by the kernel after
    ``kill_after_bytes`` (RLIMIT_FSIZE + the default SIGXFSZ action, which CPython ignores
    unless told otherwise). Deterministic, unlike racing a SIGKILL against the disk."""
    import resource
    import signal
    # a forked child must not enter the parent's OpenMP pool (libgomp is not fork-safe: it hangs)
    torch.set_num_threads(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))            # no core file
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)                # exceeding the limit kills us
    resource.setrlimit(resource.RLIMIT_FSIZE, (kill_after_bytes, kill_after_bytes))
    state = {"kind": "payload", "weights": torch.ones(n_bytes // 4, dtype=torch.float32)}
    if atomic:
        save(path, state)
    else:
        torch.save(state, path)  # the naive way: writes straight over the previous file


def crash_during_save(path, *, n_bytes: int = 8 * 2**20, kill_after_bytes: int = 2**20,
                      atomic: bool = True, timeout: float = 60.0) -> int:
    """Start a child process (multiprocessing) that overwrites ``path`` with a large
    state and is killed by a signal after writing ``kill_after_bytes``. Returns the child's
    exit code (negative = killed by that signal). POSIX only (needs RLIMIT_FSIZE)."""
    if os.name != "posix":
        raise RuntimeError("crash_during_save needs POSIX resource limits (Linux or macOS)")
    if not 0 < kill_after_bytes < n_bytes:
        raise ValueError(f"need 0 < kill_after_bytes < n_bytes, got {kill_after_bytes}, {n_bytes}")
    # fork is fast (no second torch import); spawn once CUDA is initialised (fork breaks CUDA)
    fork_ok = "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized()
    ctx = mp.get_context("fork" if fork_ok else "spawn")
    child = ctx.Process(target=_save_until_killed,
                        args=(str(path), int(n_bytes), int(kill_after_bytes), atomic))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        raise RuntimeError(f"the child writing {path} did not finish within {timeout} s")
    return child.exitcode
