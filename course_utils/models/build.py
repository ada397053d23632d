"""Building the lessons' encoders by name, counting and cloning them (re-exported by
``course_utils.models``).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .. import checks
from .resnet import MIN_RESNET_IMAGE_SIZE, SmallResNet
from .vit import ViT

ENCODERS = ("resnet", "resnet18", "vit")
# The CIFAR ResNet-18 of the SSL literature (3×3 stem, no max-pool, 64-128-256-512, two blocks
# per stage): 11.17 M parameters without a classifier, 512 features.
RESNET18 = dict(width=64, blocks=(2, 2, 2, 2))


def build_encoder(name: str, image_size: int, in_channels: int = 3, **kwargs) -> nn.Module:
    """Build an encoder (num_classes=0 unless given) for images of `image_size` px.

    name="resnet" -> SmallResNet(in_channels=..., **kwargs) (any image_size >= 8).
    name="resnet18" -> SmallResNet(width=64, blocks=(2, 2, 2, 2)): the CIFAR ResNet-18 of the
                     SSL literature (the gpu presets); kwargs may set num_classes.
    name="vit"    -> ViT(image_size=..., in_channels=..., **kwargs); patch_size defaults to
                     image_size // 8 (an 8×8 grid, 64 tokens) when that divides image_size.
    """
    if not isinstance(name, str) or name.lower() not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}; pass one of {list(ENCODERS)}")
    checks.positive_int(image_size, "image_size")
    checks.positive_int(in_channels, "in_channels")
    name = name.lower()
    if name == "resnet18":
        clash = set(kwargs) & set(RESNET18)
        if clash:
            raise ValueError(f"resnet18 fixes {sorted(clash)}; use name='resnet' to choose them")
        kwargs = {**RESNET18, **kwargs}
        name = "resnet"
    if name == "resnet":
        if image_size < MIN_RESNET_IMAGE_SIZE:
            raise ValueError(
                f"SmallResNet needs image_size >= {MIN_RESNET_IMAGE_SIZE}, got {image_size}"
            )
        return SmallResNet(in_channels=in_channels, **kwargs)
    if "patch_size" not in kwargs:
        if image_size % 8 != 0:
            raise ValueError(
                f"no default patch_size for image_size={image_size} (not a multiple of 8); "
                "pass patch_size=... that divides image_size"
            )
        kwargs["patch_size"] = image_size // 8
    return ViT(image_size=image_size, in_channels=in_channels, **kwargs)


def count_parameters(module: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameter entries (buffers such as BN running stats and ViT positions excluded)."""
    checks.instance(module, "module", nn.Module, what="an nn.Module")
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def clone_module(module: nn.Module) -> nn.Module:
    """An independent copy of ``module`` (``copy.deepcopy``), whose parameters and buffers are
    cloned tensor by tensor: that also works on fake tensors (course_utils.ledger.fake_mode), which
    ``deepcopy`` cannot copy because it clones raw storages."""
    checks.instance(module, "module", nn.Module)
    memo = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b.detach().clone()
    with torch.no_grad():
        return copy.deepcopy(module, memo)
