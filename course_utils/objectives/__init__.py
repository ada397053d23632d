"""The learning objectives of lessons 02-05, one module each, behind one contract (``base``).

- ``supervised`` the cross-entropy baseline the others are compared with in lesson 05.
- ``simclr``     in-batch contrastive (NT-Xent over 2N views): candidates = images in the batch.
- ``moco``       a queue of K past keys and a momentum key encoder: candidates from history.
- ``mae``        masked autoencoding: the encoder sees only the visible patches.
- ``simsiam``    no negatives: a predictor and a stop-gradient keep two views' features apart
                 from the constant solution.

Every objective is an ``nn.Module`` with ``training_loss(batch, *, augment=None,
generator=None) -> {"loss", ...}``, ``.encoder`` (what a probe evaluates), ``.caches`` and
``.ledger_encoders``; ``make_step(model, optimizer, ...)`` trains any of them. Each module's
docstring states its formula and tensor shapes; every kernel runs unchanged on CPU and CUDA
(generators and index tensors follow the inputs' device).
"""
from .base import Batch, Objective, as_batch, make_step
from .mae import MAE
from .moco import MoCo
from .simclr import SimCLR
from .simsiam import SimSiam
from .supervised import Supervised

__all__ = ["Objective", "Batch", "as_batch", "make_step", "Supervised", "SimCLR", "MoCo", "MAE", "SimSiam"]
