"""The encoders the lessons train: a CIFAR-style ResNet, a small ViT, an MLP, a projection head.

- ``resnet.py``: ``SmallResNet`` (and its ``BasicBlock``), the CIFAR ResNet of the SSL papers.
- ``vit.py``: ``ViT`` with ``Attention``, ``FeedForward``, ``TransformerBlock`` and
  ``sincos_position_embedding_2d``; its pieces (patchify, embed, encode tokens) run separately for MAE.
- ``heads.py``: ``MLP`` and ``ProjectionHead``.
- ``transformer.py``: ``TinyGPT`` (lesson 06's measurable GPT-like model) and ``GPT_SHAPES``, the
  one table of GPT-like shapes the kit sizes.
- ``llama.py``: ``Llama`` and ``LLAMA_SHAPES``, a Llama-3-shaped decoder (RMSNorm, RoPE,
  grouped-query attention, SwiGLU, untied output) as TorchTitan builds it, for lesson 11's check
  of the planner against TorchTitan's published memory figures.
- ``build.py``: ``build_encoder(name, image_size, in_channels)`` for the names in ``ENCODERS``,
  ``count_parameters`` and ``clone_module`` (``to_device``, for fake tensors, is the ledger's:
  ``course_utils.ledger.fake``).

Every model is small enough to train on two CPU cores at the lessons' CI/default scales and plain
enough that the ledger (course_utils.ledger) sees every operation: ReLUs are not in place (an
in-place op would overwrite a tensor another op saved for backward and hide a line of the ledger),
and ViT attention is explicit matmuls. Initialisation uses only torch's global RNG, so
``torch.manual_seed(s)`` before construction gives the same weights on every run and device.
"""
from __future__ import annotations

from .build import ENCODERS, build_encoder, clone_module, count_parameters
from .heads import MLP, ProjectionHead
from .resnet import BasicBlock, SmallResNet
from .llama import LLAMA_SHAPES, Llama
from .transformer import GPT_SHAPES, TinyGPT
from .vit import Attention, FeedForward, TransformerBlock, ViT, sincos_position_embedding_2d

__all__ = [
    "BasicBlock",
    "SmallResNet",
    "Attention",
    "FeedForward",
    "TransformerBlock",
    "ViT",
    "sincos_position_embedding_2d",
    "MLP",
    "ProjectionHead",
    "TinyGPT",
    "GPT_SHAPES",
    "Llama",
    "LLAMA_SHAPES",
    "build_encoder",
    "count_parameters",
    "clone_module",
    "ENCODERS",
]
