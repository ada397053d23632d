"""The one batch source: epochs of batches, seeded per epoch, that resume exactly.

``Batches(images, labels, batch_size=B, seed=s)`` is a function ``epoch -> iterator of
batches`` for ``course_utils.train.fit``. Epoch e's order is the (e+1)-th permutation drawn from
a CPU generator seeded with ``seed``, so the data position of a run is just (seed, epoch,
batch_index): a resumed run regenerates the same order and ``fit`` skips the batch_index
batches already used. Nothing depends on a generator shared with augmentation, which is what
made the old per-call batch iterators impossible to resume.

A batch is a tuple of the tensors' rows, ``(images, labels)``, plus ``ids`` (int64 row indices,
on the data's device) with ``with_ids=True`` (MoCo stores them with its keys to measure
staleness). Permutations are drawn on the CPU and moved, so CPU and CUDA runs see the same order.
"""
from __future__ import annotations

import math
from typing import Iterator

import torch

from . import checks


class Batches:
    """Epoch-seeded, resumable batches over tensors that share their first dimension (N)."""

    def __init__(self, *tensors: torch.Tensor, batch_size: int, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True, with_ids: bool = False):
        if not tensors or any(not torch.is_tensor(t) for t in tensors):
            raise TypeError("pass one or more tensors sharing the first dimension, e.g. images, labels")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ValueError(f"tensors must share the first dimension, got {[t.shape[0] for t in tensors]}")
        checks.positive_int(batch_size, "batch_size")
        if drop_last and batch_size > n:
            raise ValueError(f"batch_size={batch_size} with drop_last=True gives no batch from {n} "
                             f"items; pass batch_size <= {n} or drop_last=False")
        checks.instance(seed, "seed", int)
        self.tensors, self.n, self.batch_size, self.seed = tensors, n, batch_size, seed
        self.shuffle, self.drop_last, self.with_ids = bool(shuffle), bool(drop_last), bool(with_ids)
        self._cached = None                       # (epoch, generator after drawing that epoch)

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        """The permutation of epoch ``epoch`` (regenerated from the seed, never stored)."""
        checks.positive_int(epoch, "epoch", minimum=0)
        if not self.shuffle:
            return torch.arange(self.n)
        if self._cached is not None and self._cached[0] == epoch - 1:
            generator = self._cached[1]           # the next epoch of a run: one draw, not e+1
        else:
            generator = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.n, generator=generator)
        order = torch.randperm(self.n, generator=generator)
        self._cached = (epoch, generator)
        return order

    def __call__(self, epoch: int = 0) -> Iterator[tuple]:
        order = self.order(epoch)
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size].to(self.tensors[0].device)
            rows = tuple(t[idx.to(t.device)] for t in self.tensors)
            yield rows + (idx,) if self.with_ids else rows

    def __iter__(self) -> Iterator[tuple]:
        """Epoch 0; call ``batches(epoch)`` for the others."""
        return self(0)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batch_size": self.batch_size, "n": self.n,
                "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """The order is fixed by the settings: resuming with other ones would replay other
        batches, so a difference is refused rather than silently adopted."""
        if state != self.state_dict():
            raise ValueError(f"data order in checkpoint {state} differs from this run's "
                             f"{self.state_dict()}; build the batches with the same data, "
                             "batch_size and seed to resume exactly")
