"""A small GPT-like decoder whose saved-for-backward tensors are easy to read off.

Used by lesson 06 to check the activation-memory predictor in ``course_utils.memory``
against measurement. Attention is written out with matmuls (no fused
``scaled_dot_product_attention``) so that every tensor autograd keeps is one named line below.
There is no dropout: on a CPU fp32 run we want the model the measurement sees, and we say
which of Korthikanti et al.'s terms this leaves out (the dropout masks and dropout outputs).

Shapes: b = batch, s = sequence, h = hidden, a = heads, d = h / a, v = vocab.

What one ``Block`` keeps for backward in fp32 (elements; ``memory.tinygpt_layer_activation_bytes``
turns this into bytes)::

    ln1 input x            s·b·h     (layer_norm saves its input, plus mean and rstd: 2·s·b)
    ln1 output             s·b·h     (saved by the qkv Linear)
    q, k, v (contiguous)   3·s·b·h   (saved by the two attention matmuls)
    softmax output P       a·s²·b    (saved by softmax and by P @ v: one storage)
    attention output       s·b·h     (saved by the output projection)
    ln2 input              s·b·h     (+ mean and rstd: 2·s·b)
    ln2 output             s·b·h     (saved by fc1)
    GELU input             4·s·b·h   (GELU saves its input)
    GELU output            4·s·b·h   (saved by fc2)
    ---------------------------------
    16·s·b·h + a·s²·b elements, + 4·s·b for the two layer norms' statistics

Attention (``attention=``): ``"eager"`` (above: the s² probabilities P are kept, what lesson 06
teaches) or ``"sdpa"``, torch's fused ``scaled_dot_product_attention`` (flash attention on a GPU,
its CPU flash kernel here), which keeps q, k, v, its output and one log-sum-exp per row
(a·s·b fp32) and recomputes the probabilities in backward: no s² term, what a real run uses.

Recomputation (``recompute=``): ``"selective"`` wraps only the attention core (scores, softmax,
P @ v) in ``torch.utils.checkpoint`` so P (the a·s²·b term) is recomputed in backward instead of
stored; ``"full"`` wraps each whole block so only its input x (s·b·h) is stored.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .. import checks

RECOMPUTE_MODES = ("none", "selective", "full")
ATTENTION_KINDS = ("eager", "sdpa")
# The GPT-like shapes the kit sizes, in one table: lesson 06's what-fits widget
# (course_utils.memory.PRESETS) and lesson 11's planner (experiments.planning.GPT_SIZES) each
# choose names from it. "GPT 7B" is the 6.7B of GPT-3's table (Brown et al. 2020).
GPT_SHAPES = {
    "GPT-2 small (124M)": dict(layers=12, hidden=768, heads=12),
    "GPT-2 medium (350M)": dict(layers=24, hidden=1024, heads=16),
    "GPT-2 large (774M)": dict(layers=36, hidden=1280, heads=20),
    "GPT-2 XL (1.5B)": dict(layers=48, hidden=1600, heads=25),
    "GPT 1.3B": dict(layers=24, hidden=2048, heads=16),
    "GPT 2.7B": dict(layers=32, hidden=2560, heads=32),
    "GPT 7B": dict(layers=32, hidden=4096, heads=32),
    "GPT 13B": dict(layers=40, hidden=5120, heads=40),
    "GPT 65B": dict(layers=80, hidden=8192, heads=64),   # LLaMA-65B's depth, width and heads
}


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   causal_bias: torch.Tensor, softmax_dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax(q kᵀ / √d + causal_bias) v.  q, k, v: b×a×s×d; causal_bias: s×s (0 or -inf).
    ``softmax_dtype``: None runs softmax in the scores' dtype (what CPU autocast does: bf16);
    torch.float32 runs it in fp32 whatever autocast says, as CUDA autocast does."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    # bias cast to the scores dtype so bf16 autocast does not promote the s² scores to fp32
    scores = (q @ k.transpose(-2, -1)) * scale + causal_bias.to(q.dtype)  # b×a×s×s; saves q, k
    probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype)  # softmax saves its output P
    return probs.to(v.dtype) @ v   # saves P (the same storage unless softmax ran wider) and v


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int, selective: bool = False,
                 attention: str = "eager"):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
        self.heads = heads
        self.selective = selective
        self.attention = checks.choice(attention, "attention", ATTENTION_KINDS)
        self.softmax_dtype = None   # torch.float32: as CUDA autocast runs it (attention_core)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        # additive mask: adding a constant saves nothing for backward (masked_fill would save a mask)
        bias = torch.full((seq_len, seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads

        def heads_first(t):  # b×s×h -> b×a×s×d, contiguous so each of q, k, v is one storage
            return t.view(b, s, self.heads, d).transpose(1, 2).contiguous()

        q, k, v = (heads_first(t) for t in self.qkv(x).split(h, dim=-1))
        bias = self.causal_bias[:s, :s]
        if self.attention == "sdpa":   # fused: nothing s² is kept, so nothing to recompute
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.selective and torch.is_grad_enabled():
            # Korthikanti et al.'s selective recomputation: drop the s² attention tensors, keep q, k, v
            # the mask goes in through a closure: as a checkpoint input it would be stored too
            core = functools.partial(attention_core, causal_bias=bias, softmax_dtype=self.softmax_dtype)
            out = checkpoint(core, q, k, v, use_reentrant=False)
        else:
            out = attention_core(q, k, v, bias, self.softmax_dtype)
        out = out.transpose(1, 2).contiguous().view(b, s, h)  # b×s×h, saved by proj
        return self.proj(out)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)); MLP width 4h."""

    def __init__(self, hidden: int, heads: int, seq_len: int, selective: bool = False,
                 attention: str = "eager"):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, seq_len, selective=selective, attention=attention)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Token + position embeddings, ``layers`` blocks, final LayerNorm, LM head tied to the
    token embedding (as in GPT-2), so parameters = v·h + s·h + L·(12h² + 13h) + 2h.

    ``recompute`` in {"none", "selective", "full"}; ``recompute_blocks`` (indices) limits it to
    some blocks (None = every block), e.g. full recomputation of every second block.
    ``attention`` "eager" (the s² probabilities written out) or "sdpa" (fused; see the module
    docstring). Selective recomputation is of eager attention's s² tensors: with "sdpa" there are
    none, so it is refused.
    """

    def __init__(self, vocab: int = 256, seq_len: int = 64, layers: int = 2, hidden: int = 64,
                 heads: int = 4, recompute: str = "none", recompute_blocks=None,
                 attention: str = "eager"):
        super().__init__()
        for name, value in dict(vocab=vocab, seq_len=seq_len, layers=layers, hidden=hidden,
                                heads=heads).items():
            checks.positive_int(value, name)
        checks.choice(recompute, "recompute", RECOMPUTE_MODES)
        checks.choice(attention, "attention", ATTENTION_KINDS)
        if attention == "sdpa" and recompute == "selective":
            raise ValueError("recompute='selective' recomputes eager attention's s² tensors, which "
                             "attention='sdpa' never keeps: use recompute='none' or 'full' with sdpa")
        chosen = set(range(layers)) if recompute_blocks is None else set(recompute_blocks)
        if not chosen <= set(range(layers)):
            raise ValueError(f"recompute_blocks={sorted(chosen)} must be indices in 0..{layers - 1}")
        self.seq_len = seq_len
        self.full_blocks = chosen if recompute == "full" else set()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, heads, seq_len, selective=(recompute == "selective" and i in chosen),
                  attention=attention)
            for i in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: b×s int64 token ids -> logits b×s×v."""
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be a b×s int64 tensor, got {tuple(idx.shape)} {idx.dtype}")
        b, s = idx.shape
        if s > self.seq_len:
            raise ValueError(f"sequence length {s} exceeds the model's seq_len={self.seq_len}")
        pos = torch.arange(s, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # b×s×h
        for i, block in enumerate(self.blocks):
            if i in self.full_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)  # stores only x
            else:
                x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head: b×s×v

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; targets b×s int64."""
        logits = self(idx)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tinygpt_param_count(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """v·h + s·h (embeddings, head tied) + L·(12h² + 13h) + 2h (final LayerNorm)."""
    return vocab * hidden + seq * hidden + layers * (12 * hidden ** 2 + 13 * hidden) + 2 * hidden


def random_tokens(batch: int, seq: int, vocab: int, generator: torch.Generator | None = None,
                  device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh (inputs, targets) pair of b×s int64 tensors (each its own storage, so the
    ledger counts exactly b·s·8 bytes for the targets cross-entropy keeps)."""
    data = torch.randint(vocab, (batch, seq + 1), generator=generator)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)
