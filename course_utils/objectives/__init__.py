"""The learning objectives of lessons 02-05, one module each, as real training kernels.

- ``simclr``     in-batch contrastive (NT-Xent over 2N views): candidates = images in the batch.
- ``moco``       a queue of K past keys and a momentum key encoder: candidates from history.
- ``mae``        masked autoencoding: the encoder sees only the visible patches.
- ``supervised`` the cross-entropy baseline the others are compared with in lesson 05.

Each module's docstring states its formula and tensor shapes; every kernel runs unchanged on
CPU and CUDA (generators and index tensors follow the inputs' device).
"""
from . import mae, moco, simclr, steps, supervised  # noqa: F401

__all__ = ["simclr", "moco", "mae", "supervised", "steps"]
