"""Context parallelism: attention over a sequence split across ranks (ring attention, lesson 09).

Each of n ranks holds S/n of the sequence's queries, keys and values. Attention needs every query
against every key, so the key/value blocks travel around a ring (rank r sends to r+1, receives
from r-1) while each rank folds one block at a time into its output with an *online softmax*:

    block b:  s = q kᵦᵀ·scale,  oᵦ = softmax(s) vᵦ,  lseᵦ = logsumexp(s)   (row-wise)
    merge:    lse = logaddexp(lse, lseᵦ),  o = e^(lse_old - lse)·o + e^(lseᵦ - lse)·oᵦ

so the result is softmax over all S keys without any rank holding an S×S score matrix: the
largest score block is (S/2n)², one query chunk against one key chunk. While it computes, a rank
holds its own K/V block (kept for backward) and the visiting one, 2S/n keys: all of them at n = 2,
a shrinking share as n grows (during a pass the outgoing block is briefly alive too). The backward
(FlashAttention's, per block, with D = rowsum(dO ∘ O)):

    P = exp(s - lse),  dV += Pᵀ dO,  dS = P ∘ (dO Vᵀ - D),  dQ += dS K·scale,  dK += dSᵀ Q·scale

runs the ring again: each K/V block travels with its dK/dV accumulator, and after n - 1 hops one
more hop brings the finished dK/dV home. Per rank, for K (and V) blocks of P bytes:

    bytes sent per step = forward 2(n-1)·P + backward (4(n-1) + 2)·P      (``ring_bytes_per_step``)

Kept for backward: this rank's q, k, v, output and lse only (S/n rows each): 1/n of the unsplit.

Causal masking: the sequence is cut into 2n chunks; a (query chunk, key chunk) block is computed
only if key chunk <= query chunk. A contiguous split gives rank r chunks 2r, 2r+1 (the last rank
computes the most blocks); the *zig-zag* split gives rank r chunks r and 2n-1-r, which balances
them (``score_blocks``). Layer math (``block_forward``, ``block_backward``, ``merge``) is apart from
the communication (``ring_pass``); every buffer is made ``empty_like`` the tensors it mirrors, so
it lives on the rank's device and the same code runs on NCCL.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_utils import checks


@dataclass(frozen=True)
class Ring:
    """Where this process sits: rank r of n (n = 1: one process, the unsplit computation)."""
    rank: int = 0
    size: int = 1
    group: object = None

    @classmethod
    def of(cls, group=None) -> "Ring":
        return cls(dist.get_rank(group), dist.get_world_size(group), group)


def chunks_of(rank: int, size: int, zigzag: bool) -> list[int]:
    """The two of 2n sequence chunks rank r holds: (2r, 2r+1), or zig-zag (r, 2n-1-r)."""
    return [rank, 2 * size - 1 - rank] if zigzag else [2 * rank, 2 * rank + 1]


def split_sequence(x: torch.Tensor, ring: Ring, zigzag: bool = False, dim: int = -2) -> torch.Tensor:
    """This rank's part of ``x`` along ``dim`` (its two chunks, concatenated)."""
    checks.tensor(x, "x")
    n_chunks = 2 * ring.size
    if x.shape[dim] % n_chunks:
        raise ValueError(f"sequence length {x.shape[dim]} must divide into 2·ranks = {n_chunks} chunks")
    parts = x.chunk(n_chunks, dim=dim)
    return torch.cat([parts[c] for c in chunks_of(ring.rank, ring.size, zigzag)], dim=dim)


def score_blocks(rank: int, size: int, causal: bool, zigzag: bool) -> int:
    """Chunk-by-chunk score blocks rank r computes in one forward (causal: key chunk <= query chunk)."""
    mine = chunks_of(rank, size, zigzag)
    return sum(1 for q in mine for k in range(2 * size) if not causal or k <= q)


def ring_bytes_per_step(kv_block_bytes: int, size: int) -> int:
    """Bytes one rank sends per training step: forward 2(n-1)·P, backward (4(n-1)+2)·P (n > 1)."""
    return 0 if size == 1 else (6 * (size - 1) + 2) * kv_block_bytes


# ------------------------------------------------------------------------- layer math
def _scores(q, k, scale, diagonal):
    s = q @ k.transpose(-2, -1) * scale
    if diagonal:  # query and key chunk are the same positions: mask the future
        future = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def block_forward(q, k, v, scale: float, diagonal: bool = False):
    """One block: (softmax(q kᵀ·scale) v, row logsumexp). q: (..., Sq, d), k, v: (..., Sk, d)."""
    s = _scores(q, k, scale, diagonal)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(out, lse, block_out, block_lse):
    """Online softmax: fold a block's (output, lse) into the running (output, lse)."""
    new = torch.logaddexp(lse, block_lse)
    return (torch.exp(lse - new).unsqueeze(-1) * out
            + torch.exp(block_lse - new).unsqueeze(-1) * block_out), new


def block_backward(q, k, v, lse, dout, delta, scale: float, diagonal: bool = False):
    """Gradients of one block given the *final* lse and D = rowsum(dO ∘ O): (dq, dk, dv)."""
    p = torch.exp(_scores(q, k, scale, diagonal) - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


# ------------------------------------------------------------------------- communication
def ring_pass(tensors: list[torch.Tensor], ring: Ring) -> list[torch.Tensor]:
    """Send ``tensors`` to rank r+1 and return the same-shaped tensors received from rank r-1."""
    received = [torch.empty_like(t) for t in tensors]
    after, before = (ring.rank + 1) % ring.size, (ring.rank - 1) % ring.size
    if ring.group is not None:  # P2POp takes global ranks
        after, before = (dist.get_global_rank(ring.group, r) for r in (after, before))
    ops = [dist.P2POp(dist.isend, t.contiguous(), after, ring.group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, before, ring.group) for r in received]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


# ------------------------------------------------------------------------- the autograd Function
def _pairs(ring, source, causal, zigzag):
    """(query chunk slot, key chunk slot, diagonal) pairs to compute against ``source``'s block."""
    mine, theirs = chunks_of(ring.rank, ring.size, zigzag), chunks_of(source, ring.size, zigzag)
    return [(i, j, causal and qc == kc) for i, qc in enumerate(mine) for j, kc in enumerate(theirs)
            if not causal or kc <= qc]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, causal, zigzag, counts):
        scale = 1 / math.sqrt(q.shape[-1])
        qs = q.chunk(2, dim=-2)
        out = [torch.zeros_like(c) for c in qs]
        lse = [torch.full(c.shape[:-1], float("-inf"), dtype=c.dtype, device=c.device) for c in qs]
        block_k, block_v = k, v
        for step in range(ring.size):
            source = (ring.rank - step) % ring.size
            ks, vs = block_k.chunk(2, dim=-2), block_v.chunk(2, dim=-2)
            for i, j, diagonal in _pairs(ring, source, causal, zigzag):
                out[i], lse[i] = merge(out[i], lse[i], *block_forward(qs[i], ks[j], vs[j], scale, diagonal))
                counts["forward_blocks"] = counts.get("forward_blocks", 0) + 1
                counts["largest_score_block"] = max(counts.get("largest_score_block", 0),
                                                    qs[i].shape[-2] * ks[j].shape[-2])
            # keys this rank holds now: its own block (kept for backward) and the visiting one
            counts["most_keys_held"] = max(counts.get("most_keys_held", 0),
                                           k.shape[-2] + (block_k.shape[-2] if block_k is not k else 0))
            if step < ring.size - 1:
                block_k, block_v = ring_pass([block_k, block_v], ring)
        out, lse = torch.cat(out, dim=-2), torch.cat(lse, dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.zigzag, ctx.scale = ring, causal, zigzag, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        delta = (dout * out).sum(-1)
        qs, dos = q.chunk(2, dim=-2), dout.chunk(2, dim=-2)
        lses, deltas = lse.chunk(2, dim=-1), delta.chunk(2, dim=-1)
        dq = [torch.zeros_like(c) for c in qs]
        block_k, block_v = k, v
        block_dk, block_dv = torch.zeros_like(k), torch.zeros_like(v)
        for step in range(ring.size):
            source = (ring.rank - step) % ring.size
            ks, vs = block_k.chunk(2, dim=-2), block_v.chunk(2, dim=-2)
            dks, dvs = list(block_dk.chunk(2, dim=-2)), list(block_dv.chunk(2, dim=-2))
            for i, j, diagonal in _pairs(ring, source, ctx.causal, ctx.zigzag):
                dqi, dkj, dvj = block_backward(qs[i], ks[j], vs[j], lses[i], dos[i], deltas[i],
                                               scale, diagonal)
                dq[i], dks[j], dvs[j] = dq[i] + dqi, dks[j] + dkj, dvs[j] + dvj
            block_dk, block_dv = torch.cat(dks, dim=-2), torch.cat(dvs, dim=-2)
            if step < ring.size - 1:  # the block moves on with its gradient accumulator
                block_k, block_v, block_dk, block_dv = ring_pass([block_k, block_v, block_dk, block_dv], ring)
        if ring.size > 1:  # rank r now holds block r+1's finished dK/dV: one more hop home
            block_dk, block_dv = ring_pass([block_dk, block_dv], ring)
        return torch.cat(dq, dim=-2), block_dk, block_dv, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, *,
                   causal: bool = False, zigzag: bool = False, counts: dict | None = None) -> torch.Tensor:
    """softmax(q kᵀ/√d) v over the whole sequence, each rank holding its ``split_sequence`` part.

    q, k, v: (..., S/n, d), this rank's two chunks; returns this rank's (..., S/n, d) output.
    ``counts`` (a dict) receives "forward_blocks": chunk-by-chunk score blocks computed here,
    "largest_score_block": the most scores (query rows × key rows) one of them held, and
    "most_keys_held": the most key rows this rank held at once (its own block and a visiting one).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.tensor(t, name)
    if not (q.shape == k.shape == v.shape) or q.shape[-2] % 2:
        raise ValueError(f"q, k, v must have one shape (..., S/n, d) with S/n even (two chunks), "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    checks.instance(ring, "ring", Ring, what="Ring.of(group) inside a worker, or Ring() for one process")
    return _RingAttention.apply(q, k, v, ring, causal, zigzag, {} if counts is None else counts)
