"""The ledger at any scale: fake tensors and a fake process group, in this one process.

``fake_mode()`` makes every tensor created inside it a *fake* tensor: shape, dtype, strides and
device, no memory, no arithmetic. Models, optimizers and batches built there cost nothing, yet
a whole training step runs through them, every op dispatched, so ``measure`` reads the same
FLOPs, saved-for-backward bytes and resident state as it would on real tensors (a ResNet-50 at
batch 4096 or a 7B transformer on a laptop).

``fake_world(world_size)`` starts torch's ``"fake"`` process group: rank 0 of ``world_size``
ranks whose collectives return at once without moving data. DDP, ZeRO-1, FSDP2 and tensor
parallel wrap a model for real under it and issue their real collectives, which the ledger
counts (``comm_bytes``). Use it *around* ``fake_mode()``: its DeviceMesh must exist before any
fake tensor does.

What a fake run cannot know: anything that depends on the values (a data-dependent shape, an
``.item()`` branch; torch raises ``DataDependentOutputException`` naming the op), how fast the
kernels run, how communication overlaps compute, and the allocator's caching and fragmentation.

``autocast_rules(device_type, dtype)`` applies a device's autocast rules even where the device is
absent: on fake CUDA tensors a CPU machine runs CUDA autocast's op-by-op dtypes, so the bytes a
GPU's forward keeps for backward can be read here (``measured.kept_after_forward``; backward on
fake CUDA tensors needs a CUDA context, so a step stops at the forward).

``peak_live_bytes(step, model=, optimizer=)`` adds what the ledger's lines leave out: the peak of
*every* live tensor during one step (temporaries, gradients, FSDP2's gathered parameters, what a
selective checkpoint caches), by category, from torch's memory tracker, which runs on fake
tensors too. It still cannot see the allocator: a GPU's peak *reserved* memory is higher.

Private torch APIs (``torch._subclasses.fake_tensor``, the fake backend, which lives under
``torch.testing._internal``, and the memory trackers under ``torch.distributed._tools``) are
imported here and nowhere else.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from .. import checks

TORCH_NEEDED = "2.7"   # pyproject.toml's floor (FakeStore, FSDP2 on gloo); checked on 2.14


def _private(what: str):
    """Import one private torch name, or say which torch version the fake ledger needs."""
    try:
        if what in ("FakeTensorMode", "FakeTensor"):
            from torch._subclasses import fake_tensor
            return getattr(fake_tensor, what)
        if what == "FakeStore":
            # importing the module registers the "fake" backend with torch.distributed
            from torch.testing._internal.distributed.fake_pg import FakeStore
            return FakeStore
        if what in ("MemTracker", "FSDPMemTracker"):
            from torch.distributed._tools import fsdp2_mem_tracker, mem_tracker
            return getattr(fsdp2_mem_tracker if what.startswith("FSDP") else mem_tracker, what)
        if what == "data_dependent_errors":
            from torch._subclasses import fake_tensor
            return (fake_tensor.DataDependentOutputException,
                    fake_tensor.DynamicOutputShapeException)
    except ImportError as err:  # pragma: no cover - depends on the installed torch
        raise ImportError(f"the fake ledger needs torch >= {TORCH_NEEDED} ({what} not found in "
                          f"torch {torch.__version__}: {err}); upgrade torch") from err
    raise ValueError(f"unknown private name {what!r}")


@contextlib.contextmanager
def explain_unknowable():
    """Turn torch's "this op needs the values" errors on fake tensors into a ValueError that says
    which op and what to do; the ledger cannot know such a step without data."""
    try:
        yield
    except _private("data_dependent_errors") as err:
        raise ValueError(
            f"this step cannot run on fake tensors: an op needs the tensors' values ({err}); "
            "such a number (a shape or branch chosen by the data) cannot be known without data. "
            "Measure it on real tensors at a small size, or make the shape data-independent "
            "(tensor arithmetic instead of .item()/int(), masks instead of boolean indexing)") from err


def is_fake(tensor) -> bool:
    """True for a fake tensor (no data behind it), or a DTensor whose local shard is one."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return isinstance(tensor, _private("FakeTensor"))


@contextlib.contextmanager
def fake_mode():
    """Context manager: tensors created inside are fake (no memory, no arithmetic).

    Build the model, optimizer and batch inside, then call ``measure`` inside too::

        with fake_mode():
            model = resnet50()
            opt = torch.optim.AdamW(model.parameters(), foreach=False)
            x = torch.randn(4096, 3, 224, 224)
            record = measure(lambda: step(x), model=model, optimizer=opt)

    Constant real tensors that a module holds (e.g. a fixed index) are converted on first use.
    Use ``foreach=False`` for AdamW/Adam/SGD: the fused multi-tensor kernels are not faked.
    """
    mode = _private("FakeTensorMode")(allow_non_fake_inputs=True)
    with mode:
        yield mode


@contextlib.contextmanager
def fake_world(world_size: int):
    """Start a fake process group of ``world_size`` ranks (this process is rank 0); yield its
    1-D DeviceMesh, built before any fake tensor exists; destroy the group on exit.

    Under it ``fully_shard(m, mesh=mesh)`` and ``parallelize_module(m, mesh, plan)`` wrap a model
    as they would on ``world_size`` GPUs. DDP needs one more step: the fake backend cannot run the
    reducer's own C++ all-reduce (a plain ``DistributedDataParallel(m, init_sync=False)`` dies in a
    torch internal assert at the first backward), so register a Python comm hook on it, as
    ``course_utils.experiments.planning._ddp`` does with ``allreduce_mean_hook`` (which the ledger counts).
    """
    checks.positive_int(world_size, "world_size")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; call "
                           "fake_world outside torch.distributed runs (and outside fake_mode)")
    store = _private("FakeStore")()
    dist.init_process_group("fake", store=store, rank=0, world_size=world_size)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        yield init_device_mesh("cpu", (world_size,))
    except RuntimeError as err:
        if "isTensor" in str(err) and "comm.cpp" in str(err):   # DDP's own all-reduce, faked
            raise RuntimeError(
                "a plain DistributedDataParallel cannot run its backward in fake_world (the fake "
                "backend's all-reduce returns nothing to DDP's C++ reducer); register a Python "
                "comm hook after wrapping, e.g. ddp.register_comm_hook(None, allreduce_mean_hook) "
                "from course_utils.ledger.comm_count, which the ledger also counts") from err
        raise
    finally:
        dist.destroy_process_group()


def peak_live_bytes(step, *, model: nn.Module, optimizer=None) -> dict[str, int]:
    """Run ``step()`` once under torch's memory tracker; return the bytes alive at the step's
    peak, by category ("Activation", "Temp", "OptState", FSDP2's "Sharded Param" and "Unsharded
    Param", ...; names as the tracker gives them), and "Total". Real or fake tensors.

    Why torch's tracker and not the ledger's lines: the peak holds temporaries no line books
    (a loss's gradient, the block being recomputed) and tensors saved where saved-tensor hooks do
    not look (a selective checkpoint's cache). ``model`` an FSDP2 module (``fully_shard``: the
    FSDP tracker, which splits sharded from gathered parameters) or any module. Run one step
    before, so the optimizer state exists. Tracker: ``torch.distributed._tools`` (private)."""
    from torch.distributed.fsdp import FSDPModule
    if isinstance(model, FSDPModule):
        tracker = _private("FSDPMemTracker")(model, optimizer)
    else:
        tracker = _private("MemTracker")()
        tracker.track_external(*(m for m in (model, optimizer) if m is not None))
    with tracker:
        step()
    per_device = tracker.get_tracker_snapshot("peak")
    if len(per_device) != 1:   # each device peaks at its own moment: their sum is no one peak
        raise ValueError(f"the step used {len(per_device)} devices ({', '.join(map(str, per_device))}); "
                         "peak_live_bytes reports one device's peak: keep the step on one device")
    return {getattr(kind, "value", kind): nbytes for kind, nbytes in next(iter(per_device.values())).items()}


@contextlib.contextmanager
def autocast_rules(device_type: str, dtype: torch.dtype = torch.bfloat16):
    """``torch.autocast(device_type, dtype)``, also for a device this machine lacks.

    Why not torch.autocast itself: ``torch.autocast("cuda")`` disables itself (with a warning)
    when CUDA is unavailable, yet its rules are entries of the dispatcher, which fake CUDA tensors
    reach on any machine. This sets the same state torch.autocast sets, through the same public
    calls, and restores it on exit; on real tensors of a present device it is torch.autocast.
    Build the fake tensors with ``torch.device("cuda")`` inside ``fake_mode()``."""
    checks.choice(device_type, "device_type", ("cpu", "cuda"))
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype!r}")
    previous = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type),
                torch.is_autocast_cache_enabled())
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, previous[0])
        torch.set_autocast_dtype(device_type, previous[1])
        torch.set_autocast_cache_enabled(previous[2])


def to_device(module: nn.Module, device) -> nn.Module:
    """``module.to(device)``, except for a module of fake tensors already there
    (course_utils.ledger.fake_mode): those cannot be moved, not even to their own device."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    tensors = list(module.parameters()) + list(module.buffers())
    if tensors and all(is_fake(t) and t.device == device for t in tensors):
        return module
    return module.to(device)
