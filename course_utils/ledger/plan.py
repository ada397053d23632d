"""Plans of real runs, measured on fake tensors (lesson 11): one function per configuration.

Each builds its model *inside* the caller's ``fake_mode()`` (and, for several ranks, on the mesh
``fake_world`` yields), runs one training step under ``measure`` and returns the ledger record.
Call them on fake tensors for paper-size runs; at small sizes they also run on real tensors,
which is how the tests check that fake and real agree.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checks
from .measured import measure


def tensor_parallel_ledger(mesh, *, hidden: int, batch: int, seq: int, layers: int = 1):
    """Megatron tensor parallelism of ``layers`` transformer MLPs (Linear(h, 4h)-GELU-Linear(4h, h))
    over ``mesh`` (1-D), with torch's ``parallelize_module``: the first Linear column-parallel, the
    second row-parallel. One AdamW step on a b×s×h batch (after one that creates the state).

    Communication per step: a forward all-reduce of b·s·h after every row-parallel Linear and a
    backward one before every column-parallel Linear whose input needs a gradient.
    """
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    for name, value in dict(hidden=hidden, batch=batch, seq=seq, layers=layers).items():
        checks.positive_int(value, name)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                          nn.Linear(4 * hidden, hidden)) for _ in range(layers)])
    plan = {}
    for i in range(layers):
        plan[f"{i}.0"], plan[f"{i}.2"] = ColwiseParallel(), RowwiseParallel()
    model = parallelize_module(model, mesh, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(0))

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), x).backward()
        opt.step()
    step()
    return measure(step, model=model, optimizer=opt)
