"""Training memory is more than one copy of the weights: the predictor (formulas only).

Per training step a device holds

    resident state   parameters + gradients + optimizer states (+ an fp32 master copy under
                     mixed precision): a fixed number of bytes *per parameter*;
    activations      what the forward pass keeps for backward: grows with batch × sequence.

Bytes per parameter (``state_bytes_per_param``)::

                              params  grads  master  optimizer (SGD / +momentum / Adam, AdamW)
    fp32                         4      4      0         0 / 4 / 8
    bf16-mixed                   2      2      4         0 / 4 / 8      -> Adam: 16 bytes/param
    bf16-mixed, fp32 grad acc.   2      2+4    4         0 / 4 / 8      -> Adam: 20 bytes/param

The last row keeps 16-bit gradients plus an fp32 accumulation copy: Megatron's fp16 layout (20).
Megatron's bf16 layout accumulates into fp32 gradients only (2 + 4 + 4 + 8 = 18 with Adam),
which this table does not offer.

Optimizer states are fp32 under both precisions: bf16 autocast shrinks activations, not them.

Activations of a GPT-like layer (``korthikanti_layer_activation_bytes``; Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", 16-bit activations, 1-byte
dropout masks, no tensor/sequence parallelism), s = sequence, b = batch, h = hidden, a = heads::

    none       s·b·h·(34 + 5·a·s/h)   = attention 11sbh + 5as²b, MLP 19sbh, two LayerNorms 4sbh
    selective  34·s·b·h               (the 5as²b softmax/dropout terms are recomputed)
    full       2·s·b·h                (only each layer's input is stored)

What every formula here leaves out, on purpose: the CUDA context (~0.3-1 GB per process),
the caching allocator's reserved-but-unused blocks and fragmentation, temporaries that live
only inside one op or between two ops (the softmax workspace, a matmul's output before the
next op consumes it, the gradient buffers of backward), the one layer that full recomputation
re-materialises during backward (``recompute_transient_bytes``), and kernel workspaces (cuBLAS,
cuDNN). Measured peaks are therefore *higher* than predictions; the stored-for-backward
bytes (what ``course_utils.ledger.measure`` reports as ``activation_bytes``) match them.
The measured side is ``experiments.training_memory`` (``measure_tinygpt``, ``recompute_tradeoff``)
on the ledger (``ledger.measure``, ``ledger.cuda_peak_bytes``); the optimizer-state copies come from
``course_utils.optim.OPTIMIZERS``; the stacked-bar plot and the what-fits widget from
``course_utils.plots``.

The kit's own ``course_utils.models.transformer.TinyGPT`` has no dropout and runs in fp32 on CPU;
``tinygpt_layer_activation_bytes`` is the same count derived for *that* block (see its module
docstring), which is what the lesson checks against measurement.
"""
from __future__ import annotations

from torch import nn

from . import checks
from .ledger import predict_step
from .optim import OPTIMIZERS, state_copies
from .models.transformer import ATTENTION_KINDS, GPT_SHAPES, RECOMPUTE_MODES, tinygpt_param_count

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
# fp16 mixed precision (autocast fp16 + a GradScaler, for GPUs without bf16) stores the same bytes
# as bf16-mixed, whichever split a formula uses: both 16-bit types take 2 bytes, and the fp32
# copies (master weights or autocast's fp32 parameters, the moments) are the same.
MIXED_PRECISIONS = ("bf16-mixed", "fp16-mixed")
MEMORY_KEYS = ("params", "grads", "optimizer", "master_params", "activations", "total")

# Nominal memory of common accelerators (bytes). Usable memory is a little lower: the CUDA
# context and the allocator take their share before the first tensor.
DEVICES = {
    # The T4 is sold as 16 GB; on Colab torch reports about 14.7 GiB of total memory for it
    # (torch.cuda.get_device_properties(0).total_memory, as commonly quoted; not re-checked here,
    # no T4 was lent), and the CUDA context takes some of that too: "what fits" must not use 16.
    # (It has no bf16 either: there people train fp16 + GradScaler, which stores the same 2-byte
    # weights, gradients and activations.) The others: the marketed size, in GiB.
    "T4 (Colab) 16 GB": int(14.7 * 2**30),
    "V100 16 GB": 16 * 2**30,
    "L4 24 GB": 24 * 2**30,
    "RTX 4090 24 GB": 24 * 2**30,
    "A100 40 GB": 40 * 2**30,
    "A100 80 GB": 80 * 2**30,
    "H100 80 GB": 80 * 2**30,
}
# GPUs before Ampere have no bf16 arithmetic: mixed precision there is fp16 + GradScaler.
WITHOUT_BF16 = ("T4 (Colab) 16 GB", "V100 16 GB")


def _positive_ints(**values) -> None:
    for name, value in values.items():
        checks.positive_int(value, name)


# --------------------------------------------------------------------------- resident state
def state_bytes_per_param(optimizer: str = "adamw", precision: str = "fp32",
                          fp32_grad_accumulation: bool = False) -> dict:
    """Bytes per parameter of each resident-state line (table in the module docstring)."""
    copies = state_copies(optimizer)
    checks.choice(precision, "precision", PRECISIONS)
    if fp32_grad_accumulation and precision not in MIXED_PRECISIONS:
        raise ValueError("fp32_grad_accumulation only applies to mixed precision "
                         "(fp32 training already accumulates in fp32)")
    low = precision in MIXED_PRECISIONS
    return {
        "params": 2 if low else 4,
        "grads": (2 + 4 if fp32_grad_accumulation else 2) if low else 4,
        "optimizer": 4 * copies,  # moments stay fp32
        "master_params": 4 if low else 0,
    }


def state_memory(n_params: int, *, optimizer: str = "adamw", precision: str = "fp32",
                 fp32_grad_accumulation: bool = False) -> dict:
    """Resident bytes for ``n_params`` parameters: params, grads, optimizer, master_params, total."""
    checks.positive_int(n_params, "n_params", minimum=0)
    per = state_bytes_per_param(optimizer, precision, fp32_grad_accumulation)
    out = {k: n_params * v for k, v in per.items()}
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------- activations
def korthikanti_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int,
                                       recompute: str = "none", attention: str = "eager") -> int:
    """One Megatron GPT layer, 16-bit activations with dropout: sbh(34 + 5as/h), 34sbh or 2sbh.

    ``attention="sdpa"`` (fused attention, what a GPU run uses): no s² tensor is kept; the fused
    kernel keeps its own output (2sbh, beside the copy the output projection saves, as measured
    on ``TinyGPT``) and one fp32 log-sum-exp per row and head (4asb): 36sbh + 4asb. Selective
    recomputation then has nothing left to recompute (the same count); full keeps 2sbh.
    """
    _positive_ints(seq=seq, batch=batch, hidden=hidden, heads=heads)
    checks.choice(recompute, "recompute", RECOMPUTE_MODES)
    checks.choice(attention, "attention", ATTENTION_KINDS)
    sbh = seq * batch * hidden
    if recompute == "full":
        return 2 * sbh
    if attention == "sdpa":
        return 36 * sbh + 4 * heads * seq * batch
    attention_scores = 5 * heads * seq * seq * batch  # softmax out 2, dropout mask 1, dropout out 2
    return 34 * sbh + (attention_scores if recompute == "none" else 0)


AUTOCAST_DEVICES = (None, "cpu", "cuda")


def tinygpt_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int,
                                   recompute: str = "none", autocast: str | None = None,
                                   attention: str = "eager") -> int:
    """One ``TinyGPT`` block, derived op by op (course_utils.models.transformer docstring).

    fp32 (``autocast=None``)::

        none: 4·(16·sbh + a·s²·b) + 16·sb   (the 16·sb are the two LayerNorms' mean and rstd)
        selective: 4·16·sbh + 16·sb         (the a·s²·b softmax output is recomputed)
        full: 4·sbh                          (the block input only)

    Under bf16 autocast (``autocast="cpu"`` or ``"cuda"``) the matmuls save bf16 copies of their
    inputs, while the residual stream and the LayerNorm inputs stay fp32: 4sbh + 4sbh (two LN
    inputs) + 2sbh (ln1 out) + 6sbh (q, k, v) + 2sbh (attention out) + 2sbh (ln2 out) + 8sbh (GELU
    input) + 8sbh (GELU output) = 36·sbh, + 16·sb, plus the softmax output P, which depends on the
    device: CPU autocast runs softmax in bf16 and P (2·a·s²·b) is shared by softmax's backward and
    P @ v; CUDA autocast runs softmax in fp32, so P is kept in fp32 (4·a·s²·b) *and* as the bf16
    copy P @ v saves (2·a·s²·b). Selective recomputation drops P on both; full keeps the fp32
    block input (4·sbh). The bf16 weight copies autocast saves are per step, not per sample
    (they do not grow with the batch) and are not counted here.
    Versus Korthikanti's 16-bit count: no dropout masks (2sbh bytes after the attention and MLP
    projections, as²b in attention; the embedding's sbh sits in the head) and no attention-dropout
    output (2as²b bytes).

    ``attention="sdpa"`` (fp32 only): no P; the fused kernel keeps its output (4sbh, a storage of
    its own: the output projection saves the contiguous copy) and one log-sum-exp per row and
    head (4asb): 4·17·sbh + 16·sb + 4·asb, measured byte for byte (tests/test_memory.py).
    """
    _positive_ints(seq=seq, batch=batch, hidden=hidden, heads=heads)
    checks.choice(recompute, "recompute", RECOMPUTE_MODES)
    checks.choice(autocast, "autocast", AUTOCAST_DEVICES)
    checks.choice(attention, "attention", ATTENTION_KINDS)
    sb, sbh = seq * batch, seq * batch * hidden
    if recompute == "full":
        return 4 * sbh
    if attention == "sdpa":
        if autocast is not None:
            raise ValueError("TinyGPT's count with attention='sdpa' is derived for fp32 only; "
                             "measure the autocast step with course_utils.ledger.measure")
        if recompute == "selective":
            raise ValueError("recompute='selective' recomputes eager attention's s² tensors, which "
                             "attention='sdpa' never keeps: use recompute='none' or 'full'")
        return 4 * 17 * sbh + 16 * sb + 4 * heads * seq * batch
    scores = heads * seq * seq * batch if recompute == "none" else 0
    if autocast is None:
        return 4 * (16 * sbh + scores) + 16 * sb
    return 36 * sbh + (2 if autocast == "cpu" else 6) * scores + 16 * sb


def tinygpt_activation_bytes(layers: int, hidden: int, heads: int, vocab: int, seq: int,
                             batch: int, *, recompute: str = "none",
                             autocast: str | None = None, attention: str = "eager") -> int:
    """Bytes the whole ``TinyGPT`` stores for backward, weight copies excluded: L layers plus
    the head (``head_activation_bytes(..., "fp32")``; under autocast the LM head saves a bf16
    copy of its input, 2·sbh instead of 4·sbh, and the logits of the loss stay fp32 on both
    devices, cross-entropy being an fp32 op of autocast). CUDA autocast keeps 2·sbv bytes more
    (``cuda_autocast_logit_bytes``, which says which op)."""
    _positive_ints(layers=layers)
    head = head_activation_bytes(seq, batch, hidden, vocab, "fp32")
    if autocast is not None:
        head -= 2 * seq * batch * hidden
    if autocast == "cuda":
        head += cuda_autocast_logit_bytes(seq, batch, vocab)
    return layers * tinygpt_layer_activation_bytes(seq, batch, hidden, heads, recompute,
                                                    autocast, attention) + head


def cuda_autocast_logit_bytes(seq: int, batch: int, vocab: int) -> int:
    """What CUDA autocast keeps for backward beyond a CPU autocast run of the same step when the
    loss is taken inside autocast on 16-bit logits (``TinyGPT.loss``): two bytes per logit, 2·sbv.

    Which op: cross-entropy is log-softmax then NLL. CUDA autocast runs log-softmax in the
    logits' bf16 and keeps its output (2 bytes per logit), then NLL, an fp32 op, casts that to
    fp32 and keeps the copy (4); CPU autocast runs log-softmax in fp32 and NLL keeps the same
    tensor (4 in all). Found on an H200, byte for byte at two shapes, with and without full
    recomputation (benchmarks/gpu_runs/2026-12-04_h200_run1.json), then derived on a CPU: the
    same forward on fake CUDA tensors under CUDA's autocast rules (``ledger.autocast_rules``)
    keeps exactly this much more (tests/test_memory.py). A step that casts the logits to fp32
    before the loss, as the planner's ``gpt_loss`` and TorchTitan do, keeps none of it."""
    return 2 * seq * batch * vocab


def head_activation_bytes(seq: int, batch: int, hidden: int, vocab: int, precision: str) -> int:
    """Embedding, final LayerNorm, LM head and cross-entropy (outside the layers).

    bf16-mixed (Korthikanti's accounting): embedding dropout mask sbh + final LN input 2sbh +
    head input 2sbh + fp32 logits for the loss 4sbv.
    fp32 (TinyGPT, measured): token ids 8sb + position ids 8s + final LN input 4sbh and its
    statistics 8sb + head input 4sbh + log-softmax output 4sbv + int64 targets 8sb + a 4-byte
    scalar (the total weight nll_loss divides by).
    """
    _positive_ints(seq=seq, batch=batch, hidden=hidden, vocab=vocab)
    checks.choice(precision, "precision", PRECISIONS)
    sb, sbh = seq * batch, seq * batch * hidden
    if precision in MIXED_PRECISIONS:
        return 5 * sbh + 4 * sb * vocab
    return 24 * sb + 8 * seq + 8 * sbh + 4 * sb * vocab + 4


def _with_attention(recompute: str, attention: str) -> str:
    """Selective recomputation re-runs eager attention's s² tensors; fused attention keeps none,
    so with it "selective" recomputes nothing: the "none" count (TinyGPT refuses the pair)."""
    return "none" if attention == "sdpa" and recompute == "selective" else recompute


def transformer_activation_bytes(layers: int, hidden: int, heads: int, vocab: int, seq: int,
                                 batch: int, *, precision: str = "fp32",
                                 recompute: str = "none", attention: str = "eager") -> int:
    """Bytes stored for backward by the whole model: L × per-layer + head.

    precision="bf16-mixed" or "fp16-mixed" uses Korthikanti's 16-bit per-layer count; "fp32" the count derived
    for the kit's TinyGPT (no dropout), which is what a CPU run measures. ``attention``: "eager"
    keeps the s² probabilities, "sdpa" (fused, as GPU runs use) does not (see the per-layer
    counts); selective recomputation with "sdpa" in fp32 is the "none" count (nothing to recompute).
    """
    checks.choice(precision, "precision", PRECISIONS)
    recompute = _with_attention(recompute, attention)
    if precision not in MIXED_PRECISIONS:
        return tinygpt_activation_bytes(layers, hidden, heads, vocab, seq, batch, recompute=recompute,
                                        attention=attention)
    _positive_ints(layers=layers)
    return (layers * korthikanti_layer_activation_bytes(seq, batch, hidden, heads, recompute, attention)
            + head_activation_bytes(seq, batch, hidden, vocab, precision))


def recompute_transient_bytes(hidden: int, heads: int, seq: int, batch: int, *,
                              precision: str = "fp32", recompute: str = "none",
                              attention: str = "eager") -> int:
    """Extra bytes alive while backward recomputes one layer: that layer's un-recomputed
    activations minus what was stored for it (0 without recomputation)."""
    checks.choice(precision, "precision", PRECISIONS)
    per_layer = (korthikanti_layer_activation_bytes if precision in MIXED_PRECISIONS
                 else tinygpt_layer_activation_bytes)
    recompute = _with_attention(recompute, attention)
    if recompute == "none":
        return 0
    return (per_layer(seq, batch, hidden, heads, "none", attention=attention)
            - per_layer(seq, batch, hidden, heads, recompute, attention=attention))


def transformer_memory(layers: int, hidden: int, heads: int, vocab: int, seq: int, batch: int, *,
                       optimizer: str = "adamw", precision: str = "fp32", recompute: str = "none",
                       attention: str = "eager", fp32_grad_accumulation: bool = False) -> dict:
    """Predicted bytes of one training step of a GPT-like model (TinyGPT's shape: tied LM head,
    learned positions for ``seq`` tokens, MLP width 4h).

    Returns {params, grads, optimizer, master_params, activations, total}. Parameters:
    v·h + s·h + L·(12h² + 13h) + 2h. ``activations`` are the bytes stored for backward (see
    ``transformer_activation_bytes``); the terms left out are listed in the module docstring.
    """
    _positive_ints(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, batch=batch)
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    checks.choice(optimizer, "optimizer", OPTIMIZERS)
    checks.choice(precision, "precision", PRECISIONS)
    checks.choice(recompute, "recompute", RECOMPUTE_MODES)
    n_params = tinygpt_param_count(layers, hidden, vocab, seq)
    out = state_memory(n_params, optimizer=optimizer, precision=precision,
                       fp32_grad_accumulation=fp32_grad_accumulation)
    out["activations"] = transformer_activation_bytes(layers, hidden, heads, vocab, seq, batch,
                                                      precision=precision, recompute=recompute,
                                                      attention=attention)
    out["total"] += out["activations"]
    return {k: out[k] for k in MEMORY_KEYS}


# --------------------------------------------------------------------------- the kit's models
def model_memory(model: nn.Module, input_shape=None, *, optimizer: str = "adamw",
                 precision: str = "fp32", fp32_grad_accumulation: bool = False) -> dict:
    """Predicted bytes for one of the kit's models (MLP, SmallResNet, ViT, TinyGPT ...).

    Resident state from the parameter count (SGD 0, SGD+momentum 1×, Adam/AdamW 2× param bytes
    in fp32). Activations (fp32, supervised step with cross-entropy) where derived by hand:
    layers of Linear/Conv2d/BatchNorm2d/ReLU (MLP, SmallResNet) via
    ``course_utils.ledger.predict_step``; otherwise ``None`` (measure them instead).
    """
    checks.instance(model, "model", nn.Module, what="an nn.Module")
    n_params = sum(p.numel() for p in model.parameters())
    out = state_memory(n_params, optimizer=optimizer, precision=precision,
                       fp32_grad_accumulation=fp32_grad_accumulation)
    out["activations"] = None
    if input_shape is not None and precision == "fp32":
        try:
            out["activations"] = predict_step(model, input_shape)["activation_bytes"]
        except ValueError:  # a layer predict_step has no rule for (LayerNorm, GELU, attention)
            out["activations"] = None
    if out["activations"] is not None:
        out["total"] += out["activations"]
    return {k: out[k] for k in MEMORY_KEYS}


# --------------------------------------------------------------------------- what fits
PRESETS = {name: GPT_SHAPES[name] for name in (  # GPT-2 family (vocab 50257, context 1024), two larger
    "GPT-2 small (124M)", "GPT-2 medium (350M)", "GPT-2 large (774M)", "GPT-2 XL (1.5B)",
    "GPT 2.7B", "GPT 7B")}


def what_fits(model: str = "GPT-2 small (124M)", batch: int = 8, seq: int = 1024, *,
              precision: str | None = None, optimizer: str = "adamw", recompute: str = "none",
              attention: str = "sdpa", device: str = "T4 (Colab) 16 GB", vocab: int = 50257) -> dict:
    """The widget's compute function: predicted breakdown for a preset model against a device.

    ``precision=None`` picks the device's mixed precision: "fp16-mixed" on GPUs without bf16
    (``WITHOUT_BF16``: T4, V100), "bf16-mixed" elsewhere; asking for bf16 on those is an error.
    ``attention="sdpa"`` (the default) counts fused attention, what a GPU run uses: no s²
    probabilities kept; "eager" counts them (fp32: TinyGPT's measured count; 16-bit:
    Korthikanti's, derived).

    Returns {"breakdown": {params, grads, optimizer, master_params, activations,
    recompute_workspace}, "total", "capacity", "fits", "headroom"} (bytes). ``fits`` ignores the
    CUDA context and fragmentation (see the module docstring), so treat a small headroom as "no".
    """
    checks.choice(model, "model", PRESETS)
    checks.choice(device, "device", DEVICES)
    if precision is None:
        precision = "fp16-mixed" if device in WITHOUT_BF16 else "bf16-mixed"
    if precision == "bf16-mixed" and device in WITHOUT_BF16:
        raise ValueError(f"the {device} has no bf16: use precision='fp16-mixed' (autocast fp16 "
                         "with a GradScaler), which stores the same bytes")
    shape = PRESETS[model]
    mem = transformer_memory(shape["layers"], shape["hidden"], shape["heads"], vocab, seq, batch,
                             optimizer=optimizer, precision=precision, recompute=recompute,
                             attention=attention)
    breakdown = {k: mem[k] for k in MEMORY_KEYS if k != "total"}
    breakdown["recompute_workspace"] = recompute_transient_bytes(
        shape["hidden"], shape["heads"], seq, batch, precision=precision, recompute=recompute,
        attention=attention)
    total = sum(breakdown.values())
    capacity = DEVICES[device]
    return {"breakdown": breakdown, "total": total, "capacity": capacity,
            "fits": total <= capacity, "headroom": capacity - total}
