"""The encoders the lessons train: a CIFAR-style ResNet, a small ViT, an MLP, a projection head.

Every model here is small enough to train on two CPU cores at the lessons' CI/default scales and
plain enough that the ledger (course_utils.ledger) can see every operation:

- ReLUs are *not* in place. The ledger counts tensors saved for backward by storage; an in-place
  ReLU would overwrite a tensor another op saved and hide (or double) a line of the ledger.
- ViT attention is written out as matmul -> softmax -> matmul instead of calling
  F.scaled_dot_product_attention, so FlopCounterMode and saved-tensor hooks see each op
  (the fused kernel would hide the L×L score matrix the lessons want to count).

Initialisation uses only torch's global RNG, so `torch.manual_seed(s)` before construction gives
the same weights on every run and device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BasicBlock",
    "SmallResNet",
    "Attention",
    "FeedForward",
    "TransformerBlock",
    "ViT",
    "sincos_position_embedding_2d",
    "MLP",
    "ProjectionHead",
    "build_encoder",
    "count_parameters",
    "ENCODERS",
]

MIN_RESNET_IMAGE_SIZE = 8  # below this the stride-2 stages leave less than 2×2 pixels to pool


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_image_batch(x, in_channels: int, who: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who} expects a tensor B×{in_channels}×H×W, got {type(x).__name__}")
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


# --------------------------------------------------------------------------------------------
# ResNet
# --------------------------------------------------------------------------------------------


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
        # ReLUs as modules (so ledger.predict_step sees them) and not in place (the ledger
        # counts saved storages; in-place ops would hide one)
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
        _check_positive_int("width", width)
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("num_classes", num_classes, minimum=0)
        blocks = tuple(blocks)
        if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in blocks):
            raise ValueError(
                f"blocks must be a non-empty sequence of positive ints (blocks per stage), "
                f"got {blocks!r}; e.g. blocks=(1, 1, 1) or (2, 2, 2)"
            )
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

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """B×C×H×W -> B×feature_dim (global average of the last stage)."""
        _check_image_batch(x, self.in_channels, "SmallResNet")
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


# --------------------------------------------------------------------------------------------
# ViT
# --------------------------------------------------------------------------------------------


def sincos_position_embedding_2d(grid_size: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding, (grid_size²)×dim, rows in raster order.

    Half of the channels encode the row, half the column; within each half, channel pairs are
    sin(pos·ω_k), cos(pos·ω_k) with ω_k = 10000^(-k / (dim/4)), k = 0..dim/4-1 (as in MAE).
    """
    if dim % 4 != 0:
        raise ValueError(f"2-D sin-cos position embedding needs dim divisible by 4, got dim={dim}")
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # dim/4
    coords = torch.arange(grid_size, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # grid×grid each

    def encode(pos: torch.Tensor) -> torch.Tensor:  # L -> L×dim/2
        angles = pos.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([encode(rows), encode(cols)], dim=1).float()  # L×dim


class Attention(nn.Module):
    """Multi-head self-attention written out op by op.

    x: B×L×D. q, k, v: B×H×L×d with d = D/H. scores = q @ kᵀ / √d (B×H×L×L),
    attn = softmax(scores), out = attn @ v, heads concatenated and projected back to D.
    Explicit matmuls (not F.scaled_dot_product_attention) so FlopCounterMode counts the two
    L×L matmuls and saved-tensor hooks see the L×L attention matrix kept for backward.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # B×H×L×d each
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # B×H×L×L
        attn = scores.softmax(dim=-1)
        out = attn @ v  # B×H×L×d
        out = out.transpose(1, 2).reshape(b, n, d)  # B×L×D
        return self.proj(out)


class FeedForward(nn.Module):
    """The transformer MLP: Linear(D, r·D) -> GELU -> Linear(r·D, D) on each token."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x = x + attn(norm1(x)); x = x + mlp(norm2(x)). B×L×D -> B×L×D."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 2):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small pre-norm Vision Transformer without a class token (features = mean of tokens).

    Image B×C×H×W (H = W = image_size) -> patches B×L×(p²C) with L = (image_size/p)²
    -> linear patch embedding + fixed 2-D sin-cos position (B×L×D) -> `depth` blocks -> LayerNorm
    -> mean over tokens (B×D) -> optional linear head.

    The pieces are exposed separately because MAE runs them separately: embed all patches,
    drop the masked ones, and call `encode_tokens` on the visible ones only. The position
    embedding is a buffer, added before masking, so a token keeps its position when others go.
    """

    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 4,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 2,
        in_channels: int = 3,
        num_classes: int = 0,
    ):
        super().__init__()
        for name, value in [("image_size", image_size), ("patch_size", patch_size), ("dim", dim),
                            ("depth", depth), ("heads", heads), ("in_channels", in_channels)]:
            _check_positive_int(name, value)
        _check_positive_int("num_classes", num_classes, minimum=0)
        if image_size % patch_size != 0:
            divisors = [p for p in range(1, image_size + 1) if image_size % p == 0]
            raise ValueError(
                f"image_size={image_size} is not divisible by patch_size={patch_size}; "
                f"pass a patch_size that divides it ({divisors}) or resize the images"
            )
        if dim % heads != 0:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}; e.g. heads=4, dim=64")
        if dim % 4 != 0:
            raise ValueError(f"dim={dim} must be divisible by 4 for the 2-D sin-cos position embedding")
        if not mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio}")

        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.dim, self.depth, self.heads, self.num_classes = dim, depth, heads, num_classes
        self.grid_size = image_size // patch_size
        self.num_patches = self.grid_size**2
        self.patch_dim = patch_size * patch_size * in_channels
        self.feature_dim = dim

        self.patch_embed = nn.Linear(self.patch_dim, dim)
        # Fixed, not learned; not in the state dict because it is a function of the config.
        self.register_buffer(
            "pos_embed", sincos_position_embedding_2d(self.grid_size, dim).unsqueeze(0),
            persistent=False,
        )  # 1×L×D
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 else None
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _check_images(self, x: torch.Tensor) -> None:
        _check_image_batch(x, self.in_channels, "ViT")
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"this ViT was built for {self.image_size}×{self.image_size} images but got "
                f"{x.shape[-2]}×{x.shape[-1]}; resize the images or build ViT(image_size="
                f"{x.shape[-1]}, ...) with a patch_size that divides it"
            )

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """B×C×H×W -> B×L×(p·p·C); patch (i, j) in raster order, pixels row-major, channel last."""
        self._check_images(x)
        b, c, p, g = x.shape[0], self.in_channels, self.patch_size, self.grid_size
        x = x.reshape(b, c, g, p, g, p)  # B×C×gh×p×gw×p
        x = x.permute(0, 2, 4, 3, 5, 1)  # B×gh×gw×p×p×C
        return x.reshape(b, g * g, p * p * c)

    def unpatchify(self, patches: torch.Tensor) -> torch.Tensor:
        """Exact inverse of patchify: B×L×(p·p·C) -> B×C×H×W."""
        if not isinstance(patches, torch.Tensor) or patches.dim() != 3 or tuple(
            patches.shape[1:]
        ) != (self.num_patches, self.patch_dim):
            shape = tuple(patches.shape) if isinstance(patches, torch.Tensor) else type(patches)
            raise ValueError(
                f"unpatchify expects B×{self.num_patches}×{self.patch_dim} patches "
                f"(L=(image_size/patch_size)², p²·C), got {shape}"
            )
        b, c, p, g = patches.shape[0], self.in_channels, self.patch_size, self.grid_size
        x = patches.reshape(b, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4)  # B×C×gh×p×gw×p
        return x.reshape(b, c, g * p, g * p)

    def embed_patches(self, x: torch.Tensor) -> torch.Tensor:
        """B×C×H×W -> B×L×D tokens: linear embedding of each patch plus its position."""
        return self.patch_embed(self.patchify(x)) + self.pos_embed

    def encode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Transformer blocks + final LayerNorm on any set of tokens: B×L'×D -> B×L'×D.

        L' may be smaller than num_patches (MAE passes only the visible tokens); positions must
        already be added (embed_patches does that), since attention itself is order-free.
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 3 or tokens.shape[-1] != self.dim:
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens)
            raise ValueError(
                f"encode_tokens expects tokens B×L'×{self.dim} (from embed_patches, possibly a "
                f"subset of the L={self.num_patches} positions), got {shape}"
            )
        if tokens.shape[1] == 0:
            raise ValueError("encode_tokens got zero tokens; keep at least one visible token")
        for block in self.blocks:
            tokens = block(tokens)
        return self.norm(tokens)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """B×C×H×W -> B×D: mean over the encoded tokens."""
        return self.encode_tokens(self.embed_patches(x)).mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.features(x)
        return self.head(feats) if self.head is not None else feats


# --------------------------------------------------------------------------------------------
# MLP and projection head
# --------------------------------------------------------------------------------------------


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
            _check_positive_int(name, value)
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden_dim, out_dim
        dims = [in_dim] + [hidden_dim] * (layers - 1) + [out_dim]
        modules: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                modules.append(nn.ReLU())  # not in place
            modules.append(nn.Linear(fan_in, fan_out))
        self.net = nn.Sequential(*modules)
        self.feature_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MLP expects a tensor B×..., got {type(x).__name__}")
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
    """SimCLR / MoCo v2 projection head: Linear -> [BatchNorm] -> ReLU -> Linear. B×in_dim -> B×out_dim.

    The contrastive loss is computed on its output; the encoder's features (its input) are what
    the probes evaluate, as in SimCLR. With batch_norm=True the first Linear has no bias (BN's
    shift replaces it).
    """

    def __init__(self, in_dim: int, hidden_dim: int = 512, out_dim: int = 128, batch_norm: bool = True):
        super().__init__()
        for name, value in [("in_dim", in_dim), ("hidden_dim", hidden_dim), ("out_dim", out_dim)]:
            _check_positive_int(name, value)
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden_dim, out_dim
        layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim, bias=not batch_norm)]
        if batch_norm:
            layers.append(nn.BatchNorm1d(hidden_dim))
        layers += [nn.ReLU(), nn.Linear(hidden_dim, out_dim)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.in_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"ProjectionHead expects features B×{self.in_dim} (the encoder's feature_dim), "
                f"got {shape}"
            )
        return self.net(x)


# --------------------------------------------------------------------------------------------
# Factory and counting
# --------------------------------------------------------------------------------------------

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
    _check_positive_int("image_size", image_size)
    _check_positive_int("in_channels", in_channels)
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
    if not isinstance(module, nn.Module):
        raise TypeError(f"count_parameters expects an nn.Module, got {type(module).__name__}")
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
