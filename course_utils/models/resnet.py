"""A CIFAR-style ResNet (3×3 stem, no max-pool, stages of BasicBlocks, global average pool).

32×32 input, three stages, width w: 32 -> 16 -> 8 pixels, features B×4w. ReLUs are modules (so
``ledger.predict_step`` sees them) and not in place: the ledger counts tensors saved for backward
by storage, and an in-place ReLU would overwrite a tensor another op saved.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .. import checks
from .inputs import check_image_batch

MIN_RESNET_IMAGE_SIZE = 8  # below this the stride-2 stages leave less than 2×2 pixels to pool


class BasicBlock(nn.Module):
    """Two 3×3 convs with a residual: y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).

    x: B×in_ch×H×W -> B×out_ch×(H/stride)×(W/stride). The shortcut is the identity, or a
    1×1 conv + BN when the stride or the channel count changes (ResNet "option B").
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """CIFAR-style ResNet: 3×3 stem (no max-pool), stages of BasicBlocks, global average pool.

    Stage i has width `width * 2**i` and `blocks[i]` blocks; every stage after the first starts
    with stride 2. With the default three stages a 32×32 image becomes 32 -> 16 -> 8 pixels and
    the feature vector has `feature_dim = 4 * width` entries.

    forward(x): B×C×H×W -> B×feature_dim features, or B×num_classes logits if num_classes > 0.
    features(x) always returns the pooled features. Any H, W >= 8 works (the pool is global).
    """

    def __init__(
        self,
        width: int = 16,
        blocks: Sequence[int] = (1, 1, 1),
        in_channels: int = 3,
        num_classes: int = 0,
    ):
        super().__init__()
        checks.positive_int(width, "width")
        checks.positive_int(in_channels, "in_channels")
        checks.positive_int(num_classes, "num_classes", minimum=0)
        hint = "blocks per stage, e.g. blocks=(1, 1, 1) or (2, 2, 2)"
        if isinstance(blocks, int):
            raise TypeError(f"blocks must be a sequence of positive ints ({hint}), got the int {blocks}")
        blocks = tuple(blocks)
        if not blocks:
            raise ValueError(f"blocks must be a non-empty sequence of positive ints ({hint}), got ()")
        for i, n_blocks in enumerate(blocks):
            checks.positive_int(n_blocks, f"blocks[{i}]", hint=hint)
        self.width, self.blocks, self.in_channels = width, blocks, in_channels
        self.num_classes = num_classes

        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),  # inplace=False on purpose
        )
        stages, in_ch = [], width
        for i, n_blocks in enumerate(blocks):
            out_ch = width * 2**i
            stride = 1 if i == 0 else 2
            layers = [BasicBlock(in_ch, out_ch, stride)]
            layers += [BasicBlock(out_ch, out_ch, 1) for _ in range(n_blocks - 1)]
            stages.append(nn.Sequential(*layers))
            in_ch = out_ch
        self.stages = nn.Sequential(*stages)
        self.feature_dim = in_ch
        self.head = nn.Linear(in_ch, num_classes) if num_classes > 0 else None
        self._init_weights()
        # The convolution weights are stored channels-last (N×H×W×C in memory), so every conv and
        # BatchNorm runs in that layout: about 20% faster training steps on CPU (oneDNN) at the
        # lessons' sizes, and the layout GPUs' tensor cores prefer. Shapes and byte counts are
        # unchanged; `.to(device)`, `load_state_dict` and `copy.deepcopy` keep the layout.
        nn.utils.convert_conv2d_weight_memory_format(self, torch.channels_last)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """B×C×H×W -> B×feature_dim (global average of the last stage)."""
        check_image_batch(x, self.in_channels, "SmallResNet")
        h, w = x.shape[-2:]
        if min(h, w) < MIN_RESNET_IMAGE_SIZE:
            raise ValueError(
                f"SmallResNet takes images of at least {MIN_RESNET_IMAGE_SIZE}×"
                f"{MIN_RESNET_IMAGE_SIZE} pixels, got {h}×{w}; resize the images "
                f"(e.g. load_dataset(..., image_size=32))"
            )
        x = self.stages(self.stem(x))  # B×feature_dim×H'×W'
        return x.mean(dim=(2, 3))  # B×feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.features(x)
        return self.head(feats) if self.head is not None else feats
