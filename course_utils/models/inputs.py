"""The input check the image encoders share: a B×C×H×W batch with the channels they were built for."""
from __future__ import annotations

import torch

from .. import checks


def check_image_batch(x, in_channels: int, who: str) -> torch.Tensor:
    """``x`` is a 4-D tensor B×in_channels×H×W; each error says how to get one."""
    checks.tensor(x, f"{who}'s input", shape_hint=f"B×{in_channels}×H×W")
    if x.dim() != 4:
        raise ValueError(
            f"{who} expects a 4-D batch B×{in_channels}×H×W, got shape {tuple(x.shape)}; "
            "add a batch dimension with x.unsqueeze(0) for a single image"
        )
    if x.shape[1] != in_channels:
        raise ValueError(
            f"{who} was built for {in_channels}-channel images but got {x.shape[1]} channels "
            f"(shape {tuple(x.shape)}); pass in_channels={x.shape[1]} when building it, "
            f"or convert the images to {in_channels} channels"
        )
    return x
