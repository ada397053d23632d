"""The one contract every objective keeps, and the one step builder that trains any of them.

An objective is an ``nn.Module`` with

    training_loss(batch, *, augment=None, generator=None) -> dict   at least {"loss": scalar}
    encoder          the module a probe evaluates (images -> features)
    caches           tensors kept across steps (booked by the ledger as "cached")
    ledger_encoders  name -> module whose inputs the ledger counts as "encoded now"

A batch is ``images``, ``(images, labels)`` or ``(images, labels, ids)`` (ids index the dataset;
MoCo stores them with its keys to measure staleness). ``augment(images, generator)`` makes one
view; the objective decides how many views it needs. ``make_step`` turns any objective into a
``step(batch) -> {"loss", ...}`` for ``course_utils.train.fit``.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import NamedTuple

import torch
import torch.nn as nn

from .. import checks
from .gradient_cache import gradient_cache_backward


class Batch(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor | None = None
    ids: torch.Tensor | None = None

    def chunk(self, parts: int) -> list["Batch"]:
        """Split every present field into ``parts`` equal micro-batches along the batch dim."""
        if self.images.shape[0] % parts:
            raise ValueError(f"batch of {self.images.shape[0]} is not divisible into {parts} "
                             "micro-batches; pick a batch size that is a multiple of accumulation")
        fields = [t.chunk(parts) if t is not None else [None] * parts for t in self]
        return [Batch(*f) for f in zip(*fields)]


def as_batch(batch) -> Batch:
    """images | (images, labels) | (images, labels, ids) -> Batch."""
    if isinstance(batch, torch.Tensor):
        return Batch(batch)
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise ValueError("a batch must be images, (images, labels) or (images, labels, ids), "
                         f"got {type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""))
    checks.tensor(batch[0], "batch images", shape_hint="B×... (B×C×H×W for images)")
    return Batch(*batch)


class Objective(nn.Module):
    """Base class: subclasses set ``self.encoder`` and implement ``training_loss``."""

    encoder: nn.Module

    def training_loss(self, batch, *, augment=None, generator: torch.Generator | None = None) -> dict:
        raise NotImplementedError

    @property
    def caches(self) -> tuple:
        return ()

    @property
    def ledger_encoders(self) -> dict:
        return {"encoder images": self.encoder}


class _BatchViews:
    """``augment`` applied to the whole batch, served to its micro-batches.

    The objective calls ``augment(micro_images, generator)`` once per view it needs; the i-th call
    of micro-batch m returns part m of the whole batch's i-th view (B×... split into ``parts``),
    drawn on the first micro-batch that asks for it, so every view is drawn once, from the
    generator state a single-batch step would draw it from.
    """

    def __init__(self, augment, images: torch.Tensor, parts: int):
        self.augment, self.images, self.parts = augment, images, parts
        self.views: list[tuple[torch.Tensor, ...]] = []

    def of_part(self, part: int):
        calls = itertools.count()

        def view(micro_images: torch.Tensor, generator=None) -> torch.Tensor:
            i = next(calls)
            if i == len(self.views):
                self.views.append(self.augment(self.images, generator).chunk(self.parts))
            piece = self.views[i][part]
            if piece.shape[0] != micro_images.shape[0]:
                raise RuntimeError(f"micro-batch {part} has {micro_images.shape[0]} images but its "
                                   f"part of the batch's view has {piece.shape[0]}")
            return piece
        return view


def make_step(model: Objective, optimizer: torch.optim.Optimizer, *, augment=None,
              generator: torch.Generator | None = None, accumulation: int = 1, chunks: int = 1,
              autocast: torch.dtype | None = None, scheduler=None):
    """-> ``step(batch)``: forward, backward and one optimizer update; returns {"loss", ...}.

    accumulation=k splits the batch into k micro-batches whose gradients are summed (each scaled
    by 1/k) before one update: the same images are back-propagated, but a contrastive anchor sees
    only the candidates of its own micro-batch, and MoCo updates its key encoder and queue once
    per micro-batch. The views are drawn once for the whole batch (``augment`` sees the B images,
    as a data loader would), and micro-batch m gets rows m·B/k..(m+1)·B/k of each view: with or
    without accumulation the same views go through the model, so the arms differ in the
    micro-batching alone. chunks=k (SimCLR only) is gradient caching instead: the whole batch's loss,
    every candidate kept, with the encoder back-propagated k chunks at a time
    (``gradient_cache``). autocast (torch.bfloat16 or torch.float16) runs forward under
    ``torch.autocast``; float16 adds a GradScaler (fp16 gradients underflow without one).
    scheduler (a torch LR scheduler) is stepped after every update and its LR reported as "lr".
    """
    checks.instance(model, "model", Objective, what="a course_utils.objectives objective "
                    "(Supervised, SimCLR, MoCo or MAE)")
    checks.instance(optimizer, "optimizer", torch.optim.Optimizer)
    checks.generator(generator)
    checks.positive_int(accumulation, "accumulation")
    checks.positive_int(chunks, "chunks")
    if chunks > 1 and not (callable(getattr(model, "embed", None)) and callable(getattr(model, "loss", None))):
        raise TypeError("chunks= (gradient caching) needs an objective whose loss sees the batch only "
                        f"through per-image embeddings (SimCLR: .embed and .loss), got {type(model).__name__}")
    if chunks > 1 and accumulation > 1:
        raise ValueError("pass chunks= or accumulation=, not both: chunks keeps every candidate at "
                         "the memory of a chunk, accumulation drops the other micro-batches' candidates")
    if autocast is not None:
        checks.choice(autocast, "autocast", (torch.bfloat16, torch.float16))
    device_type = next(model.parameters()).device.type
    scaler = torch.amp.GradScaler(device_type) if autocast == torch.float16 else None

    def forward_context():
        if autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=autocast)

    def backward(micro, augment) -> torch.Tensor:
        if chunks > 1:
            if augment is None:
                raise ValueError("gradient caching needs augment= to make two views of each image")
            # the views go straight into the call, which then holds the only references to them
            return gradient_cache_backward(model, model.embed, augment(micro.images, generator),
                                           augment(micro.images, generator), model.loss, chunks=chunks,
                                           scale=scaler.scale if scaler else (lambda t: t))
        loss = model.training_loss(micro, augment=augment, generator=generator)["loss"] / accumulation
        (scaler.scale(loss) if scaler else loss).backward()
        return loss.detach()

    def step(batch) -> dict:
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        batch = as_batch(batch)
        views = _BatchViews(augment, batch.images, accumulation) if augment is not None and accumulation > 1 else None
        for part, micro in enumerate(batch.chunk(accumulation)):
            with forward_context():
                total += backward(micro, views.of_part(part) if views else augment)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        metrics = {"loss": total}
        if scheduler is not None:
            scheduler.step()
            metrics["lr"] = scheduler.get_last_lr()[0]
        return metrics
    return step
