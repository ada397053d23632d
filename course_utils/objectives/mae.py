"""MAE: masked autoencoding where the heavy encoder sees only the visible patches.

An image is cut into L patches (B×L×p²C) and embedded with positions (B×L×D). Per sample, a
random fraction r of the tokens is removed (argsort of uniform noise, as in the MAE reference):

    visible   = tokens[ids_keep]                        B×L_vis×D,  L_vis = int(L·(1−r))
    latent    = encoder(visible)                        B×L_vis×D   (the expensive part: ∝ L_vis)
    full      = unshuffle([embed(latent), mask_token × (L − L_vis)], ids_restore) + pos_dec
    pred      = decoder(full)                           B×L×p²C     (light: few, narrow blocks)
    loss      = Σ_l mask_l · mean_c (pred_lc − target_lc)² / Σ_l mask_l    (masked patches only)

target = the patch pixels, optionally normalised per patch (norm_pix_loss: subtract the patch
mean, divide by its std, as in the paper). Because the encoder's blocks run on L_vis tokens,
their cost falls to about (1 − r) of full encoding (a bit less: attention is quadratic in
tokens); the variant `mask_tokens_in_encoder=True` puts the mask tokens through the encoder
(SimMIM-style) and pays for all L tokens. That pair is lesson 04's comparison of FLOPs, step
time and bytes kept for backward. `interpolate_masked` fills masked patches from the visible
pixels with no learning (inverse-distance or nearest pixel): the baseline a reconstruction must beat.

Shapes: tokens B×L×D; mask B×L (1 = removed, original order); ids_restore B×L (int64).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from course_utils.models import TransformerBlock, sincos_position_embedding_2d

from .. import checks
from .base import Objective, as_batch


def random_masking(tokens: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None):
    """Per-sample random masking by argsort of uniform noise (MAE reference semantics).

    tokens: B×L×D. Returns
      visible      B×int(L·(1−mask_ratio))×D  the kept tokens (in noise order, not sorted)
      mask         B×L float, 1 = removed, 0 = kept, in the original token order
      ids_restore  B×L int64: torch.gather(cat([visible, mask_tokens], 1), 1, ids_restore)
                   puts every token back at its original position.
    The noise is drawn on the generator's device (CPU by default) and moved, so the same seed
    gives the same mask on CPU and CUDA.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 3:
        raise ValueError(f"tokens must be B×L×D, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}; "
                         "embed the patches first (ViT.embed_patches)")
    b, length, dim = tokens.shape
    len_keep = _len_keep(length, mask_ratio)
    mask, ids_restore, ids_keep = _draw_mask(tokens, len_keep, generator)
    visible = torch.gather(tokens, 1, ids_keep.unsqueeze(-1).expand(-1, -1, dim))
    return visible, mask, ids_restore


def _len_keep(length: int, mask_ratio: float) -> int:
    mask_ratio = checks.fraction(mask_ratio, "mask_ratio", hint="MAE uses 0.75")
    len_keep = int(length * (1 - mask_ratio))
    if len_keep < 1:
        raise ValueError(f"mask_ratio={mask_ratio} keeps int({length}·(1−{mask_ratio})) = 0 of "
                         f"{length} tokens; lower the ratio so at least one token stays visible")
    return len_keep


def _draw_mask(tokens: torch.Tensor, len_keep: int, generator: torch.Generator | None):
    """The mask half of ``random_masking`` (same noise, same mask) without gathering the visible
    tokens: → (mask B×L, ids_restore B×L, ids_keep B×L_vis)."""
    b, length = tokens.shape[:2]
    noise_device = generator.device if generator is not None else tokens.device
    noise = torch.rand(b, length, generator=generator, device=noise_device).to(tokens.device)
    ids_shuffle = torch.argsort(noise, dim=1)              # ascending: small noise is kept
    ids_restore = torch.argsort(ids_shuffle, dim=1)        # inverse permutation
    ids_keep = ids_shuffle[:, :len_keep]                   # B×L_vis
    mask = torch.ones(b, length, device=tokens.device, dtype=tokens.dtype)
    mask[:, :len_keep] = 0                                 # in shuffled order ...
    mask = torch.gather(mask, 1, ids_restore)              # ... back to the original order
    return mask, ids_restore, ids_keep


def restore_order(tokens: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
    """B×L×D tokens in shuffled order (visible first) → original order."""
    return torch.gather(tokens, 1, ids_restore.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


def patch_targets(patches: torch.Tensor, norm_pix_loss: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """B×L×P pixel patches → regression targets (per-patch standardised when norm_pix_loss)."""
    if not norm_pix_loss:
        return patches
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + eps).sqrt()


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the masked patches only. pred, target B×L×P; mask B×L (1 = masked)."""
    if pred.shape != target.shape or pred.shape[:2] != mask.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} must be B×L×P "
                         f"and mask {tuple(mask.shape)} must be B×L")
    per_patch = ((pred - target) ** 2).mean(dim=-1)        # B×L
    return (per_patch * mask).sum() / mask.sum().clamp_min(1)


def interpolate_masked(images: torch.Tensor, mask: torch.Tensor, patch_size: int, *,
                       method: str = "idw", power: float = 2.0) -> torch.Tensor:
    """Fill the masked patches of ``images`` from the visible pixels alone: a baseline with no
    learning, to set beside an MAE's reconstruction.

    images B×C×H×W; mask B×L (1 = removed, raster order of the (H/p)×(W/p) patch grid, as
    ``random_masking`` returns it). Every masked pixel i gets Σ_j w_ij x_j / Σ_j w_ij over the
    visible pixels j, with
      method="idw":     w_ij = 1 / d_ij**power  (Shepard's inverse-distance interpolation)
      method="nearest": all weight on the nearest visible pixel (ties: the first in raster order)
    where d_ij is the Euclidean distance between pixel centres. Visible pixels are returned
    unchanged. Memory is B×(H·W)×(H·W): meant for small images (32×32: 4 MB per image).
    """
    checks.tensor(images, "images", shape_hint="B×C×H×W")
    checks.choice(method, "method", ("idw", "nearest"))
    checks.positive_float(power, "power")
    if images.dim() != 4:
        raise ValueError(f"images must be B×C×H×W, got {tuple(images.shape)}")
    b, c, h, w = images.shape
    patch_size = checks.positive_int(patch_size, "patch_size")
    if h % patch_size or w % patch_size:
        raise ValueError(f"patch_size={patch_size} must divide the image size {h}×{w}")
    gh, gw = h // patch_size, w // patch_size
    if tuple(mask.shape) != (b, gh * gw):
        raise ValueError(f"mask must be B×L = {b}×{gh * gw} for {h}×{w} images and patch_size="
                         f"{patch_size}, got {tuple(mask.shape)}")
    removed = (mask.reshape(b, gh, 1, gw, 1).expand(b, gh, patch_size, gw, patch_size)
               .reshape(b, h * w) > 0.5)                              # B×HW, True = masked pixel
    if removed.all(dim=1).any():
        raise ValueError("every patch of an image is masked: nothing to interpolate from")
    ys, xs = torch.meshgrid(torch.arange(h, device=images.device, dtype=images.dtype),
                            torch.arange(w, device=images.device, dtype=images.dtype), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()], dim=1)         # HW×2
    dist = torch.cdist(coords, coords, compute_mode="donot_use_mm_for_euclid_dist")   # HW×HW, exact
    visible = (~removed).to(images.dtype).unsqueeze(1)                # B×1×HW (source j)
    if method == "nearest":
        far = dist.max() + 1
        nearest = (dist.unsqueeze(0) + far * (1 - visible)).argmin(dim=2)    # B×HW
        weights = torch.nn.functional.one_hot(nearest, h * w).to(images.dtype)
    else:
        weights = visible / dist.clamp_min(1e-12).pow(power).unsqueeze(0)   # B×HW×HW
        weights = weights / weights.sum(dim=2, keepdim=True)
    flat = images.reshape(b, c, h * w)
    filled = torch.einsum("bij,bcj->bci", weights, flat)              # B×C×HW
    out = torch.where(removed.unsqueeze(1), filled, flat)
    return out.reshape(b, c, h, w)


class MAEDecoder(nn.Module):
    """Light decoder: embed latents to decoder_dim, insert mask tokens, restore order, add fixed
    positions, `depth` transformer blocks, predict p²C pixels per patch. → B×L×P."""

    def __init__(self, encoder_dim: int, num_patches: int, grid_size: int, patch_dim: int,
                 dim: int = 64, depth: int = 1, heads: int = 4, mlp_ratio: float = 2):
        super().__init__()
        self.num_patches = num_patches
        self.embed = nn.Linear(encoder_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.normal_(self.mask_token, std=0.02)
        self.register_buffer("pos_embed", sincos_position_embedding_2d(grid_size, dim).unsqueeze(0),
                             persistent=False)           # 1×L×dim
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.pred = nn.Linear(dim, patch_dim)

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor | None) -> torch.Tensor:
        x = self.embed(latent)                              # B×L_vis×dim (or B×L×dim)
        if ids_restore is not None:                         # visible-only encoder: fill the gaps
            b, n_vis, dim = x.shape
            fill = self.mask_token.expand(b, self.num_patches - n_vis, dim)
            x = restore_order(torch.cat([x, fill], dim=1), ids_restore)   # B×L×dim
        x = x + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.pred(self.norm(x))                      # B×L×P


class MAE(Objective):
    """Masked autoencoder around the kit's ViT (formula in the module docstring).

    encoder: a course_utils.models.ViT (uses .embed_patches, .encode_tokens, .patchify).
    forward_encoder(images) → (latent, mask, ids_restore); forward_decoder(latent, ids_restore)
    → pred B×L×P; forward_loss(images, pred, mask) → scalar (the reference's three parts).
    forward(images, generator=None) → (loss, pred, mask);
    training_loss(batch, augment=None, generator=None) → {"loss", "pred", "mask"}.
    mask_tokens_in_encoder=True: the encoder runs on all L tokens, masked ones replaced by a
    learned mask token plus their position (same loss and decoder; for the speed comparison).
    decoder_mlp_ratio: the decoder blocks' MLP width over decoder_dim (the lessons' small
    decoders use 2; the paper's 8×512 decoder uses 4).
    """

    def __init__(self, encoder: nn.Module, mask_ratio: float = 0.75, decoder_dim: int = 64,
                 decoder_depth: int = 1, decoder_heads: int = 4, norm_pix_loss: bool = False,
                 mask_tokens_in_encoder: bool = False, decoder_mlp_ratio: float = 2):
        super().__init__()
        for attr in ("embed_patches", "encode_tokens", "patchify", "num_patches", "pos_embed"):
            if not hasattr(encoder, attr):
                raise TypeError(f"encoder must be a course_utils.models.ViT (missing .{attr}), "
                                f"got {type(encoder).__name__}")
        self.encoder = encoder
        self.mask_ratio = checks.fraction(mask_ratio, "mask_ratio", hint="MAE uses 0.75")
        self.norm_pix_loss = bool(norm_pix_loss)
        self.mask_tokens_in_encoder = bool(mask_tokens_in_encoder)
        self.decoder = MAEDecoder(encoder.dim, encoder.num_patches, encoder.grid_size,
                                  encoder.patch_dim, decoder_dim, decoder_depth, decoder_heads,
                                  decoder_mlp_ratio)
        if self.mask_tokens_in_encoder:
            self.encoder_mask_token = nn.Parameter(torch.zeros(1, 1, encoder.dim))
            nn.init.normal_(self.encoder_mask_token, std=0.02)

    @contextlib.contextmanager
    def masked_at(self, mask_ratio: float):
        """Run the model at another mask ratio inside the ``with`` block (e.g. to evaluate a model
        trained at 0.75 at 0.5), then put its own ratio back, also when the block raises."""
        own = self.mask_ratio
        self.mask_ratio = checks.fraction(mask_ratio, "mask_ratio", hint="MAE uses 0.75")
        try:
            yield self
        finally:
            self.mask_ratio = own

    @property
    def ledger_encoders(self) -> dict:
        # tokens entering the first block of each: the encoder sees B·L_vis per step (B·L with
        # mask tokens inside), the decoder always B·L
        return {"encoder tokens": self.encoder.blocks[0], "decoder tokens": self.decoder.blocks[0]}

    def forward_encoder(self, images: torch.Tensor, generator: torch.Generator | None = None):
        """→ (latent, mask, ids_restore). latent is B×L_vis×D, or B×L×D with
        mask_tokens_in_encoder (then ids_restore is None: tokens never left their places)."""
        tokens = self.encoder.embed_patches(images)         # B×L×D, positions added
        if not self.mask_tokens_in_encoder:
            visible, mask, ids_restore = random_masking(tokens, self.mask_ratio, generator)
            return self.encoder.encode_tokens(visible), mask, ids_restore
        # same noise and mask as random_masking, without gathering visible tokens this arm never
        # uses (so the encoder's measured bytes hold only what the encoder itself keeps)
        mask, _, _ = _draw_mask(tokens, _len_keep(tokens.shape[1], self.mask_ratio), generator)
        m = mask.unsqueeze(-1)                              # B×L×1
        filler = self.encoder_mask_token + self.encoder.pos_embed      # 1×L×D: token + position
        tokens = tokens * (1 - m) + filler * m              # masked content replaced
        return self.encoder.encode_tokens(tokens), mask, None

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor | None) -> torch.Tensor:
        """latent B×L_vis×D (or B×L×D) → pred B×L×P."""
        return self.decoder(latent, ids_restore)

    def forward_loss(self, images: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked MSE against the (optionally per-patch normalised) pixels of ``images``."""
        target = patch_targets(self.encoder.patchify(images), self.norm_pix_loss)
        return masked_mse(pred, target, mask)

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None):
        latent, mask, ids_restore = self.forward_encoder(images, generator)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(images, pred, mask), pred, mask

    def training_loss(self, batch, *, augment=None, generator=None) -> dict:
        images = as_batch(batch).images
        if augment is not None:
            images = augment(images, generator)
        loss, pred, mask = self(images, generator)
        return {"loss": loss, "pred": pred, "mask": mask}

    @torch.no_grad()
    def reconstruct(self, images: torch.Tensor, generator: torch.Generator | None = None):
        """→ (masked input, reconstruction with visible patches pasted back, mask) as images.
        With norm_pix_loss the predictions are de-normalised with each patch's own statistics."""
        _, pred, mask = self(images, generator)
        patches = self.encoder.patchify(images)
        if self.norm_pix_loss:
            mean, std = patches.mean(-1, keepdim=True), (patches.var(-1, keepdim=True) + 1e-6).sqrt()
            pred = pred * std + mean
        m = mask.unsqueeze(-1)
        masked = self.encoder.unpatchify(patches * (1 - m) + 0.5 * m)  # grey where removed
        pasted = self.encoder.unpatchify(patches * (1 - m) + pred * m)
        return masked, pasted.clamp(0, 1), mask
