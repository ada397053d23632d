"""Catch "this tensor never left the host" on a CPU-only machine, before NCCL does on a GPU one.

Under gloo every tensor lives on the CPU, so a worker that builds ``torch.tensor([rank + 1])``
and all-reduces it runs fine here and raises on the first machine with GPUs (NCCL only takes
CUDA tensors). ``placement_checked`` runs any ``launch`` worker while simulating the host/device
split on the CPU:

- every tensor made by a factory (``torch.tensor``, ``zeros``, ``randn``, ``arange``, ...) without
  ``device=`` is marked *host-born*, as is every ``nn.Parameter`` built from one (``nn.Linear()``);
- ``.to(device)`` / ``.cuda()`` / ``Module.to(device)`` clear the mark (``.cpu()`` sets it);
- every other op passes the mark on when all its tensor inputs carry it; an op that mixes a
  host-born tensor (more than a scalar) with device tensors is an error, as it would be on CUDA;
- every tensor handed to a collective (``all_reduce``, gathers, scatters, ``broadcast``,
  ``batch_isend_irecv``), and every parameter given to ``DistributedDataParallel`` or a
  ``PipelineStage``, must be unmarked and on ``worker_device()``.

    launch(placement_checked, 2, "course_utils.experiments.data_parallel:hello_all_reduce")

raises ``PlacementError`` (through ``WorkerError``) at the first offending line. What it cannot
see: tensors made inside C++ (DDP's buckets, FSDP2's buffers, which torch places itself).
"""
from __future__ import annotations

import importlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from course_utils.distributed.launcher import worker_device

FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full,
             torch.randn, torch.rand, torch.randint, torch.arange, torch.linspace, torch.eye,
             torch.randperm, torch.normal}
COLLECTIVES = ("all_reduce", "all_gather_single", "all_gather_into_tensor", "all_gather",
               "reduce_scatter_single", "reduce_scatter_tensor", "broadcast", "reduce",
               "all_to_all_single", "batch_isend_irecv")
# CPU indices and cross-device copies are fine on CUDA
MIXING_ALLOWED = {"__getitem__", "__setitem__", "index_select", "masked_select", "copy_"}
MARK = "_course_host_born"


class PlacementError(RuntimeError):
    """A host tensor would reach a collective (or a GPU op) on a machine with GPUs."""


def _born(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, MARK, False)


def _mark(obj, value: bool) -> None:
    for t in tree_leaves(obj):
        if isinstance(t, torch.Tensor):
            try:
                if value:
                    setattr(t, MARK, True)
                elif MARK in t.__dict__:
                    delattr(t, MARK)
            except (AttributeError, RuntimeError):  # some C++ tensors take no attributes
                pass


def _moves_to_device(args, kwargs) -> bool:
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])


class HostTracker(TorchFunctionMode):
    """The mark-and-propagate rules of the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if func in FACTORIES:
            _mark(out, kwargs.get("device") is None)
        elif name in ("to", "cuda"):
            _mark(out, False if name == "cuda" or _moves_to_device(args, kwargs) else _born(args[0]))
        elif name == "cpu":
            _mark(out, True)
        elif name.startswith("new_"):
            _mark(out, _born(args[0]))
        else:
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            host = [t for t in inputs if _born(t)]
            if host and len(host) < len(inputs):
                big = [t for t in host if t.dim() > 0]
                if big and name not in MIXING_ALLOWED:
                    raise PlacementError(
                        f"{name} mixes a host tensor of shape {tuple(big[0].shape)} with device "
                        "tensors: on CUDA this raises. Create it with device=worker_device() or "
                        "move it with .to(device)")
            elif host:
                _mark(out, True)
        return out


def check_on_device(tensors, where: str) -> None:
    """Raise PlacementError unless every tensor is device-born and on ``worker_device()``."""
    device = worker_device()
    for t in tree_leaves(tensors):
        if isinstance(t, dist.P2POp):
            t = t.tensor
        if not isinstance(t, torch.Tensor):
            continue
        if _born(t) or t.device.type != device.type:
            raise PlacementError(f"{where} got a tensor of shape {tuple(t.shape)} on the host "
                                 f"(it was never moved to {device}): under NCCL this raises")


def _wrap_collective(name, original):
    def checked(*args, **kwargs):
        check_on_device((args, kwargs), f"dist.{name}")
        return original(*args, **kwargs)
    checked.placement_checked = True
    return checked


def _install() -> None:
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is not None and not getattr(original, "placement_checked", False):
            setattr(dist, name, _wrap_collective(name, original))

    new_parameter = nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):
        p = new_parameter(cls, data, requires_grad)
        _mark(p, _born(data))
        return p
    nn.Parameter.__new__ = parameter

    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp_init = DDP.__init__

    def ddp(self, module, *args, **kwargs):
        check_on_device(list(module.parameters()) + list(module.buffers()), "DistributedDataParallel")
        ddp_init(self, module, *args, **kwargs)
    DDP.__init__ = ddp

    try:
        from torch.distributed.pipelining import stage
    except ImportError:  # pragma: no cover
        return
    stage_init = stage.PipelineStage.__init__

    def pipeline_stage(self, submodule, *args, **kwargs):
        check_on_device(list(submodule.parameters()), "PipelineStage")
        stage_init(self, submodule, *args, **kwargs)
    stage.PipelineStage.__init__ = pipeline_stage


def host_tensor_example(rank: int, world_size: int) -> float:
    """The bug this module exists to catch: an all-reduce of a tensor built on the host."""
    value = torch.tensor([float(rank + 1)])      # no device=: the CPU, whatever the backend
    dist.all_reduce(value)
    return value.item()


def placement_checked(rank: int, world_size: int, worker: str, *args):
    """Run ``worker`` ('module:function') on this rank with host tensors tracked (see above)."""
    module, _, name = worker.partition(":")
    _install()
    fn = getattr(importlib.import_module(module), name)
    with HostTracker():
        return fn(rank, world_size, *args)
