"""A small pre-norm Vision Transformer, its blocks, and the 2-D sin-cos position embedding.

Image B×C×H×W -> patches B×L×(p²C), L = (H/p)² -> tokens B×L×D -> blocks -> mean over tokens B×D.

Attention is written by hand (matmul -> softmax -> matmul), not ``F.scaled_dot_product_attention``
or ``nn.MultiheadAttention``: a fused kernel hides the B×H×L×L score matrix from ``FlopCounterMode``
and from the saved-tensor hooks the ledger uses, and lesson 04 counts exactly those two L×L matmuls
(4·L²·D FLOPs per block) and that matrix when it shows why visible-only encoding pays.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import checks
from .inputs import check_image_batch


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
        # None: softmax in the scores' dtype (bf16 under CPU autocast); torch.float32: in fp32,
        # as CUDA autocast runs it (the planner sets this: experiments.planning.softmax_as_on_cuda)
        self.softmax_dtype = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # B×H×L×d each
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # B×H×L×L
        attn = scores.softmax(dim=-1, dtype=self.softmax_dtype)
        out = attn.to(v.dtype) @ v  # B×H×L×d
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
            checks.positive_int(value, name)
        checks.positive_int(num_classes, "num_classes", minimum=0)
        checks.positive_float(mlp_ratio, "mlp_ratio")
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
        check_image_batch(x, self.in_channels, "ViT")
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
