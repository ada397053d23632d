"""A Llama-3-shaped decoder, built as TorchTitan built it when it published its memory figures
(commit 9dec370, December 2024), so that the kit's plan of a Llama run can be checked against
a published measurement (lesson 11, ``experiments.published``).

What differs from ``TinyGPT`` (GPT-2's shape), each as TorchTitan writes it:

- RMSNorm, computed in fp32 (``x.float()``) and cast back, then scaled by its weight;
- rotary position embeddings (RoPE, θ = 500,000) applied to q and k as complex products
  (``freqs_cis``: complex64, s×d/2, a buffer), no position embedding table;
- grouped-query attention: ``kv_heads`` key/value heads, each repeated ``heads / kv_heads`` times
  (``repeat_kv``: a copy) before torch's fused ``scaled_dot_product_attention``;
- SwiGLU MLP: w2(silu(w1 x) · w3 x), width ``ffn``; no biases anywhere;
- an output layer of its own (not tied to the embedding), and a loss on fp32 logits
  (``cross_entropy(logits.float(), targets)``).

Shapes: b = batch, s = sequence, h = hidden, a = heads, g = kv_heads, d = h / a, f = ffn, v = vocab.
Parameters: 2·v·h (embedding, output) + L·(2h² + 2·g·d·h + 3·h·f + 2h) + h (``llama_param_count``).

Recomputation (``recompute=``): ``"none"``; ``"full"`` (each block checkpointed: only its input
kept); ``"op-selective"``, TorchTitan's selective *op* checkpointing (``op_selective_context``):
inside each checkpointed block the outputs of the attention kernel and of every matmul except
every second one (4 of the block's 7: wq, wv, w1, w2) are kept, everything else (norms, RoPE, the
repeated k and v, SiLU, products) is recomputed in backward. Per block that keeps
2·b·s·(4h + g·d + f) bytes in bf16 (the block's input, the attention output and the four matmul
outputs) and 4·b·a·s for the attention's log-sum-exp. Its kept tensors live in the checkpoint's own cache, which saved-tensor hooks (and so
``ledger.measure``'s kept-for-backward line) see only when the checkpoint is asked to route them
through the hooks (``respect_saved_tensors_hooks=True``, torch >= 2.12; on an older torch the
line undercounts this mode). The plan checked against TorchTitan reads the peak of every live
tensor instead (``ledger.peak_live_bytes``, torch's memory tracker).
"""
from __future__ import annotations

import inspect
import warnings
from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .. import checks

LLAMA_RECOMPUTE = ("none", "op-selective", "full")
# Llama 3.1 8B as TorchTitan's "8B" flavour sets it: ffn = 14,336 is 1.3 × (2/3 · 4h) rounded up
# to a multiple of 1,024; vocabulary 128,256 (the Llama 3 tokenizer). 8.03 B parameters.
LLAMA_SHAPES = {
    "Llama 3.1 8B": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256),
}
ROPE_THETA = 500_000.0
# torch >= 2.12 can route a selective checkpoint's cache through saved-tensor hooks (the ledger's)
SAC_THROUGH_HOOKS = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters

# The ops whose outputs TorchTitan's selective op checkpointing keeps (matmuls: all but every second).
# ``_scaled_dot_product_flash_attention_for_cpu`` is the CPU kernel behind the same call: the
# kit plans on a CPU what the flash kernel keeps on a GPU (its output and log-sum-exp).
_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.abs.default,
    torch.ops.aten.max.default,
}


def op_selective_context():
    """A ``context_fn`` for ``torch.utils.checkpoint``: TorchTitan's selective op policy. Keep
    (MUST_SAVE) the outputs of the ops in ``_SAVED_OPS``, except every second ``mm`` (counted
    separately in the forward and in the recomputation, so both agree on which); recompute the
    rest (PREFER_RECOMPUTE). One call per checkpointed forward: the counters start at zero."""
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        keep = func in _SAVED_OPS and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class RMSNorm(nn.Module):
    """x / rms(x) · weight, the normalisation in fp32 (as TorchTitan's ``RMSNorm``)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_frequencies(head_dim: int, seq_len: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """e^{i·t·θ^(−2j/d)} for positions t < seq_len and j < d/2: complex64, seq_len × d/2."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate b×s×heads×d ``x`` by position: pairs of channels as complex numbers times
    ``freqs_cis`` (s×d/2), in fp32, cast back to x's dtype."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = pairs * freqs_cis[None, :, None, :]
    return torch.view_as_real(rotated).flatten(3).type_as(x)


class Attention(nn.Module):
    """Grouped-query causal attention: q (a heads), k and v (g heads) projected without bias,
    RoPE on q and k, k and v repeated to a heads, torch's fused attention, output projection."""

    def __init__(self, hidden: int, heads: int, kv_heads: int):
        super().__init__()
        if hidden % heads or heads % kv_heads:
            raise ValueError(f"hidden={hidden} must be divisible by heads={heads}, and heads by "
                             f"kv_heads={kv_heads}")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.wq = nn.Linear(hidden, hidden, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        k, v = (repeat_kv(t, self.heads // self.kv_heads) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)   # b×a×s×d
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))


def repeat_kv(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """b×s×g×d -> b×s×(g·repeats)×d, each key/value head repeated (a copy, as TorchTitan's)."""
    if repeats == 1:
        return x
    b, s, g, d = x.shape
    return x[:, :, :, None, :].expand(b, s, g, repeats, d).reshape(b, s, g * repeats, d)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) · w3 x), no biases."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """x + attention(norm(x)), then + mlp(norm(·)); checkpointed as ``recompute`` says."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, recompute: str = "none"):
        super().__init__()
        self.recompute = checks.choice(recompute, "recompute", LLAMA_RECOMPUTE)
        if recompute == "op-selective" and not SAC_THROUGH_HOOKS:
            warnings.warn(f"torch {torch.__version__} keeps a selective checkpoint's tensors out of "
                          "saved-tensor hooks: ledger.measure's kept-for-backward line will miss them "
                          "(torch >= 2.12 counts them); ledger.peak_live_bytes sees them", stacklevel=2)
        self.attention_norm = RMSNorm(hidden)
        self.attention = Attention(hidden, heads, kv_heads)
        self.ffn_norm = RMSNorm(hidden)
        self.feed_forward = SwiGLU(hidden, ffn)

    def _forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs_cis)
        return x + self.feed_forward(self.ffn_norm(x))

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        if self.recompute == "none" or not torch.is_grad_enabled():
            return self._forward(x, freqs_cis)
        kwargs = {}
        if self.recompute == "op-selective":
            kwargs["context_fn"] = op_selective_context
            if SAC_THROUGH_HOOKS:
                kwargs["respect_saved_tensors_hooks"] = True
        # no random op in the block, and TorchTitan does not preserve the RNG state either
        return checkpoint(self._forward, x, freqs_cis, use_reentrant=False, preserve_rng_state=False,
                          **kwargs)


class Llama(nn.Module):
    """Token embedding, ``layers`` ``LlamaBlock``s, final RMSNorm, an untied output layer.
    ``forward(idx)``: b×s int64 -> b×s×v logits; ``loss(idx, targets)``: cross-entropy on the
    logits cast to fp32, as TorchTitan's training loop computes it."""

    def __init__(self, *, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                 seq_len: int, recompute: str = "none"):
        super().__init__()
        for name, value in dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                ffn=ffn, vocab=vocab, seq_len=seq_len).items():
            checks.positive_int(value, name)
        self.seq_len = seq_len
        self.tok_embeddings = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(LlamaBlock(hidden, heads, kv_heads, ffn, recompute)
                                    for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.output = nn.Linear(hidden, vocab, bias=False)
        # complex: FSDP2's MixedPrecisionPolicy casts floating-point inputs only, so it stays fp32
        self.register_buffer("freqs_cis", rope_frequencies(hidden // heads, seq_len), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.dtype != torch.long or idx.shape[1] > self.seq_len:
            raise ValueError(f"idx must be a b×s int64 tensor with s <= {self.seq_len}, got "
                             f"{tuple(idx.shape)} {idx.dtype}")
        x = self.tok_embeddings(idx)
        freqs_cis = self.freqs_cis[:idx.shape[1]]
        for block in self.layers:
            x = block(x, freqs_cis)
        return self.output(self.norm(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(idx).flatten(0, 1).float(), targets.flatten(0, 1))


def llama_param_count(*, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                      vocab: int) -> int:
    """2·v·h + L·(2h² + 2·g·d·h + 3·h·f + 2h) + h."""
    kv = kv_heads * (hidden // heads)
    return 2 * vocab * hidden + layers * (2 * hidden ** 2 + 2 * kv * hidden + 3 * hidden * ffn
                                          + 2 * hidden) + hidden
