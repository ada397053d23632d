"""Step functions for course_utils.train.fit: one objective update each, batch -> metrics.

Every builder returns `step(batch)` that does forward, backward and the optimizer update and
returns a dict with "loss" (what fit records). A batch is (images, labels) as yielded by
ImageDataset.batches, or (images, labels, ids) where ids index the dataset (MoCo stores them
with its keys to measure staleness). Views are made on the batch's device with the kit's
batched augmentations, so the data pipeline is a few tensor ops, not a DataLoader.
"""
from __future__ import annotations

import torch

from .mae import MAE
from .moco import MoCo
from .simclr import SimCLR
from .supervised import Supervised


def _unpack(batch):
    if isinstance(batch, torch.Tensor):
        return batch, None, None
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise ValueError("a batch must be images, (images, labels) or (images, labels, ids)")
    images, labels = batch[0], batch[1]
    return images, labels, (batch[2] if len(batch) == 3 else None)


def _update(optimizer, loss):
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def simclr_step(model: SimCLR, optimizer, augment, generator: torch.Generator | None = None,
                accumulation: int = 1):
    """Two views per image, NT-Xent over the batch. With accumulation=k the batch is split into k
    micro-batches whose gradients are summed before one update (same images back-propagated,
    but each anchor sees only the 2N/k - 1 candidates of its own micro-batch)."""
    if not isinstance(model, SimCLR):
        raise TypeError(f"simclr_step needs a SimCLR model, got {type(model).__name__}")
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ValueError(f"accumulation must be a positive int, got {accumulation!r}")

    def step(batch):
        images, _, _ = _unpack(batch)
        if images.shape[0] % accumulation:
            raise ValueError(f"batch {images.shape[0]} is not divisible into {accumulation} micro-batches")
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for chunk in images.chunk(accumulation):
            loss = model(augment(chunk, generator), augment(chunk, generator)) / accumulation
            loss.backward()
            total += loss.detach()
        optimizer.step()
        return {"loss": total}
    return step


def moco_step(model: MoCo, optimizer, augment, generator: torch.Generator | None = None):
    """Query and key views, logits against the queue, update; the model enqueues the keys."""
    if not isinstance(model, MoCo):
        raise TypeError(f"moco_step needs a MoCo model, got {type(model).__name__}")

    def step(batch):
        images, _, ids = _unpack(batch)
        loss = model(augment(images, generator), augment(images, generator), ids=ids,
                     generator=generator)
        _update(optimizer, loss)
        return {"loss": loss.detach()}
    return step


def mae_step(model: MAE, optimizer, generator: torch.Generator | None = None, augment=None):
    """Random masking, encode the visible patches, decode, loss on masked patches, update."""
    if not isinstance(model, MAE):
        raise TypeError(f"mae_step needs an MAE model, got {type(model).__name__}")

    def step(batch):
        images, _, _ = _unpack(batch)
        if augment is not None:
            images = augment(images, generator)
        loss, _, _ = model(images, generator)
        _update(optimizer, loss)
        return {"loss": loss.detach()}
    return step


def supervised_step(model: Supervised, optimizer, augment=None, generator: torch.Generator | None = None):
    """One (optionally augmented) view per image, cross-entropy on the labels, update."""
    if not isinstance(model, Supervised):
        raise TypeError(f"supervised_step needs a Supervised model, got {type(model).__name__}")

    def step(batch):
        images, labels, _ = _unpack(batch)
        if labels is None:
            raise ValueError("supervised_step needs (images, labels) batches")
        if augment is not None:
            images = augment(images, generator)
        loss = model(images, labels)
        _update(optimizer, loss)
        return {"loss": loss.detach()}
    return step


def indexed_batches(dataset, batch_size: int, generator: torch.Generator | None = None):
    """Like dataset.batches, but yields (images, labels, ids) so a queue can remember which
    image each key came from. One epoch per call."""
    if batch_size < 1 or batch_size > len(dataset):
        raise ValueError(f"batch_size must be in [1, {len(dataset)}], got {batch_size}")
    gen_device = generator.device if generator is not None else torch.device("cpu")
    order = torch.randperm(len(dataset), generator=generator, device=gen_device)
    for b in range(len(dataset) // batch_size):
        idx = order[b * batch_size:(b + 1) * batch_size]
        dev_idx = idx.to(dataset.images.device)
        yield dataset.images[dev_idx], dataset.labels[dev_idx], idx
