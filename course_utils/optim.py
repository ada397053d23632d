"""The one optimizer table: name -> class, default settings, fp32 state copies per parameter.

The ledger's prediction (``ledger.predict_step``), the memory predictor (``memory``) and the
distributed workers all read this table, so "sgd" means the same thing everywhere:

    name            class                 defaults          state copies per parameter
    sgd             torch.optim.SGD       (none)            0
    sgd-momentum    torch.optim.SGD       momentum=0.9      1   (the momentum buffer)
    adam            torch.optim.Adam      (none)            2   (exp_avg, exp_avg_sq)
    adamw           torch.optim.AdamW     (none)            2

State copies are in the parameters' dtype under fp32 training and stay fp32 under bf16 mixed
precision (they belong to the fp32 master weights).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import checks


class OptimizerSpec(NamedTuple):
    cls: type
    defaults: dict
    state_copies: int          # tensors of the parameter's size kept per parameter


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "sgd": OptimizerSpec(torch.optim.SGD, {}, 0),
    "sgd-momentum": OptimizerSpec(torch.optim.SGD, {"momentum": 0.9}, 1),
    "adam": OptimizerSpec(torch.optim.Adam, {}, 2),
    "adamw": OptimizerSpec(torch.optim.AdamW, {}, 2),
}


def state_copies(name: str) -> int:
    """fp32 copies of each parameter the optimizer ``name`` keeps as state."""
    return OPTIMIZERS[checks.choice(name, "optimizer", OPTIMIZERS)].state_copies


def make_optimizer(name: str, params, lr: float = 1e-3, **overrides) -> torch.optim.Optimizer:
    """Build optimizer ``name`` (see the table) on ``params`` with ``lr``; ``overrides`` replace
    its defaults (e.g. ``weight_decay=1e-4``, ``foreach=False``)."""
    spec = OPTIMIZERS[checks.choice(name, "optimizer", OPTIMIZERS)]
    return spec.cls(params, lr=checks.positive_float(lr, "lr"), **{**spec.defaults, **overrides})
