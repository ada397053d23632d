"""Catch device bugs on a CPU-only machine, before CUDA or NCCL does on a GPU one.

On the CPU every tensor lives in one place, so code that compares a checkpoint loaded to the host
with a model's weights, feeds a batch that was never moved to a moved model, or all-reduces
``torch.tensor([rank + 1])`` runs fine here and raises on the first machine with a GPU. This
module simulates the host/device split on the CPU:

- every tensor made by a factory (``torch.tensor``, ``zeros``, ``randn``, ``arange``, ...) without
  ``device=`` (or with ``device="cpu"``), by ``torch.from_numpy``, or by
  ``torch.load(map_location="cpu")`` is marked *host-born*, as is every ``nn.Parameter`` built from
  one (``nn.Linear()``);
- ``.to(device)`` / ``.cuda()`` / ``Module.to(device)`` clear the mark; ``.cpu()`` and
  ``.to("cpu")`` set it (a device *variable* counts as the device: on a GPU runtime it is CUDA);
- every other op passes the mark on when all its tensor inputs carry it; an op that mixes a
  host-born tensor (more than a scalar) with device tensors is an error, as it is on CUDA;
- every tensor handed to a collective (``all_reduce``, gathers, scatters, ``broadcast``,
  ``batch_isend_irecv``), and every parameter given to ``DistributedDataParallel`` or a
  ``PipelineStage``, must be unmarked and on ``worker_device()``.

Two ways in:

    launch(placement_checked, 2, "course_utils.experiments.data_parallel:hello_all_reduce")
    COURSE_CHECK_PLACEMENT=1   # runtime.setup() turns on watch_placement() for the whole lesson,
                               # and launch() runs every rank under it (make test sets it)

Either raises ``PlacementError`` at the first offending line. What it cannot see: tensors made
inside C++ (autograd's gradients, DDP's buckets, FSDP2's buffers, which torch places itself), code
that runs only when ``device.type == "cuda"`` (memory statistics, synchronisation), and the speed
or memory of a GPU.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from course_utils.distributed.devices import GLOO_DEVICE, worker_device

FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full,
             torch.randn, torch.rand, torch.randint, torch.arange, torch.linspace, torch.eye,
             torch.randperm, torch.normal}
COLLECTIVES = ("all_reduce", "all_gather_single", "all_gather_into_tensor", "all_gather",
               "reduce_scatter_single", "reduce_scatter_tensor", "broadcast", "reduce",
               "all_to_all_single", "batch_isend_irecv")
# CPU indices, cross-device copies and Module.to's own bookkeeping are fine on CUDA
MIXING_ALLOWED = {"__getitem__", "__setitem__", "index_select", "masked_select", "copy_",
                  "_has_compatible_shallow_copy_type", "__set__"}
MARK = "_course_placement"
HOST, DEVICE = "host", "device"
ENV_VAR = "COURSE_CHECK_PLACEMENT"


class PlacementError(RuntimeError):
    """A host tensor would meet a device tensor (or reach a collective) on a machine with GPUs."""


def _where(t):
    """HOST, DEVICE, or None: a tensor whose side cannot be told (autograd's gradients, a factory
    given ``device=x.device``), which takes the side of whatever it is combined with."""
    return getattr(t, MARK, None) if isinstance(t, torch.Tensor) else None


def _born(t) -> bool:
    return _where(t) == HOST


def _tensors_in(obj, found: list) -> list:
    """Append the tensors in ``obj`` (a tensor, or lists, tuples and dicts of them, at any depth:
    what torch functions take and return; return types such as ``torch.max``'s are tuples) to
    ``found``. By hand, not torch.utils._pytree.tree_leaves: this runs for every op a checked
    lesson makes, and the general pytree walk doubled a lesson's time."""
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (list, tuple, dict)):
                _tensors_in(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _tensors_in(item, found)
    return found


def _mark(obj, where) -> None:
    if isinstance(obj, torch.Tensor):   # most ops: one tensor, often already marked so (in-place)
        if getattr(obj, MARK, None) == where:
            return
        obj = (obj,)
    for t in _tensors_in(obj, []):
        try:
            if where is not None:
                setattr(t, MARK, where)
            elif MARK in t.__dict__:
                delattr(t, MARK)
        except (AttributeError, RuntimeError):  # some C++ tensors take no attributes
            pass


# The device objects that mean "the device" though they are the CPU here: a rank's
# worker_device() and the device runtime.setup() returned to a lesson (watch_placement adds it).
# Identity, not equality: x.device, torch.device("cpu") and the host all compare equal to them.
_DEVICE_OBJECTS: list[torch.device] = [GLOO_DEVICE]


def _side_of(device):
    """HOST, DEVICE or None for a ``device=`` / ``.to()`` / ``map_location`` argument: no device
    (a factory's default) and the string "cpu" are the host; CUDA and the lesson's or rank's own
    device object are the device; any other CPU ``torch.device`` (``x.device`` of a tensor whose
    side is unknown here) cannot be told and leaves the tensor unmarked."""
    if device is None:
        return HOST
    if isinstance(device, str):
        return HOST if device.split(":")[0] == "cpu" else DEVICE
    if isinstance(device, torch.device):
        if device.type != "cpu" or any(device is d for d in _DEVICE_OBJECTS):
            return DEVICE
    return None


def _side_of_move(args, kwargs):
    """Where ``tensor.to(...)`` sends it (see ``_side_of``); to another tensor, that tensor's
    side; a dtype-only cast keeps the tensor's own side."""
    target = kwargs.get("device")
    if target is None:
        target = next((a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))), None)
    if target is None:
        return _where(args[0])
    if isinstance(target, torch.Tensor):
        return _where(target)
    return _side_of(target)


class HostTracker(TorchFunctionMode):
    """The mark-and-propagate rules of the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if func in FACTORIES:
            _mark(out, _side_of(kwargs.get("device")))
        elif name in ("to", "cuda", "cpu"):
            side = DEVICE if name == "cuda" else HOST if name == "cpu" else _side_of_move(args, kwargs)
            if out is args[0] and _where(out) != side:
                # on the CPU a move to the CPU returns the tensor itself; on a GPU it is a new
                # tensor, so give the moved one its own identity (a view) and leave the source be
                out = out.view_as(out)
            _mark(out, side)
        elif name.startswith("new_"):
            _mark(out, _where(args[0]))
        else:
            host = on_device = False
            big = None   # the first host tensor of more than 0-d (0-d is a scalar to CUDA ops)
            inputs = _tensors_in(args, [])
            if kwargs:
                _tensors_in(kwargs, inputs)
            for t in inputs:
                side = getattr(t, MARK, None)
                if side == DEVICE:
                    on_device = True
                elif side == HOST:
                    host = True
                    if big is None and t.dim() > 0:
                        big = t
            if big is not None and on_device and name not in MIXING_ALLOWED:
                raise PlacementError(
                    f"{name} mixes a host tensor of shape {tuple(big.shape)} with device "
                    "tensors: on CUDA this raises. Create it with device=... (the lesson's "
                    "device, or worker_device() in a rank) or move it with .to(device)")
            if on_device:
                _mark(out, DEVICE)
            elif host and name not in MIXING_ALLOWED:
                _mark(out, HOST)
        return out


def check_on_device(tensors, where: str) -> None:
    """Raise PlacementError unless every tensor is device-born and on ``worker_device()``. Under
    ``fake_world`` (one process, the "fake" backend) every tensor is meant to stay on the CPU."""
    if dist.is_initialized() and dist.get_backend() == "fake":
        return
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


def _host_loader(original):
    def load(*args, **kwargs):
        out = original(*args, **kwargs)
        where = kwargs.get("map_location", args[1] if len(args) > 1 else None)
        # no map_location: tensors return to the device they were saved from
        _mark(out, _side_of(where) if isinstance(where, (str, torch.device)) else None)
        return out
    load.placement_checked = True
    return load


def _host_made(original):
    def made(*args, **kwargs):
        out = original(*args, **kwargs)
        _mark(out, HOST)
        return out
    made.placement_checked = True
    return made


def _marking_move(original, side):
    def move(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        target = side if side is not None else _side_of_move((self, *args), kwargs)
        if target is not None or side is None and _moves_somewhere(args, kwargs):
            for t in [*self.parameters(), *self.buffers()]:
                _mark(t, target)
        return out
    return move


def _moves_somewhere(args, kwargs) -> bool:
    return kwargs.get("device") is not None or any(isinstance(a, (str, torch.device)) for a in args)


def _install() -> None:
    if not getattr(torch.load, "placement_checked", False):
        torch.load = _host_loader(torch.load)
    if not getattr(torch.from_numpy, "placement_checked", False):
        torch.from_numpy = _host_made(torch.from_numpy)
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is not None and not getattr(original, "placement_checked", False):
            setattr(dist, name, _wrap_collective(name, original))

    if getattr(nn.Parameter.__new__, "placement_checked", False):
        return
    new_parameter = nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):
        p = new_parameter(cls, data, requires_grad)
        _mark(p, _where(data))
        return p
    parameter.placement_checked = True
    nn.Parameter.__new__ = parameter

    # Module.to/cuda/cpu replace each parameter's .data, which keeps the Parameter object (and its
    # old mark): mark the module's tensors after the move instead
    for method, side in (("to", None), ("cuda", DEVICE), ("cpu", HOST)):
        setattr(nn.Module, method, _marking_move(getattr(nn.Module, method), side))

    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp_init = DDP.__init__

    def ddp(self, module, *args, **kwargs):
        check_on_device(list(module.parameters()) + list(module.buffers()), "DistributedDataParallel")
        ddp_init(self, module, *args, **kwargs)
    DDP.__init__ = ddp

    stage = sys.modules.get(_STAGE_MODULE)
    if stage is not None:
        _check_pipeline_stages(stage)
    else:
        sys.meta_path.insert(0, _AfterImport(_STAGE_MODULE, _check_pipeline_stages))


_STAGE_MODULE = "torch.distributed.pipelining.stage"


def _check_pipeline_stages(stage) -> None:
    stage_init = stage.PipelineStage.__init__

    def pipeline_stage(self, submodule, *args, **kwargs):
        check_on_device(list(submodule.parameters()), "PipelineStage")
        stage_init(self, submodule, *args, **kwargs)
    stage.PipelineStage.__init__ = pipeline_stage


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after module ``name`` is first imported, then steps aside.
    Why not import it at once: torch.distributed.pipelining costs about 1 s of CPU to import (it
    loads torch._dynamo), which every checked kernel would pay, most for a lesson without a
    pipeline."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            load, patch = spec.loader.exec_module, self.patch

            def exec_module(module):
                load(module)
                patch(module)
            spec.loader.exec_module = exec_module
        return spec


def host_tensor_example(rank: int, world_size: int) -> float:
    """The bug this module exists to catch: an all-reduce of a tensor built on the host."""
    value = torch.tensor([float(rank + 1)])      # no device=: the CPU, whatever the backend
    dist.all_reduce(value)
    return value.item()


_WATCHING: list[HostTracker] = []


def watch_placement(device: torch.device | None = None) -> bool:
    """Turn the check on for the rest of this process (a lesson's kernel): hooks installed and a
    ``HostTracker`` entered and left entered. ``device``: the object ``runtime.setup`` handed the
    lesson, which counts as the device wherever it is passed. Idempotent; returns whether it was
    already on."""
    if device is not None and not any(device is d for d in _DEVICE_OBJECTS):
        _DEVICE_OBJECTS.append(device)
    if _WATCHING:
        return True
    _install()
    tracker = HostTracker()
    tracker.__enter__()
    _WATCHING.append(tracker)
    return False


def requested() -> bool:
    """Whether ``$COURSE_CHECK_PLACEMENT`` asks for the check (``make test`` sets it to 1)."""
    return os.environ.get(ENV_VAR, "") == "1"


def placement_checked(rank: int, world_size: int, worker: str, *args):
    """Run ``worker`` ('module:function') on this rank with host tensors tracked (see above)."""
    module, _, name = worker.partition(":")
    _install()
    fn = getattr(importlib.import_module(module), name)
    with HostTracker():
        return fn(rank, world_size, *args)
