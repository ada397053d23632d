"""Measured training memory: lesson 06's TinyGPT steps under the ledger (the measured side of the
predictor in ``course_utils.memory``), and what a contrastive loss alone keeps (lesson 02).

``measure_tinygpt`` builds ``course_utils.models.transformer.TinyGPT`` and returns the ledger of one
training step; ``recompute_tradeoff`` measures what each recomputation mode keeps (stored
activation bytes) against what it pays (FLOPs, wall time).
"""
from __future__ import annotations

import contextlib
import time

import torch

from .. import checks
from ..ledger import autocast_rules, fake_mode, kept_after_forward, measure, utilisation
from ..ledger.fake import to_device
from ..objectives.simclr import nt_xent_loss, nt_xent_loss_tiled
from ..optim import make_optimizer
from ..models.transformer import RECOMPUTE_MODES, TinyGPT, random_tokens


def measure_tinygpt(layers: int, hidden: int, heads: int, vocab: int, seq: int, batch: int, *,
                    optimizer: str = "adamw", recompute: str = "none", autocast: bool = False,
                    device="cpu", seed: int = 0, steps: int = 1):
    """Build TinyGPT, run ``steps`` training steps and return the ledger of the last one.

    One step before measuring (when ``steps`` > 1) creates the optimizer states; ``optimizer`` is a
    name in ``course_utils.optim.OPTIMIZERS`` (lr 1e-3); ``autocast`` runs forward under bf16
    autocast (CPU and CUDA). Returns (LedgerRecord, model).
    """
    checks.positive_int(steps, "steps")
    device = checks.device(device)
    torch.manual_seed(seed)
    model = to_device(TinyGPT(vocab, seq, layers, hidden, heads, recompute=recompute), device)
    opt = make_optimizer(optimizer, model.parameters())
    x, y = random_tokens(batch, seq, vocab, generator=torch.Generator().manual_seed(seed), device=device)
    ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

    def step():
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = model.loss(x, y)
        loss.backward()
        opt.step()

    for _ in range(steps - 1):
        step()
    return measure(step, model=model, optimizer=opt), model


def tinygpt_kept_under_rules_of(device_type: str, layers: int, hidden: int, heads: int, vocab: int,
                                seq: int, batch: int, *, recompute: str = "none") -> int:
    """Bytes ``measure_tinygpt``'s bf16 autocast forward and loss keep for backward under
    ``device_type``'s autocast rules, on fake tensors of that device: "cuda" needs no GPU (the
    dispatcher applies CUDA's rules to fake CUDA tensors). The forward only
    (``ledger.kept_after_forward``): backward on fake CUDA tensors needs a CUDA context."""
    checks.choice(device_type, "device_type", ("cpu", "cuda"))
    with fake_mode(), torch.device(device_type):
        torch.manual_seed(0)
        model = TinyGPT(vocab, seq, layers, hidden, heads, recompute=recompute)
        x, y = random_tokens(batch, seq, vocab, device=device_type)
        with autocast_rules(device_type, torch.bfloat16):
            return kept_after_forward(lambda: model.loss(x, y), model=model)


def recompute_tradeoff(layers: int, hidden: int, heads: int, vocab: int, seq: int, batch: int, *,
                       modes=RECOMPUTE_MODES, device="cpu", repeats: int = 3, seed: int = 0) -> list:
    """For each recomputation mode: stored activation bytes and FLOPs (ledger) and the median
    wall time of a training step, plus ratios to ``"none"``.

    Rows: mode, activation_bytes, flops, forward_flops, recomputed_flops (the ledger's *repeated*
    line: forwards re-run in backward), seconds, memory_ratio, flops_ratio, time_ratio, and
    mfu: the step's FLOPs per second over this machine's measured matmul peak (``speed``).
    """
    checks.positive_int(repeats, "repeats")
    rows = []
    for mode in modes:
        record, model = measure_tinygpt(layers, hidden, heads, vocab, seq, batch, optimizer="sgd",
                                        recompute=mode, device=device, seed=seed)
        x, y = random_tokens(batch, seq, vocab, generator=torch.Generator().manual_seed(seed),
                             device=device)
        seconds = _median_step_time(lambda: _fresh_backward(model, x, y), repeats, device)
        rows.append({"mode": mode, "activation_bytes": record.activation_bytes,
                     "flops": record.flops, "forward_flops": record.forward_flops,
                     "recomputed_flops": record.recomputed_flops, "seconds": seconds,
                     "mfu": utilisation(record.flops, seconds, device)["mfu"]})
    base = next((r for r in rows if r["mode"] == "none"), rows[0])
    for r in rows:
        r["memory_ratio"] = r["activation_bytes"] / base["activation_bytes"]
        r["flops_ratio"] = r["flops"] / base["flops"]
        r["time_ratio"] = r["seconds"] / base["seconds"]
    return rows


def _fresh_backward(model, x, y) -> None:
    """Forward and backward from no gradients, as every timed step (and the warm-up) starts:
    accumulating into existing ones would time a different step from the first."""
    model.zero_grad(set_to_none=True)
    model.loss(x, y).backward()


def _median_step_time(step, repeats: int, device) -> float:
    cuda = checks.device(device).type == "cuda"   # synchronise only where the step runs on CUDA
    step()  # warm-up
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def nt_xent_kept_bytes(n: int, dim: int, *, temperature: float = 0.5, tile: int | None = None,
                       device="cpu", seed: int = 0) -> int:
    """Bytes the NT-Xent loss alone keeps for backward on two n×dim embedding batches (the plain
    loss keeps its 2n×2n logits, O(n²); with ``tile`` the tiled loss keeps O(n·dim)), measured by
    the ledger around one forward + backward of the loss on random embeddings."""
    checks.positive_int(n, "n")
    checks.positive_int(dim, "dim")
    if tile is not None:
        checks.positive_int(tile, "tile")
    gen = torch.Generator().manual_seed(seed)
    z1, z2 = (torch.randn(n, dim, generator=gen).to(device).requires_grad_() for _ in range(2))
    if tile is None:
        return measure(lambda: nt_xent_loss(z1, z2, temperature).backward()).activation_bytes
    return measure(lambda: nt_xent_loss_tiled(z1, z2, temperature, tile).backward()).activation_bytes
