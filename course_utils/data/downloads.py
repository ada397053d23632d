"""\"cifar10\" / \"stl10\": torchvision datasets, read from `data_root()` and downloaded only when asked."""
from __future__ import annotations

from pathlib import Path

import torch

from .storage import DatasetUnavailableError, data_root



def _unavailable(name: str, root: Path, reason: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"{name!r} is not available under {root} ({reason}). Get it once with "
        f"load_dataset({name!r}, download=True) on a machine with internet (e.g. Colab), or "
        f"copy it into {root}; offline, use the embedded dataset load_dataset('shapes').")


def load_torchvision(name: str, split: str, download: bool, limit: int | None):
    """cifar10 / stl10 as uint8 N×3×H×W. Only the first `limit` images are kept (saves memory:
    stl10 "unlabeled" is 100000×3×96×96, 2.8 GB as uint8 and 11 GB as float32)."""
    root = data_root()
    folder = {"cifar10": "cifar-10-batches-py", "stl10": "stl10_binary"}[name]
    if not download and not (root / folder).is_dir():
        raise _unavailable(name, root, f"no folder {folder}/")
    import numpy as np
    from torchvision import datasets
    try:
        if name == "cifar10":
            ds = datasets.CIFAR10(root=str(root), train=(split == "train"), download=download)
            x = ds.data[:limit]                                       # N×32×32×3 uint8
            x = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2)
            y = torch.as_tensor(ds.targets[:limit], dtype=torch.int64)
        else:
            ds = datasets.STL10(root=str(root), split=split, download=download)
            x = torch.from_numpy(np.ascontiguousarray(ds.data[:limit]))  # N×3×96×96 uint8
            y = torch.as_tensor(ds.labels[:limit], dtype=torch.int64)   # -1 for "unlabeled"
        classes = list(ds.classes)
    except DatasetUnavailableError:
        raise
    except RuntimeError as err:               # torchvision: "Dataset not found or corrupted"
        raise _unavailable(name, root, "not found" if not download else f"download failed: {err}") from err
    except (OSError, ValueError) as err:      # offline download: URLError is an OSError
        raise _unavailable(name, root, f"{type(err).__name__}: {err}") from err
    return x.contiguous(), y, classes
