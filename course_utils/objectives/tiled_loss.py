"""NT-Xent in tiles: the loss of ``simclr.nt_xent_loss`` without keeping the 2N×2N similarity matrix.

The plain loss builds logits L = Z Cᵀ / T (Z: the 2N normalised anchors, C = [Z; negatives]: the
2N + M candidates) and autograd keeps the log-softmax of L (and the boolean mask of the anchors'
own entries) for backward: 2N·(2N+M) floats, the one line of SimCLR's ledger that grows as N².
Written per anchor i,

    loss = (1/2N) Σ_i [ lse_i − z_i·z_p(i) / T ],     lse_i = log Σ_{j≠i} exp(z_i·c_j / T)

and the gradient of Σ_i lse_i needs only the softmax P_ij = exp(z_i·c_j / T − lse_i):

    ∂/∂z_i (as anchor)    = Σ_j P_ij c_j / T            (rows of P C / T)
    ∂/∂c_j (as candidate) = Σ_i P_ij z_i / T            (rows of Pᵀ Z / T)

so ``_TiledLogSumExp`` keeps Z, the negatives and the 2N values lse_i (O(N·d)), and recomputes each
block of ``tile`` rows of L in backward, as FlashAttention recomputes attention and Inf-CL (2024)
recomputes the contrastive matrix. Memory kept for backward: O(N·d); transient: tile×(2N+M);
price: the similarity matmul is done twice. The positive term z_i·z_p(i) is O(N·d) and left to
autograd. Written by hand because no library ships it for this loss; same value and gradients as
the plain loss (tested in fp64).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class _TiledLogSumExp(torch.autograd.Function):
    """Σ_i logsumexp_{j≠i}(z_i·c_j / T) over anchors z (2N×d), candidates c = [z; negatives]."""

    @staticmethod
    def forward(ctx, z, negatives, temperature: float, tile: int):
        candidates = torch.cat([z, negatives])                       # (2N+M)×d
        lse = torch.cat([_logits_block(z, candidates, start, tile, temperature).logsumexp(1)
                         for start in range(0, z.shape[0], tile)])    # 2N
        ctx.save_for_backward(z, negatives, lse)
        ctx.temperature, ctx.tile = temperature, tile
        return lse.sum()

    @staticmethod
    def backward(ctx, grad_output):
        z, negatives, lse = ctx.saved_tensors
        temperature, tile = ctx.temperature, ctx.tile
        candidates = torch.cat([z, negatives])
        grad_anchor = torch.zeros_like(z)
        grad_candidate = torch.zeros_like(candidates)
        for start in range(0, z.shape[0], tile):
            rows = slice(start, min(start + tile, z.shape[0]))
            probs = (_logits_block(z, candidates, start, tile, temperature) - lse[rows, None]).exp()
            grad_anchor[rows] = probs @ candidates / temperature
            grad_candidate += probs.t() @ z[rows] / temperature
        n2 = z.shape[0]
        grad_z = (grad_anchor + grad_candidate[:n2]) * grad_output
        return grad_z, grad_candidate[n2:] * grad_output, None, None


def _logits_block(z, candidates, start: int, tile: int, temperature: float) -> torch.Tensor:
    """Rows start..start+tile of Z Cᵀ / T with each anchor's own column set to −inf."""
    block = z[start:start + tile] @ candidates.t() / temperature     # tile×(2N+M)
    rows = torch.arange(block.shape[0], device=z.device)
    return block.index_put((rows, rows + start), torch.tensor(float("-inf"), device=z.device,
                                                                dtype=block.dtype))


def tiled_nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float, tile: int,
                  extra_negatives: torch.Tensor | None) -> torch.Tensor:
    """The tiled loss on checked inputs (``simclr.nt_xent_loss_tiled`` checks them)."""
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)                       # 2N×d
    negatives = (F.normalize(extra_negatives.to(z.dtype), dim=1) if extra_negatives is not None
                 else z.new_zeros(0, z.shape[1]))
    positives = (z[:n] * z[n:]).sum(1) / temperature                  # N: s(i, p(i)) / T, both views
    return (_TiledLogSumExp.apply(z, negatives, temperature, tile) - 2 * positives.sum()) / (2 * n)
