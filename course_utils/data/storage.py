"""Where datasets live on disk: the data folder, the cache of generated datasets, and the error
that says how to get a dataset that must be downloaded."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from ..files import save_atomically


class DatasetUnavailableError(RuntimeError):
    """A dataset that must be downloaded is not on disk (or the download failed)."""


def data_root() -> Path:
    """Folder for caches and downloads: $COURSE_DATA_DIR, else <repo>/data in a checkout,
    else ./data (e.g. /content/data on Colab, where the kit is pip-installed)."""
    if os.environ.get("COURSE_DATA_DIR"):
        return Path(os.environ["COURSE_DATA_DIR"])
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / "data"
    return Path.cwd() / "data"


def cache_path(key: str) -> Path:
    return data_root() / f"{key}.pt"


def _read_cache(path: Path, n: int | None = None):
    """Cached (images uint8 N×C×H×W, labels N, classes), or None if missing, unreadable,
    malformed or of another size: a bad cache is regenerated, never trusted."""
    if not path.exists():
        return None
    try:
        blob = torch.load(path, weights_only=True)
        images, labels, classes = blob["images"], blob["labels"], list(blob["classes"])
        ok = (images.dtype == torch.uint8 and images.dim() == 4
              and labels.dtype == torch.int64 and tuple(labels.shape) == images.shape[:1]
              and (n is None or images.shape[0] == n) and all(isinstance(c, str) for c in classes))
    except Exception:  # truncated, not a torch file, wrong keys: regenerate
        ok = False
    if not ok:
        warnings.warn(f"ignoring a corrupt or outdated cache {path}; regenerating it")
        return None
    return images, labels, classes


def cached(key: str, build, n: int | None = None):
    """(images, labels, classes) from data_root()/key.pt, built by `build()` and saved if absent."""
    path = cache_path(key)
    hit = _read_cache(path, n)
    if hit is not None:
        return hit
    images, labels, classes = build()
    try:
        save_atomically({"images": images, "labels": labels, "classes": list(classes)}, path)
    except OSError as err:  # a read-only install still works, just without the cache
        warnings.warn(f"could not write the cache {path}: {err}")
    return images, labels, classes
