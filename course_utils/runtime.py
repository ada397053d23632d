"""Where the lesson runs: device choice, Colab detection, seeds and determinism."""
from __future__ import annotations

import os
import platform
import random
import sys
import time

import numpy as np
import torch

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


def describe_device() -> dict:
    """Facts about the machine a reader is on, as a plain dict."""
    info = {
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
