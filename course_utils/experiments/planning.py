"""Plans of real runs, measured on fake tensors (lesson 11): one function per configuration.

Each builds its model *inside* the caller's ``fake_mode()`` (and, for several ranks, on the mesh
``fake_world`` yields), runs one training step under ``measure`` and returns the ledger record.
Call them on fake tensors for paper-size runs; at small sizes they also run on real tensors,
which is how the tests check that fake and real agree.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.overrides import TorchFunctionMode

from .. import checks
from ..augment import SimCLRAugment
from ..distributed.data_parallel import nt_xent_local_with_global_negatives
from ..distributed.sharding import MixedPrecisionPolicy, fully_shard
from ..ledger import autocast_rules, fake_mode, fake_world, kept_after_forward, measure
from ..ledger.comm_count import allreduce_mean_hook
from ..memory import DEVICES, PRECISIONS
from ..models import ViT
from ..models.heads import ProjectionHead
from ..models.transformer import GPT_SHAPES, TinyGPT, tinygpt_param_count
from ..objectives import MAE, MoCo, SimCLR, make_step
from ..optim import make_optimizer

# precision -> the autocast dtype of the forward. Autocast keeps fp32 parameters, gradients and
# optimizer state (4 + 4 bytes per parameter + the optimizer's copies) and casts weights per op,
# so mixed precision shrinks what backward keeps, not the resident state. fp16 on fake tensors
# runs without its GradScaler: the scaler's inf check reads values, which fake tensors lack, and
# it holds one scalar, so the ledger is the same.
AUTOCAST_DTYPES = {"fp32": None, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def softmax_as_on_cuda(model: nn.Module) -> nn.Module:
    """Make every eager attention in ``model`` run softmax in fp32, as CUDA autocast does.

    The planner runs on a CPU but plans a GPU run, and the two autocasts differ where it matters
    for memory: CPU autocast runs softmax in bf16 (eager attention keeps its s² probabilities in
    2 bytes), CUDA autocast in fp32 (4 bytes kept by softmax, plus the 2-byte copy the next matmul
    saves). The attention modules (``transformer.CausalSelfAttention``, ``models.vit.Attention``)
    carry the choice as ``softmax_dtype``, so a checkpointed block recomputes it the same way.
    The rest of both autocasts' lists agree for these models (matmuls in bf16, LayerNorm on an
    fp32 residual stream) once the loss is taken outside autocast on fp32 logits (``gpt_loss``):
    tests/test_planner.py runs the planner's forward on fake CUDA tensors under CUDA's own rules
    (``ledger.autocast_rules``) and finds the same bytes kept, exactly."""
    for module in model.modules():
        if hasattr(module, "softmax_dtype"):
            module.softmax_dtype = torch.float32
    return model


def _autocast(precision: str, device_type: str = "cpu"):
    """The forward's autocast for ``precision`` (with ``softmax_as_on_cuda`` on the model; the
    rules of ``device_type``, which fake tensors of a device this machine lacks can run)."""
    dtype = AUTOCAST_DTYPES[checks.choice(precision, "precision", PRECISIONS)]
    return contextlib.nullcontext() if dtype is None else autocast_rules(device_type, dtype)


def gpt_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str,
             device_type: str = "cpu") -> torch.Tensor:
    """The planner's GPT forward and loss: the model under ``precision``'s autocast, the loss
    outside it on the logits cast to fp32, as TorchTitan computes it. Why outside: inside CUDA
    autocast, cross-entropy on bf16 logits keeps log-softmax's bf16 output *and* an fp32 copy of
    it (``memory.cuda_autocast_logit_bytes``, 2 bytes per logit more than on a CPU); on fp32
    logits both devices keep one fp32 log-softmax output, so the CPU-measured plan is the GPU's."""
    with _autocast(precision, device_type):
        logits = module(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def _ddp(model: nn.Module) -> nn.Module:
    """``model`` in DDP on the current (fake) process group, gradients all-reduced through
    ``allreduce_mean_hook`` so the ledger counts them (the reducer's own all-reduce runs in C++)."""
    with warnings.catch_warnings():   # broadcast_buffers' successor still syncs at init
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = DDP(model, init_sync=False, broadcast_buffers=False, gradient_as_bucket_view=True)
    wrapped.register_comm_hook(None, allreduce_mean_hook)
    return wrapped


def tensor_parallel_ledger(mesh, *, hidden: int, batch: int, seq: int, layers: int = 1):
    """Megatron tensor parallelism of ``layers`` transformer MLPs (Linear(h, 4h)-GELU-Linear(4h, h))
    over ``mesh`` (1-D), with torch's ``parallelize_module``: the first Linear column-parallel, the
    second row-parallel. One AdamW step on a b×s×h batch (after one that creates the state).

    Communication per step: a forward all-reduce of b·s·h after every row-parallel Linear and a
    backward one before every column-parallel Linear whose input needs a gradient.
    """
    for name, value in dict(hidden=hidden, batch=batch, seq=seq, layers=layers).items():
        checks.positive_int(value, name)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                          nn.Linear(4 * hidden, hidden)) for _ in range(layers)])
    plan = {}
    for i in range(layers):
        plan[f"{i}.0"], plan[f"{i}.2"] = ColwiseParallel(), RowwiseParallel()
    model = parallelize_module(model, mesh, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(0))

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), x).backward()
        opt.step()
    step()
    return measure(step, model=model, optimizer=opt)


# ---------------------------------------------------------------------------------------------
# The papers' models
# ---------------------------------------------------------------------------------------------
def resnet50_encoder(stride_in: str = "3x3") -> nn.Module:
    """torchvision's ResNet-50 without its classifier (2048 features): SimCLR's and MoCo's
    backbone. 23.5 M parameters (25.6 M with the 1000-class head the papers count).

    ``stride_in``: where a stage's first block halves the resolution: "3x3" (torchvision's,
    sometimes called v1.5) or "1x1", its first 1x1 convolution, as He et al. (2016) built it;
    the same parameters, fewer FLOPs (the 3x3 convolution then runs at the lower resolution)."""
    checks.choice(stride_in, "stride_in", ("3x3", "1x1"))
    # imported here: torchvision's import loads torch._dynamo (see plots.image_grid)
    from torchvision.models import resnet50
    model = resnet50(weights=None)
    if stride_in == "1x1":
        for stage in (model.layer2, model.layer3, model.layer4):
            stage[0].conv1.stride, stage[0].conv2.stride = (2, 2), (1, 1)
    model.fc = nn.Identity()
    model.feature_dim = 2048
    return model


def vit_large_16(image_size: int = 224) -> nn.Module:
    """ViT-L/16 (24 blocks, width 1024, 16 heads, MLP 4096) built with the kit's ``ViT``
    (no class token; fixed sin-cos positions): the MAE paper's encoder, less its class token
    (MAE appends one, which changes a step's FLOPs by one token in 50 of the visible ones)."""
    return ViT(image_size=image_size, patch_size=16, dim=1024, depth=24, heads=16, mlp_ratio=4)


SSL_OBJECTIVES = ("simclr", "moco", "mae")


def ssl_ledger(objective: str, batch: int, *, image_size: int = 224, queue_size: int = 65536,
               mask_ratio: float = 0.75, mask_tokens_in_encoder: bool = False,
               encoder: nn.Module | None = None, ddp: bool = False, optimizer: str | None = None,
               precision: str = "fp32"):
    """Ledger of one step of ``objective`` ('simclr', 'moco' on ResNet-50, 'mae' on ViT-L/16)
    at ``batch`` images of ``image_size`` px. ``optimizer`` (``optim.OPTIMIZERS``) defaults to
    SGD with momentum for SimCLR/MoCo (the papers use LARS / SGD: one state copy per parameter)
    and AdamW for MAE; ``precision`` (``memory.PRECISIONS``) sets the forward's autocast.
    The model is built here, so call it inside ``fake_mode()`` at paper sizes. MAE's decoder:
    8 blocks of width 512. ``ddp=True`` (inside ``fake_world``): the objective wrapped in DDP,
    gradients all-reduced through ``allreduce_mean_hook`` so the ledger counts them; ``batch``
    per rank; on fake tensors DDP measures its first step (later ones rebuild buckets from data).
    """
    checks.choice(objective, "objective", SSL_OBJECTIVES)
    checks.positive_int(batch, "batch")
    checks.choice(precision, "precision", PRECISIONS)
    torch.manual_seed(0)
    augment = None
    if objective == "mae":
        # the paper's decoder: 8 blocks, 512 wide, 16 heads, MLP ratio 4 (He et al. 2022)
        model = MAE(encoder or vit_large_16(image_size), mask_ratio=mask_ratio, decoder_dim=512,
                    decoder_depth=8, decoder_heads=16, decoder_mlp_ratio=4,
                    mask_tokens_in_encoder=mask_tokens_in_encoder)
        opt = make_optimizer(optimizer or "adamw", model.parameters(), lr=1.5e-4, foreach=False)
    else:
        backbone = encoder or resnet50_encoder()
        head = ProjectionHead(backbone.feature_dim, 2048, 128)
        model = (SimCLR(backbone, head) if objective == "simclr"
                 else MoCo(backbone, head, queue_size=queue_size, bn_groups=1, shuffle_keys=False))
        opt = make_optimizer(optimizer or "sgd-momentum", model.parameters(), lr=0.3, foreach=False)
        augment = SimCLRAugment(image_size)
    softmax_as_on_cuda(model)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 3, image_size, image_size)
    record = dict(model=model, optimizer=opt, caches=model.caches, encoders=model.ledger_encoders)
    if not ddp and precision != "fp16-mixed":   # the kit's own training step
        step = make_step(model, opt, augment=augment, generator=generator,
                         autocast=AUTOCAST_DTYPES[precision])
        step((images, None))   # creates the optimizer state
        return measure(lambda: step((images, None)), **record)
    module = _ddp(model) if ddp else model

    def loss():   # through the (wrapped) module's forward, so DDP sees the step
        if objective == "mae":
            return module(images, generator)[0]
        return module(augment(images, generator), augment(images, generator))

    def manual_step():
        opt.zero_grad(set_to_none=True)
        with _autocast(precision):
            value = loss()
        value.backward()
        opt.step()
    if not ddp:
        manual_step()   # creates the optimizer state
    return measure(manual_step, **record)


def gpt_ledger(*, layers: int, hidden: int, heads: int, vocab: int, seq: int, batch: int,
               strategy: str = "single", mesh=None, recompute: str = "none",
               precision: str = "bf16-mixed", optimizer: str = "adamw", attention: str = "sdpa"):
    """Ledger of one step of a GPT-like ``TinyGPT`` (tied head, MLP 4h) on ``batch`` sequences
    of ``seq`` tokens per rank, as a GPU run would keep it. ``strategy``: 'single', 'ddp'
    (gradients all-reduced through ``allreduce_mean_hook``) or 'fsdp' (FSDP2 per block and at the
    root, over ``mesh``).

    ``attention``: 'sdpa' (fused, as real runs use: no s² tensor kept) or 'eager' (the s²
    probabilities written out, lesson 06's model). ``precision`` 'bf16-mixed' (default) or
    'fp16-mixed' is applied as a GPU run applies it:

    - single/DDP: autocast with CUDA's softmax in fp32 (``softmax_as_on_cuda``), fp32
      parameters, gradients and AdamW moments (4 + 4 + 8 = 16 bytes per parameter); the 16-bit
      weight copies autocast makes are kept for backward (2 bytes per parameter);
    - FSDP2: its ``MixedPrecisionPolicy`` (16-bit parameters gathered per unit and freed after
      its forward, gradients reduce-scattered in fp32, as TorchTitan configures it), no autocast:
      the same 16 bytes per parameter, sharded; activations 16-bit (eager attention's softmax in
      fp32, as LLaMA's reference code writes it); no weight copies kept.
    """
    checks.choice(strategy, "strategy", ("single", "ddp", "fsdp"))
    checks.choice(precision, "precision", PRECISIONS)
    if strategy != "single" and mesh is None:
        raise ValueError(f"strategy={strategy!r} needs mesh= (e.g. the one fake_world yields)")
    torch.manual_seed(0)
    model = softmax_as_on_cuda(TinyGPT(vocab, seq, layers, hidden, heads, recompute=recompute,
                                       attention=attention))
    module, forward_precision = model, precision
    if strategy == "ddp":
        module = _ddp(model)
    elif strategy == "fsdp":
        dtype = AUTOCAST_DTYPES[precision]
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) \
            if dtype is not None else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        forward_precision = "fp32"   # the policy casts; no autocast on top
    opt = make_optimizer(optimizer, model.parameters(), lr=3e-4, foreach=False)
    tokens = torch.randint(vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        gpt_loss(module, x, y, forward_precision).backward()
        opt.step()
    return measure(step, model=model, optimizer=opt)


class _FlashAttentionAsOnGPU(TorchFunctionMode):
    """Send ``F.scaled_dot_product_attention`` to CUDA's flash kernel. Why by hand: a torch
    without a GPU cannot ask the device which fused kernel it supports, so on fake CUDA tensors
    it falls back to the math path (s² scores kept); flash is one of the fused kernels a GPU
    may pick for a 16-bit causal run without a mask (which one depends on the GPU and torch).
    On fake tensors what it keeps is what torch's meta registration of the kernel declares."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            query, key, value = args[:3]
            extra = sorted(set(kwargs) - {"is_causal"})
            if extra or len(args) > 3:   # TinyGPT passes none; silently dropping one would mislead
                raise ValueError("_FlashAttentionAsOnGPU handles q, k, v and is_causal only; got "
                                 f"{extra} and {len(args)} positional")
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, is_causal=kwargs.get("is_causal", False))[0]
        return func(*args, **kwargs)


def gpt_forward_kept(device_type: str, *, layers: int, hidden: int, heads: int, vocab: int,
                     seq: int, batch: int, attention: str = "eager", precision: str = "bf16-mixed",
                     softmax_shim: bool | None = None) -> int:
    """Bytes the planner's GPT forward and loss (``gpt_loss``) keep for backward under
    ``device_type``'s autocast rules, on fake tensors of that device: "cuda" needs no GPU (the
    dispatcher applies CUDA's rules to fake CUDA tensors; backward would need one, hence the
    forward alone, ``ledger.kept_after_forward``). ``softmax_shim`` (default: on the CPU only)
    applies ``softmax_as_on_cuda``, as ``gpt_ledger`` does. ``attention="sdpa"`` on "cuda" runs
    CUDA's flash kernel (``_FlashAttentionAsOnGPU``), on "cpu" the CPU flash kernel the plan runs."""
    checks.choice(device_type, "device_type", ("cpu", "cuda"))
    checks.choice(attention, "attention", ("eager", "sdpa"))
    shim = device_type == "cpu" if softmax_shim is None else softmax_shim
    kernel = _FlashAttentionAsOnGPU() if device_type == "cuda" and attention == "sdpa" else contextlib.nullcontext()
    with fake_mode(), torch.device(device_type):
        torch.manual_seed(0)
        model = TinyGPT(vocab, seq, layers, hidden, heads, attention=attention)
        model = softmax_as_on_cuda(model) if shim else model
        x, y = torch.randint(vocab, (batch, seq)), torch.randint(vocab, (batch, seq))
        with kernel:
            return kept_after_forward(lambda: gpt_loss(model, x, y, precision, device_type), model=model)


def gathered_negatives_ledger(per_rank_batch: int, dim: int = 128):
    """Ledger of SimCLR's loss with negatives gathered from every rank
    (``nt_xent_local_with_global_negatives``), inside ``fake_world``: its communication is the
    all-gather of both views' B×d embeddings (and its backward)."""
    checks.positive_int(per_rank_batch, "per_rank_batch")
    z1 = torch.randn(per_rank_batch, dim, requires_grad=True)
    z2 = torch.randn(per_rank_batch, dim, requires_grad=True)
    return measure(lambda: nt_xent_local_with_global_negatives(z1, z2).backward())


# ---------------------------------------------------------------------------------------------
# One call for the planner widget: a named run, its per-device ledger, fit and time
# ---------------------------------------------------------------------------------------------
GPT_SIZES = {name: GPT_SHAPES[name] for name in ("GPT 1.3B", "GPT 7B", "GPT 13B")}
SSL_MODELS = {"SimCLR ResNet-50": "simclr", "MoCo v2 ResNet-50": "moco", "MAE ViT-L/16": "mae"}
PLANNED_MODELS = (*SSL_MODELS, *GPT_SIZES)


def plan_run(model: str, *, per_device_batch: int, devices: int, strategy: str = "ddp",
             recompute: str = "none", size: int | None = None, precision: str | None = None,
             optimizer: str | None = None, queue_size: int = 65536, mask_ratio: float = 0.75,
             attention: str = "sdpa", device_bytes: float = DEVICES["A100 80 GB"], peak_flops: float = 312e12,
             mfu: float = 0.4) -> dict:
    """Measure one step of ``model`` (``PLANNED_MODELS``) on fake tensors and ``devices`` fake
    ranks; return the per-device ledger ``record``, ``gathered_bytes`` (FSDP: the full 16-bit
    parameters of the root and of two blocks, the one computing and the one prefetched; counted,
    not measured), ``needed_bytes`` (resident + kept for backward + gathered), ``fits``,
    ``margin_bytes`` (device_bytes − needed), ``step_seconds`` = FLOPs / (peak × MFU) per device
    and ``assumptions``, the sentences to print beside the plan.

    ``size``: image size (SSL models, default 224) or sequence length (GPT, default 4096).
    ``precision`` (``memory.PRECISIONS``; default fp32 for the SSL models, bf16-mixed for GPT)
    and ``optimizer`` (``optim.OPTIMIZERS``; default each model's usual) change the step
    measured. ``strategy`` 'ddp' or 'fsdp', ``recompute`` and ``attention`` ('sdpa' or 'eager',
    see ``gpt_ledger``) apply to GPT only; ``queue_size`` to MoCo, ``mask_ratio`` to MAE."""
    checks.choice(model, "model", PLANNED_MODELS)
    checks.positive_int(devices, "devices")
    gpt = model in GPT_SIZES
    checks.choice(strategy, "strategy", ("ddp", "fsdp") if gpt else ("ddp",))
    if not gpt and recompute != "none":
        raise ValueError(f"recompute={recompute!r} is wired for the GPT models only; "
                         f"plan {model} with recompute='none'")
    precision = precision or ("bf16-mixed" if gpt else "fp32")
    strategy = strategy if devices > 1 else "single"
    gathered = 0
    with fake_world(max(devices, 2)) as mesh, fake_mode():   # one device: no collectives issued
        if gpt:
            shape = GPT_SIZES[model]
            record = gpt_ledger(**shape, vocab=32000, seq=size or 4096, batch=per_device_batch,
                                strategy=strategy, mesh=mesh, recompute=recompute,
                                precision=precision, optimizer=optimizer or "adamw",
                                attention=attention)
            if strategy == "fsdp":
                gathered = fsdp_gathered_bytes(hidden=shape["hidden"], vocab=32000,
                                               seq=size or 4096, precision=precision)
        else:
            record = ssl_ledger(SSL_MODELS[model], per_device_batch, image_size=size or 224,
                                ddp=devices > 1, queue_size=queue_size, mask_ratio=mask_ratio,
                                optimizer=optimizer, precision=precision)
    needed = record.resident_bytes + record.activation_bytes + gathered
    return {"record": record, "gathered_bytes": gathered, "needed_bytes": needed,
            "fits": needed <= device_bytes, "margin_bytes": device_bytes - needed,
            "step_seconds": record.flops / (peak_flops * mfu),
            "assumptions": assumptions(gpt, strategy, precision, attention)}


def fsdp_gathered_bytes(*, hidden: int, vocab: int, seq: int, precision: str) -> int:
    """Bytes of full parameters FSDP2 holds gathered at once for a ``TinyGPT`` sharded as
    ``gpt_ledger`` shards it: the root (embeddings, final norm; kept from forward to backward)
    and two blocks (the one computing and the one prefetched), 2 bytes each under a 16-bit
    policy, 4 in fp32. Counted from ``tinygpt_param_count``, not measured."""
    checks.choice(precision, "precision", PRECISIONS)
    root = tinygpt_param_count(0, hidden, vocab, seq)
    block = tinygpt_param_count(1, hidden, vocab, seq) - root
    return (4 if precision == "fp32" else 2) * (root + 2 * block)


def assumptions(gpt: bool, strategy: str, precision: str, attention: str) -> list[str]:
    """What a plan assumes about the GPU run, in words (``plan_run`` returns them)."""
    said = []
    if gpt:
        said.append("attention: fused scaled_dot_product_attention (flash: no s² scores kept)"
                    if attention == "sdpa" else
                    "attention: eager, the s² probabilities kept (6 bytes per score: softmax "
                    "upcast to fp32, plus the bf16 copy the next matmul saves)")
    if precision == "fp32":
        said.append("precision: fp32 throughout")
    elif strategy == "fsdp":
        said.append(f"precision: FSDP2 MixedPrecisionPolicy ({precision[:4]} parameters gathered per "
                    "block, fp32 gradient reduce-scatter, fp32 sharded state), no autocast")
    else:
        said.append(f"precision: CUDA autocast {precision[:4]} (softmax fp32), fp32 state; the "
                    "16-bit weight copies it makes are kept for backward; the loss outside "
                    "autocast on fp32 logits (this forward on fake CUDA tensors under CUDA's rules "
                    "keeps the same bytes with eager attention, and with flash only the "
                    "random-number state its meta kernel declares, 24 bytes per layer)")
    said.append("not counted: allocator caching and fragmentation, kernel workspaces, "
                "temporaries freed inside one op, communication buffers"
                + (", one block's unsharded gradients before their reduce-scatter" if strategy == "fsdp" else ""))
    return said


def ledger_lines(record) -> list[dict]:
    """Compute, then the six ledger lines of ``record``, as table rows (what the planner shows per
    device)."""
    return [{"line": "compute (TFLOP/step)", "per device": record.flops / 1e12},
            {"line": "repeated: recomputed in backward (TFLOP)", "per device": record.recomputed_flops / 1e12},
            {"line": "repeated: items encoded twice (re-encoded)",
             "per device": sum(record.re_encoded.values())},
            {"line": "kept for backward (GB)", "per device": record.activation_bytes / 1e9},
            {"line": "resident: params + grads + optimizer (GB)",
             "per device": (record.param_bytes + record.grad_bytes + record.optimizer_bytes) / 1e9},
            {"line": "cached (GB)", "per device": record.cache_bytes / 1e9},
            {"line": "encoded (items)", "per device": sum(record.encoded.values())},
            {"line": "communicated (GB sent)", "per device": record.comm_bytes / 1e9}]
