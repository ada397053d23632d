"""Atomic file writes, written once for checkpoints and dataset caches.

``save_atomically(obj, path)``: temp file in the same folder (a rename across file systems is not
atomic) -> ``torch.save`` -> flush + fsync -> ``os.replace`` over ``path`` (atomic on POSIX and
Windows) -> fsync the folder. A crash at any point leaves either the previous file or the new one,
never half of one; a failed write removes its temp file (``.<name>.<random>.tmp``).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import torch


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable. Not possible on Windows (no O_DIRECTORY); skipped there."""
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomically(obj, path) -> Path:
    """``torch.save(obj, path)`` so that ``path`` is never seen half-written; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path
