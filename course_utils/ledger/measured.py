"""The ledger measured: run one training step under hooks and read each line.

``measure(step)`` runs ``step()`` once and records

- ``flops``: matmul/conv/attention FLOPs counted by PyTorch's own FLOP formulas
  (``torch.utils.flop_counter``), split into forward and backward by asking the autograd
  engine whether a backward pass is running when each op executes;
- ``activation_bytes``: the peak bytes held by ``torch.autograd.graph.saved_tensors_hooks``
  (what autograd keeps alive until backward), each storage counted once over the span its
  saved views cover, parameters and buffers excluded because they are resident state;
- resident state: ``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` and ``cache_bytes``
  (tensors registered as caches, such as MoCo's queue);
- ``encoded``: how many items went through each named encoder (images, or patch tokens);
- ``peak_bytes``: on CUDA only, ``torch.cuda.max_memory_allocated`` during the step
  (``cuda.cuda_peak_bytes``).

What is *not* measured on CPU: peak process memory, allocator caching and fragmentation,
temporaries freed inside one op (e.g. the softmax workspace), and element-wise FLOPs (the
counter counts only matmul-like ops, which dominate). The record says so in ``notes``.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from .cuda import cuda_peak_bytes
from .record import LedgerRecord


# --------------------------------------------------------------------------- FLOPs
class _FlopSplitter(TorchDispatchMode):
    """Counts FLOPs per op with the registry FlopCounterMode uses, split forward/backward."""

    def __init__(self):
        super().__init__()
        self.forward = 0
        self.backward = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            # -1 means "no autograd graph task running on this thread": forward.
            if torch._C._current_graph_task_id() == -1:
                self.forward += n
            else:
                self.backward += n
        return out


# --------------------------------------------------------------------------- saved tensors
class _Saved:
    """What the pack hook hands autograd; its death tells us autograd let the tensor go."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class _SavedTensorTracker:
    """Live bytes autograd keeps for backward; records the peak.

    Bytes are counted per storage, once, over the span of that storage the saved views cover:
    ReLU's output saved again as the next layer's input counts once, and a batch that is a slice
    of a larger dataset tensor counts as the slice, not the whole dataset.
    """

    def __init__(self, exclude_ptrs: set[int]):
        self.exclude = exclude_ptrs
        self.views: dict[int, dict[int, tuple[int, int]]] = {}  # storage -> holder id -> byte span
        self.span: dict[int, int] = {}
        self.live = 0
        self.peak = 0
        self.count = 0

    def _update(self, key):
        views = self.views.get(key)
        new = (max(e for _, e in views.values()) - min(s for s, _ in views.values())) if views else 0
        self.live += new - self.span.get(key, 0)
        if views:
            self.span[key] = new
        else:
            self.span.pop(key, None)
            self.views.pop(key, None)
        self.peak = max(self.peak, self.live)

    def _release(self, key, holder_id):
        self.views[key].pop(holder_id)
        self._update(key)

    def pack(self, tensor):
        holder = _Saved(tensor)
        if tensor.layout != torch.strided or tensor.device.type == "meta" or tensor.numel() == 0:
            return holder
        key = tensor.untyped_storage().data_ptr()
        if key in self.exclude:
            return holder
        esize = tensor.element_size()
        start = tensor.storage_offset() * esize
        extent = sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride())) + 1
        self.count += 1
        self.views.setdefault(key, {})[id(holder)] = (start, start + extent * esize)
        self._update(key)
        weakref.finalize(holder, self._release, key, id(holder))
        return holder

    @staticmethod
    def unpack(holder):
        return holder.tensor


# --------------------------------------------------------------------------- resident state
def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _cache_tensors(caches):
    for c in caches:
        if isinstance(c, nn.Module):
            yield from c.buffers()
        elif torch.is_tensor(c):
            yield c
        else:
            raise TypeError(f"caches must hold tensors or nn.Modules, got {type(c).__name__}")


def optimizer_state_tensors(optimizer):
    """Per-parameter optimizer state (momenta...), without the scalar step counters."""
    for state in optimizer.state.values():
        for name, value in state.items():
            if torch.is_tensor(value) and name != "step":
                yield value


def resident_bytes(model=None, optimizer=None, caches=()) -> dict:
    params = list(model.parameters()) if model is not None else []
    if optimizer is not None and model is None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
    return {
        "param_bytes": _tensor_bytes(params),
        "grad_bytes": _tensor_bytes(p.grad for p in params),
        "optimizer_bytes": _tensor_bytes(optimizer_state_tensors(optimizer)) if optimizer else 0,
        "cache_bytes": _tensor_bytes(_cache_tensors(caches)),
    }


# --------------------------------------------------------------------------- measure
def _count_items(encoders: dict) -> tuple[dict, list]:
    counts = {name: 0 for name in encoders}
    handles = []
    for name, module in encoders.items():
        if not isinstance(module, nn.Module):
            raise TypeError(f"encoders[{name!r}] must be an nn.Module, got {type(module).__name__}")

        def hook(_mod, args, _name=name):
            x = args[0] if args else None
            if torch.is_tensor(x):
                # images: B×C×H×W -> B items; tokens: B×L×D -> B·L items
                counts[_name] += x.shape[0] * (x.shape[1] if x.dim() == 3 else 1)
        handles.append(module.register_forward_pre_hook(hook))
    return counts, handles


def measure(step, *, model: nn.Module | None = None, optimizer=None, caches=(),
            encoders: dict | None = None) -> LedgerRecord:
    """Run ``step()`` once and return its ledger.

    ``model`` (and ``optimizer``) name the resident state; ``caches`` are extra tensors or
    modules whose buffers persist across steps (queues); ``encoders`` maps a name to a module
    whose forward calls are counted (default: ``{"images": model}``).
    """
    if not callable(step):
        raise TypeError("step must be a callable that runs one training step, e.g. lambda: train_step(batch)")
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    caches = tuple(caches) if isinstance(caches, (list, tuple)) else (caches,)
    if encoders is None:
        encoders = {"images": model} if model is not None else {}

    persistent = []
    if model is not None:
        persistent += list(model.parameters()) + list(model.buffers())
    if optimizer is not None:
        persistent += [p for g in optimizer.param_groups for p in g["params"]]
    persistent += list(_cache_tensors(caches))
    exclude = {t.untyped_storage().data_ptr() for t in persistent}

    device = persistent[0].device if persistent else torch.device("cpu")
    tracker = _SavedTensorTracker(exclude)
    flops = _FlopSplitter()

    def hooked_step():
        with flops, torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
            step()

    counts, handles = _count_items(encoders)
    try:
        peak = cuda_peak_bytes(hooked_step, device)
    finally:
        for h in handles:
            h.remove()

    notes = ("" if peak is not None else
             "On CPU: no peak-memory reading (allocator caching, temporaries inside an op and "
             "fragmentation are not measured); FLOPs count matmul/conv/attention ops only.")
    return LedgerRecord(
        flops=flops.forward + flops.backward, forward_flops=flops.forward,
        backward_flops=flops.backward, activation_bytes=tracker.peak,
        **resident_bytes(model, optimizer, caches), encoded=counts,
        saved_tensors=tracker.count, peak_bytes=peak, device=str(device), notes=notes)
