"""Where the lesson runs: device choice, Colab detection, seeds and determinism, and independent
seeded runs spread over the CPU's cores (``map_runs``)."""
from __future__ import annotations

import multiprocessing
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from . import checks
from .scales import resolve_scale, scale_reason


def in_colab() -> bool:
    return "google.colab" in sys.modules


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    checks.positive_int(seed, "seed", minimum=0)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def make_deterministic() -> None:
    """Deterministic kernels where torch has them; warn (not fail) where it has none."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


DEVICE_VAR = "COURSE_DEVICE"


def pick_device(scale: str) -> torch.device:
    """CUDA for the gpu scale (required), otherwise CPU: CI and default scales are CPU lessons.

    ``$COURSE_DEVICE=cuda`` runs a ci or default lesson on the GPU instead: the ci preset is then
    a step-capped pass through the lesson's GPU code paths (``tools/gpu_check.py --lesson-scale
    ci`` uses it to walk every lesson in minutes). MPS is reported by ``describe_device`` but not
    chosen: several kernels the lessons measure (saved-tensor hooks, FLOP counting) are only
    checked on CPU and CUDA.
    """
    scale = resolve_scale(scale)
    forced = os.environ.get(DEVICE_VAR)
    if forced:
        if forced not in ("cpu", "cuda"):
            raise ValueError(f"${DEVICE_VAR}={forced!r}: use 'cuda' or 'cpu', or unset it")
        if forced == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"${DEVICE_VAR}=cuda but torch sees no CUDA GPU; unset it")
        if forced == "cpu" and scale == "gpu":
            raise ValueError(f"${DEVICE_VAR}=cpu cannot run SCALE='gpu'; choose 'default' or 'ci'")
        return torch.device(forced)
    if scale == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "SCALE='gpu' needs a CUDA GPU, and torch sees none. On Colab choose "
                "Runtime > Change runtime type > T4 GPU and rerun; on this machine use "
                "SCALE='default' (teaching scale on CPU) or SCALE='ci'.")
        return torch.device("cuda")
    return torch.device("cpu")


def setup(scale: str | None = None, seed: int = 0) -> torch.device:
    """One call at the top of every notebook: validate the scale, seed, choose the device."""
    scale = resolve_scale(scale)
    seed_everything(seed)
    make_deterministic()
    device = pick_device(scale)
    forced = f" (from ${DEVICE_VAR})" if os.environ.get(DEVICE_VAR) else ""
    print(f"SCALE = {scale!r}, {scale_reason(scale)}; on {device}{forced}. To choose, set SCALE in the "
          f"parameters cell or COURSE_SCALE in the environment (ci, default or gpu).")
    if os.environ.get("COURSE_CHECK_PLACEMENT") == "1":  # make test sets it
        # an optional tool, loaded only when asked for (it patches torch.load and collectives)
        from .distributed.device_check import watch_placement
        if not watch_placement(device):
            print("COURSE_CHECK_PLACEMENT=1: host and device tensors are told apart on this "
                  "machine, so a device bug raises here as it would on a GPU")
    return device


def _cpu_model() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def describe_device() -> dict:
    """Facts about the machine a reader is on, as a plain dict."""
    info = {
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "colab": in_colab(),
    }
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["bf16"] = torch.cuda.is_bf16_supported()
    return info


def core_seconds() -> float:
    """CPU seconds this process has used divided by torch's thread count: a proxy for the
    wall-clock time the work would take on an otherwise idle machine with that many cores.
    Budgets and timings on a shared, oversubscribed CPU machine (CI, a laptop running other
    things) use it, since wall-clock there measures the neighbours too. It is biased both ways:
    work that runs on one thread (small ops, Python dispatch) counts 1/threads of its wall time,
    and OpenMP threads spinning while they wait under contention add CPU time that an idle
    machine would not spend. Not for CUDA work or DataLoader workers, whose time is spent outside
    this process's CPU."""
    return time.process_time() / torch.get_num_threads()


_FORKED_FN = None   # the function map_runs' forked workers run: inherited through fork, never pickled
_STEP_BARS = False  # whether the runs map_runs is calling now may show per-step bars (step_bars)


def step_bars() -> bool:
    """Whether a run that :func:`map_runs` is calling may show its own per-step progress bar
    (``fit(..., progress=step_bars())``): only where map_runs runs them on a GPU, in this process,
    one after the other, where a run can take minutes and the run-count bar alone would sit still.
    Never in a forked worker (only the notebook's process owns its output), and not on the CPU,
    where every run here is seconds long and per-step bars would only fill the output."""
    return _STEP_BARS


def _one_thread_worker() -> None:
    # libgomp's thread pool does not survive fork: a child that runs one thread never uses it
    torch.set_num_threads(1)


def _backward_runs() -> bool:
    x = torch.ones(1, requires_grad=True)
    try:
        (2 * x).sum().backward()
    except RuntimeError:
        return False
    return True


def _autograd_survives_fork() -> bool:
    """Whether a process forked from this one can run backward. Once autograd has started its
    device threads here (a backward on fake tensors does, as the ledger's ``fake=True`` makes),
    torch refuses backward in every forked child ("Unable to handle autograd's threading in
    combination with fork-based multiprocessing"). torch exposes no flag for it, so a forked
    child tries one backward (a few tens of milliseconds)."""
    with multiprocessing.get_context("fork").Pool(1, initializer=_one_thread_worker) as pool:
        return pool.apply(_backward_runs)


def _run(fn, key):
    try:
        return fn(key)
    except Exception as err:   # say which run, in this process's traceback too
        err.add_note(f"in map_runs' run {key!r}")
        raise


def _call(key):
    return key, _run(_FORKED_FN, key)


def map_runs(fn, keys, *, device=None, workers: int | None = None, desc: str | None = None) -> dict:
    """{key: fn(key)} for independent training runs (a key names one: a seed, or an arm and a
    seed), spread over the CPU's cores; in the order of ``keys``, longest first pays.

    A training step this small keeps one core busy and gains little from a second thread (torch's
    intra-op threads wait on each other between small ops), so two runs side by side, one thread
    each, finish sooner than the same two one after the other on two threads (about 1.4× on this
    kit's 2-core machine, where a second thread speeds one MoCo step up 1.36×). Each run happens in
    a forked worker process running one thread, which inherits ``fn`` (a notebook's function or
    lambda will do); ``fn`` must seed everything it draws (its model, data order and
    augmentations), so that a run's result does not depend on where it ran, must not print or
    show progress bars (only this process owns the notebook's output) except where
    :func:`step_bars` says it may (on a GPU), and must return what pickles (tensors, modules,
    numbers, dicts; no lambdas). One progress bar here counts finished runs.

    ``workers`` defaults to torch's thread count, the cores this lesson was given: 1 under ``make
    test``, which then runs them one after the other in this process. With the default, every run
    on Linux sees one thread wherever it runs, so its numbers are the same under ``make test``,
    ``make course`` and a lesson run alone on one machine (another CPU's vector units can round
    differently: the kit's SSL benchmark saw a random-init probe move by 0.4 points between two
    machines). On a GPU (``device`` CUDA), or off Linux (fork is not
    safe with macOS's system libraries, and Windows has none), the runs happen here, one after the
    other: CUDA does not survive fork, and one GPU is busy with one run's kernels anyway. Where
    autograd cannot run in a forked child (after a backward on fake tensors in this process) the
    runs happen here too, one thread each, and it says so.
    """
    global _FORKED_FN, _STEP_BARS
    keys = list(keys)
    workers = checks.positive_int(workers if workers is not None else torch.get_num_threads(), "workers")
    on_gpu = device is not None and torch.device(device).type != "cpu"
    # fork is safe with torch's CPU libraries on Linux; macOS's system libraries are not fork-safe
    forkable = sys.platform.startswith("linux")
    fork = workers > 1 and not on_gpu and forkable
    one_thread_here = fork and not _autograd_survives_fork()
    if one_thread_here:
        fork = False
        print("map_runs: autograd cannot run in a process forked from this one (a backward on "
              "fake tensors started its threads), so the runs happen here, one after the other, "
              "one thread each")
    outer_threads = torch.get_num_threads()
    bar = tqdm(total=len(keys), desc=desc or "runs")
    results = {}
    try:
        if one_thread_here:
            torch.set_num_threads(1)   # as a forked worker would have run each
        if not fork:
            outer_bars, _STEP_BARS = _STEP_BARS, on_gpu
            try:
                for key in keys:
                    results[key] = _run(fn, key)
                    bar.update()
            finally:
                _STEP_BARS = outer_bars
        else:   # a single run forks too: it gets one thread, as every run does
            outer, _FORKED_FN = _FORKED_FN, fn
            try:
                context = multiprocessing.get_context("fork")
                with context.Pool(min(workers, len(keys)), initializer=_one_thread_worker) as pool:
                    for key, result in pool.imap_unordered(_call, keys):
                        results[key] = result
                        bar.update()
            finally:
                _FORKED_FN = outer
    finally:
        if one_thread_here:
            torch.set_num_threads(outer_threads)
        bar.close()
    return {key: results[key] for key in keys}
