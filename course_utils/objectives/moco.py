"""MoCo: contrastive learning whose negatives come from a queue of past keys.

A query encoder f_q (trained by backprop) and a key encoder f_k (an exponential moving average of
f_q, never back-propagated) encode two views of the same B images:

    q = normalize(f_q(view_q))                         B×d   (kept for backward)
    k = normalize(f_k(view_k))                         B×d   (no_grad: nothing kept)
    logits = [ q·k  |  q·queue^T ] / T                 B×(1+K)
    loss   = cross_entropy(logits, 0)                  the positive is column 0
    after the step:  queue <- enqueue(k)               FIFO ring buffer of the last K keys
                     θ_k  <- m θ_k + (1 - m) θ_q       (done before encoding keys, as in MoCo)

Every anchor is compared against exactly K negatives, however small B is: the candidates come
from history, not from the batch. The price is staleness: a key written s steps ago was made by
an older f_k. A slow momentum (m ≈ 0.99-0.999) keeps old and new keys consistent; m = 0 makes
f_k jump with f_q every step and the queue mixes incomparable keys (the paper reports failure).

BatchNorm leak: with one BN batch for all queries, a sample can tell which key is its positive
through batch statistics. MoCo shuffles keys across GPUs ("shuffle BN"). On one device we do the
same with `bn_groups` virtual devices: the batch is encoded as G separate chunks (each chunk has
its own BN statistics), and keys are shuffled before chunking, so the BN group that normalises a
key is a random draw, not the query's own group. With G groups a key's group still shares about
1/G of its members with its query's group (`bn_group_overlap` computes it exactly), so on one
device the shuffle *reduces* the leak rather than removing it. G=1, or shuffle_keys=False, turns
the protection off (every key is normalised with exactly its query's group).

Shapes: queue.keys K×d (registered buffer: in the state dict, in checkpoints, in the ledger's
cache line, K·d·4 bytes in fp32); queue.ptr 0-dim int64; queue.written_at, queue.ids K int64.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checks
from ..evaluate import eval_mode
from ..models import clone_module
from .base import Objective, as_batch


class FeatureQueue(nn.Module):
    """FIFO ring buffer of `size` key vectors of width `dim`.

    `.enqueue(keys)` writes a B×dim batch at `.ptr` and advances `ptr = (ptr + B) % size`.
    When size % B != 0 a batch can straddle the end: its first (size - ptr) rows go to the end of
    the buffer and the rest to the start, so the buffer always holds exactly the last `size` keys
    enqueued (tested). A batch larger than the queue would overwrite its own rows and raises.

    Besides the keys the queue records, per slot, the enqueue call that wrote it (`written_at`,
    -1 for the random initial keys) and an optional item id (`ids`, -1 if unknown), so staleness
    can be measured: `ages()` = number of enqueue calls since each slot was written.
    """

    def __init__(self, size: int, dim: int, generator: torch.Generator | None = None):
        super().__init__()
        checks.positive_int(size, "size")
        checks.positive_int(dim, "dim")
        self.size, self.dim = size, dim
        init = F.normalize(torch.randn(size, dim, generator=generator), dim=1)
        self.register_buffer("keys", init)                                   # K×d
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))       # next slot
        self.register_buffer("written_at", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ids", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("num_enqueued", torch.zeros((), dtype=torch.long))  # calls so far

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        if not isinstance(keys, torch.Tensor) or keys.dim() != 2:
            raise ValueError(f"keys must be a B×{self.dim} tensor, got "
                             f"{getattr(keys, 'shape', type(keys).__name__)}")
        b, d = keys.shape
        if d != self.dim:
            raise ValueError(f"keys have dim {d} but the queue stores dim {self.dim}; "
                             "project to the queue's dim or build FeatureQueue(size, dim=...)")
        if b > self.size:
            raise ValueError(f"batch of {b} keys is larger than the queue ({self.size}); "
                             "use a queue at least as large as the batch")
        if ids is not None and (not isinstance(ids, torch.Tensor) or ids.shape != (b,)):
            raise ValueError(f"ids must be an int tensor of shape ({b},), got "
                             f"{getattr(ids, 'shape', type(ids).__name__)}")
        # Pointer arithmetic stays in tensors (no int(self.ptr)): no host sync on a GPU, and the
        # step runs on fake tensors, whose values are unknown (course_utils.ledger.fake_mode).
        slots = (torch.arange(b, device=self.keys.device) + self.ptr) % self.size   # wraps
        self.keys[slots] = keys.detach().to(self.keys.device, self.keys.dtype)
        self.written_at[slots] = self.num_enqueued
        self.ids[slots] = (ids.to(self.ids.device, torch.long) if ids is not None
                           else torch.full_like(slots, -1))
        self.ptr.copy_((self.ptr + b) % self.size)
        self.num_enqueued += 1

    def ages(self) -> torch.Tensor:
        """K int64: enqueue calls since each slot was written (1 = written by the last call)."""
        return self.num_enqueued - self.written_at

    def filled(self) -> torch.Tensor:
        """K bool: slots holding a real key (not the random initialisation)."""
        return self.written_at >= 0

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}"


def shuffle_batch(x: torch.Tensor, generator: torch.Generator | None = None):
    """Random permutation of the batch: returns (x[perm], unshuffle_index) with
    x[perm][unshuffle_index] == x."""
    gen_device = generator.device if generator is not None else x.device
    perm = torch.randperm(x.shape[0], generator=generator, device=gen_device).to(x.device)
    return x[perm], torch.argsort(perm)


def unshuffle_batch(x: torch.Tensor, unshuffle_index: torch.Tensor) -> torch.Tensor:
    return x[unshuffle_index]


def encode_in_groups(encoder: nn.Module, x: torch.Tensor, groups: int) -> torch.Tensor:
    """Encode x as `groups` separate chunks, so each chunk gets its own BatchNorm statistics
    (split-BN: `groups` virtual devices on one device). B×... → B×d."""
    if groups > 1 and x.shape[0] < 2 * groups:
        raise ValueError(f"batch of {x.shape[0]} cannot be split into {groups} BatchNorm groups "
                         f"of at least 2 samples; use a batch >= {2 * groups} or fewer bn_groups")
    return torch.cat([encoder(chunk) for chunk in x.chunk(groups)])


def bn_group_overlap(perm: torch.Tensor, groups: int) -> torch.Tensor:
    """Exact BN-group overlap of shuffle-BN, per sample.

    Queries are encoded in ``groups`` contiguous chunks of the batch; keys are encoded as the
    chunks of ``x[perm]``. For each sample i, returns the fraction of the members of the BN group
    that normalised key i that also sit in the BN group that normalised query i (1.0 = the key
    saw exactly its query's batch statistics; groups=1 or perm = identity give 1.0 everywhere).
    """
    b = perm.shape[0]
    size = -(-b // groups)                                   # torch.chunk's chunk size
    query_group = torch.arange(b) // size                    # sample -> its query group
    position = torch.argsort(perm.cpu())                     # sample -> its row in x[perm]
    key_group_rows = position // size                        # sample -> its key group
    members = query_group[perm.cpu()]                        # row -> query group of its sample
    same = members.unsqueeze(0) == query_group.unsqueeze(1)  # [i, row]: row's sample in i's query group
    in_key_group = (torch.arange(b) // size).unsqueeze(0) == key_group_rows.unsqueeze(1)
    return (same & in_key_group).sum(1).float() / in_key_group.sum(1).float()


def _output_dim(projector: nn.Module) -> int:
    """The width of the projector's output: ``.out_dim`` or the last Linear's out_features."""
    if isinstance(getattr(projector, "out_dim", None), int):
        return projector.out_dim
    linears = [m for m in projector.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("cannot tell the projector's output width (no .out_dim, no nn.Linear); "
                         "use course_utils.models.ProjectionHead or give the module an out_dim")
    return linears[-1].out_features


class MoCo(Objective):
    """Query encoder + momentum key encoder + feature queue (formula in the module docstring).

    backbone (images → features) and projector (features → d) make the query encoder f_q, as in
    SimCLR; the key encoder f_k is a copy of both. ``encoder`` is the query backbone (what the
    probe evaluates). forward(view_q, view_k, ids=None, generator=None) → scalar loss; in
    training mode it also does the momentum update (before encoding keys) and enqueues the new
    keys (after the logits are formed, so this step's keys are never their own negatives).
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module, *, queue_size: int = 1024,
                 momentum: float = 0.99, temperature: float = 0.2, bn_groups: int = 2,
                 shuffle_keys: bool = True):
        super().__init__()
        checks.instance(backbone, "backbone", nn.Module)
        checks.instance(projector, "projector", nn.Module)
        self.momentum = checks.fraction(momentum, "momentum", closed_right=True, hint="typical 0.99-0.999")
        self.temperature = checks.positive_float(temperature, "temperature", hint="typical 0.07-0.2")
        self.bn_groups = checks.positive_int(bn_groups, "bn_groups", hint="1 = no shuffle-BN")
        self.shuffle_keys = checks.instance(shuffle_keys, "shuffle_keys", bool)
        self.encoder = backbone
        self.query_encoder = nn.Sequential(backbone, projector)
        self.key_encoder = clone_module(self.query_encoder)  # starts identical to the query encoder
        self.key_encoder.requires_grad_(False)                # trained only by EMA, never by backprop
        self.queue = FeatureQueue(queue_size, _output_dim(projector))

    @property
    def caches(self) -> tuple:
        # the keys plus the queue's per-slot bookkeeping (pointer, ages, ids): all kept across steps
        return tuple(self.queue.buffers())

    @property
    def ledger_encoders(self) -> dict:
        return {"encoder images": self.encoder, "key encoder images": self.key_encoder[0]}

    @torch.no_grad()
    def momentum_update(self) -> None:
        """θ_k ← m·θ_k + (1 − m)·θ_q for every parameter (BN running statistics of the key
        encoder come from its own forward passes, as in the reference MoCo)."""
        for p_q, p_k in zip(self.query_encoder.parameters(), self.key_encoder.parameters()):
            p_k.mul_(self.momentum).add_(p_q.detach(), alpha=1.0 - self.momentum)

    def encode_queries(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(encode_in_groups(self.query_encoder, x, self.bn_groups), dim=1)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features MoCo's loss compares for ``x``: its queries, as SimCLR's and SimSiam's
        ``embed`` give theirs (so diagnostics read every objective the same way)."""
        return self.encode_queries(x)

    @torch.no_grad()
    def encode_keys(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # The permutation is drawn even when it is not used, so that a run without the shuffle
        # consumes the same random numbers as a run with it: the two see the same augmentations
        # at every step and differ in the shuffle alone.
        shuffled, unshuffle = shuffle_batch(x, generator)
        if self.bn_groups == 1 or not self.shuffle_keys:   # each key normalised with its query's group
            return F.normalize(encode_in_groups(self.key_encoder, x, self.bn_groups), dim=1)
        k = encode_in_groups(self.key_encoder, shuffled, self.bn_groups)
        return F.normalize(unshuffle_batch(k, unshuffle), dim=1)

    def contrastive_logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q, k: B×d normalised → logits B×(1+K), positive in column 0."""
        l_pos = (q * k).sum(dim=1, keepdim=True)                     # B×1
        # clone: the queue is overwritten in place after this step, but backward still needs the
        # negatives it was compared against
        l_neg = q @ self.queue.keys.clone().t()                      # B×K
        return torch.cat([l_pos, l_neg], dim=1) / self.temperature

    def forward(self, view_q: torch.Tensor, view_k: torch.Tensor, ids: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        if view_q.shape != view_k.shape:
            raise ValueError(f"the two views must have the same shape, got "
                             f"{tuple(view_q.shape)} and {tuple(view_k.shape)}")
        if view_q.shape[0] > self.queue.size:
            raise ValueError(f"batch {view_q.shape[0]} is larger than the queue "
                             f"({self.queue.size}); use queue_size >= batch size")
        if self.training:
            self.momentum_update()
        q = self.encode_queries(view_q)                              # B×d, kept for backward
        k = self.encode_keys(view_k, generator)                      # B×d, no graph
        logits = self.contrastive_logits(q, k)
        labels = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        loss = F.cross_entropy(logits, labels)
        if self.training:
            self.queue.enqueue(k, ids)
        return loss

    def training_loss(self, batch, *, augment=None, generator=None) -> dict:
        if augment is None:
            raise ValueError("MoCo needs augment= to make a query and a key view of each image "
                             "(e.g. course_utils.augment.SimCLRAugment(image_size))")
        images, _, ids = as_batch(batch)
        return {"loss": self(augment(images, generator), augment(images, generator), ids=ids,
                             generator=generator)}


@torch.no_grad()
def queue_staleness(model: MoCo, images: torch.Tensor, batch_size: int = 256):
    """Re-encode the images behind the filled queue slots with today's key encoder.

    images: the dataset tensor N×C×H×W that `ids` index into (the same images that were
    enqueued; pass the un-augmented ones to see encoder drift only). Returns (ages, cosine), both
    1-D over filled slots with a known id: the age of each stored key in enqueue calls and the
    cosine between the stored key and the same image encoded now (1 = not stale at all).
    """
    keep = model.queue.filled() & (model.queue.ids >= 0)
    ids = model.queue.ids[keep]
    stored = model.queue.keys[keep]
    with eval_mode(model.key_encoder) as key_encoder:
        fresh = torch.cat([key_encoder(images[ids[i:i + batch_size].to(images.device)].to(stored.device))
                           for i in range(0, len(ids), batch_size)]) if len(ids) else stored[:0]
    cosine = (F.normalize(fresh, dim=1) * stored).sum(dim=1)
    return model.queue.ages()[keep], cosine
