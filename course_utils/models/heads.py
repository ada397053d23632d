"""The flat models: an MLP (lesson 01's hand-counted parameters) and the SimCLR / MoCo projection head."""
from __future__ import annotations

import torch
from torch import nn

from .. import checks


class MLP(nn.Module):
    """Linear -> ReLU -> ... -> Linear on the flattened input: B×(anything with in_dim entries) -> B×out_dim.

    `layers` Linear layers in total (layers=1 is logistic regression); every hidden layer has
    hidden_dim units. Parameters: Σ (fan_in + 1)·fan_out over the layers, which is what lesson 01
    predicts by hand.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, layers: int = 2):
        super().__init__()
        for name, value in [("in_dim", in_dim), ("hidden_dim", hidden_dim), ("out_dim", out_dim),
                            ("layers", layers)]:
            checks.positive_int(value, name)
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden_dim, out_dim
        dims = [in_dim] + [hidden_dim] * (layers - 1) + [out_dim]
        modules: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                modules.append(nn.ReLU())  # not in place: the ledger counts saved storages
            modules.append(nn.Linear(fan_in, fan_out))
        self.net = nn.Sequential(*modules)
        self.feature_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        checks.tensor(x, "MLP's input", shape_hint="B×...")
        if x.dim() == 0:
            raise ValueError("MLP expects a batch B×... (or one flat sample), got a scalar tensor")
        x = x.reshape(x.shape[0], -1) if x.dim() > 1 else x.reshape(1, -1)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"MLP was built for inputs with in_dim={self.in_dim} entries per sample, got "
                f"{x.shape[1]}; build MLP(in_dim={x.shape[1]}, ...) or reshape the input"
            )
        return self.net(x)


class ProjectionHead(nn.Module):
    """SimCLR / MoCo v2 projection head: Linear -> [BatchNorm] -> ReLU -> Linear [-> BatchNorm].
    B×in_dim -> B×out_dim.

    The contrastive loss is computed on its output; the encoder's features (its input) are what
    the probes evaluate, as in SimCLR. With batch_norm=True the first Linear has no bias (BN's
    shift replaces it). output_batch_norm=True ends the head in a BatchNorm, as SimSiam's
    projector does (Chen & He 2021, §3: "BN applied to each fully-connected layer, including its
    output fc"); it is off for SimCLR and MoCo.
    """

    def __init__(self, in_dim: int, hidden_dim: int = 512, out_dim: int = 128, batch_norm: bool = True,
                 output_batch_norm: bool = False):
        super().__init__()
        for name, value in [("in_dim", in_dim), ("hidden_dim", hidden_dim), ("out_dim", out_dim)]:
            checks.positive_int(value, name)
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden_dim, out_dim
        layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim, bias=not batch_norm)]
        if batch_norm:
            layers.append(nn.BatchNorm1d(hidden_dim))
        layers += [nn.ReLU(), nn.Linear(hidden_dim, out_dim)]
        if output_batch_norm:
            layers.append(nn.BatchNorm1d(out_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.in_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"ProjectionHead expects features B×{self.in_dim} (the encoder's feature_dim), "
                f"got {shape}"
            )
        return self.net(x)
