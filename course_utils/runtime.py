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
from .scales import resolve_scale


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


def pick_device(scale: str) -> torch.device:
    """CUDA for the gpu scale (required), otherwise CPU: CI and default scales are CPU lessons.

    MPS is reported by ``describe_device`` but not chosen: several kernels the lessons measure
    (saved-tensor hooks, FLOP counting) are only checked on CPU and CUDA.
    """
    scale = resolve_scale(scale)
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
    return pick_device(scale)


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
    """CPU seconds this process has used divided by torch's thread count: the wall-clock time the
    work would take on an otherwise idle machine with that many cores. Budgets and timings on a
    shared, oversubscribed CPU machine (CI, a laptop running other things) use it, since
    wall-clock there measures the neighbours too. Not for CUDA work or DataLoader workers, whose
    time is spent outside this process's CPU."""
    return time.process_time() / torch.get_num_threads()
