"""The ledger measured: run one training step under hooks and read each line.

``measure(step)`` runs ``step()`` once and records

- ``flops``: matmul/conv/attention FLOPs counted by PyTorch's own FLOP formulas
  (``torch.utils.flop_counter``), split into forward and backward by asking the autograd
  engine whether a backward pass is running when each op executes;
- ``activation_bytes``: the peak bytes held by ``torch.autograd.graph.saved_tensors_hooks``
  (what autograd keeps alive until backward), each storage counted once over the span its
  saved views cover, parameters and buffers excluded because they are resident state (so are
  the full parameters FSDP gathers for one unit: it frees them after the unit's forward and
  gathers them again for backward);
- resident state: ``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` and ``cache_bytes``
  (tensors registered as caches, such as MoCo's queue);
- ``comm_bytes``: with a process group (real, or ``fake_world``), the bytes this rank sends,
  ``Σ ring_factor(kind, n) · payload`` over the collectives the step calls
  (``course_utils.ledger.comm_count.CollectiveCounter``; DDP needs its comm hook), and
  ``comm``, the same per collective kind; ``wire_bytes``, every byte this process wrote meanwhile
  (Linux ``/proc/self/io``, else None): during a step that prints and saves nothing, gloo's socket
  sends, and anything else written in the step would count too;
- ``encoded``: how many items went through each named encoder (images, or patch tokens);
- the *repeated* line: ``recomputed_flops``, forward FLOPs run again inside backward
  (activation checkpointing; part of ``backward_flops``), and ``re_encoded``, per encoder, the
  items it encoded a second time in the step (gradient caching's second forward of the batch);
  candidates a cache serves (MoCo's queue) are not re-encoded and appear in neither;
- ``peak_bytes``: on CUDA only, ``torch.cuda.max_memory_allocated`` during the step
  (``cuda.cuda_peak_bytes``).

What is *not* measured on CPU: peak process memory, allocator caching and fragmentation,
temporaries freed inside one op (e.g. the softmax workspace), and element-wise FLOPs (the
counter counts only matmul-like ops, which dominate). The record says so in ``notes``.

On fake tensors (``course_utils.ledger.fake_mode``) every line above is the same number as on
real tensors of the same shapes (tested, ratio exactly 1); ``peak_bytes`` is ``None`` and
``fake`` is True. A step whose shapes depend on values cannot run fake at all: torch raises
``DataDependentOutputException`` naming the op, and no record is made.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from .comm_count import CollectiveCounter, ring_factor
from .cuda import cuda_peak_bytes
from .fake import explain_unknowable, is_fake
from .record import LedgerRecord


# --------------------------------------------------------------------------- FLOPs
def _cpu_flash_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_flash_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


# torch's registry counts the GPU flash/efficient/cuDNN attention kernels but not the CPU flash
# kernel that scaled_dot_product_attention dispatches to here: the same formulas, so a planned
# step counts the FLOPs its GPU run would: 4·b·s²·h forward (eager attention's two matmuls) and
# 10·b·s²·h backward (eager's 8, plus the scores q·kᵀ flash recomputes instead of keeping them)
_EXTRA_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
                    _cpu_flash_backward_flops}


class _FlopSplitter(TorchDispatchMode):
    """Counts FLOPs per op with the registry FlopCounterMode uses, split forward/backward; of the
    backward's, ``recomputed`` are forward ops run again inside it (activation checkpointing
    re-runs a forward with grad enabled during backward; backward's own ops run without grad)."""

    def __init__(self):
        super().__init__()
        self.forward = 0
        self.backward = 0
        self.recomputed = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket) or _EXTRA_FLOPS.get(func._overloadpacket)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            # -1 means "no autograd graph task running on this thread": forward.
            if torch._C._current_graph_task_id() == -1:
                self.forward += n
            else:
                self.backward += n
                if torch.is_grad_enabled():
                    self.recomputed += n
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

    def __init__(self, exclude: set):
        self.exclude = exclude
        self.views: dict = {}  # storage key -> holder id -> byte span
        self.span: dict = {}
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
        key = storage_key(tensor)
        if key in self.exclude or isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return holder   # resident state, or parameters FSDP gathered (and frees after forward)
        esize = tensor.element_size()
        start, end = element_span(tensor)
        self.count += 1
        self.views.setdefault(key, {})[id(holder)] = (start * esize, end * esize)
        self._update(key)
        weakref.finalize(holder, self._release, key, id(holder))
        return holder

    @staticmethod
    def unpack(holder):
        return holder.tensor


# --------------------------------------------------------------------------- resident state

def element_span(tensor) -> tuple[int, int]:
    """[first, last + 1) element of its storage that ``tensor`` (a strided view) can reach."""
    start = tensor.storage_offset()
    return start, start + sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride())) + 1


def storage_key(tensor) -> StorageWeakRef:
    """Identity of the storage behind ``tensor``, valid for fake tensors too (whose data_ptr is
    meaningless): views of one storage share it."""
    return StorageWeakRef(tensor.untyped_storage())


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        t = t.to_local() if hasattr(t, "to_local") else t   # a sharded DTensor: this rank's shard
        key = storage_key(t)
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


def state_bytes(model: torch.nn.Module, optimizer=None) -> dict:
    """Bytes this rank holds for parameters, gradients and optimizer state (local shards only),
    counted element by element: what ZeRO's formulas predict (``distributed.sharding.
    predicted_state_bytes``). ``resident_bytes`` counts storages instead (what a step holds:
    DDP's gradient buckets whole, views once).

    Sharded tensors (FSDP2 DTensors) count their local shard (``to_local()``); ZeRO-1's optimizer
    only holds state for the parameters this rank owns, so its state dict is already local.
    """
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(local(p) for p in model.parameters())
    grads = sum(local(p.grad) for p in model.parameters() if p.grad is not None)
    opt = 0
    if optimizer is not None:
        inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps its local one
        for per_param in inner.state.values():
            opt += sum(local(v) for v in per_param.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0)  # skip scalar step counters
    return {"params": params, "grads": grads, "optimizer": opt}


# --------------------------------------------------------------------------- measure
def _count_items(encoders: dict) -> tuple[dict, dict, list]:
    """Forward pre-hooks on each encoder: items it encodes, and of those, ``again``: items whose
    input it already encoded earlier in this step (the same span of the same storage: a second
    forward of the same batch, as gradient caching makes, or a recomputation in backward)."""
    counts = {name: 0 for name in encoders}
    again = {name: 0 for name in encoders}
    handles = []
    for name, module in encoders.items():
        if not isinstance(module, nn.Module):
            raise TypeError(f"encoders[{name!r}] must be an nn.Module, got {type(module).__name__}")
        seen: list = []   # (storage, element_span) of every input encoded this step

        def hook(_mod, args, _name=name, _seen=seen):
            x = args[0] if args else None
            if torch.is_tensor(x):
                # images: B×C×H×W -> B items; tokens: B×L×D -> B·L items
                items = x.shape[0] * (x.shape[1] if x.dim() == 3 else 1)
                counts[_name] += items
                if x.layout == torch.strided and x.numel():
                    key, (start, end) = storage_key(x), element_span(x)
                    if any(k == key and s <= start and end <= e for k, s, e in _seen):
                        again[_name] += items
                    else:
                        _seen.append((key, start, end))
        handles.append(module.register_forward_pre_hook(hook))
    return counts, again, handles


def kept_after_forward(forward, *, model: nn.Module) -> int:
    """Run ``forward()`` (a forward and its loss, no backward) and return the bytes autograd keeps
    for backward when it returns, counted as ``measure`` counts ``activation_bytes`` (each
    storage once, ``model``'s parameters and buffers excluded). Without recomputation that is the
    line's peak: backward only frees.

    For where a whole step cannot run: on fake CUDA tensors under ``fake.autocast_rules("cuda")``
    a CPU machine dispatches CUDA's autocast rules, but backward needs a CUDA context."""
    if not callable(forward):
        raise TypeError("forward must be a callable that runs a forward and its loss, "
                        "e.g. lambda: model.loss(tokens, targets)")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    tracker = _SavedTensorTracker({storage_key(t) for t in (*model.parameters(), *model.buffers())})
    with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
        kept = forward()   # held until the count is read: autograd frees what no output needs
        counted = tracker.live
    del kept
    return counted


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
    exclude = {storage_key(t) for t in persistent}

    device = persistent[0].device if persistent else torch.device("cpu")
    fake = any(is_fake(t) for t in persistent)
    tracker = _SavedTensorTracker(exclude)
    flops = _FlopSplitter()
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    comm = CollectiveCounter() if dist.is_available() and dist.is_initialized() else None

    def hooked_step():
        with flops, torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack), \
                comm if comm is not None else contextlib.nullcontext():
            step()

    counts, again, handles = _count_items(encoders)
    try:
        with explain_unknowable() if fake else contextlib.nullcontext():
            peak = cuda_peak_bytes(hooked_step, device)
    finally:
        for h in handles:
            h.remove()

    if fake:
        notes = ("On fake tensors: every line as on real tensors of these shapes; not known "
                 "without data: peak memory (allocator caching, fragmentation), kernel speed, "
                 "overlap of communication and compute; FLOPs count matmul/conv/attention only.")
    elif peak is None:
        notes = ("On CPU: no peak-memory reading (allocator caching, temporaries inside an op and "
                 "fragmentation are not measured); FLOPs count matmul/conv/attention ops only.")
    else:
        notes = ""
    breakdown = {kind: {"calls": comm.calls[kind], "payload_bytes": payload,
                        "sent_bytes": round(ring_factor(kind, world) * payload)}
                 for kind, payload in comm.payload.items()} if comm is not None else {}
    return LedgerRecord(
        flops=flops.forward + flops.backward, forward_flops=flops.forward,
        backward_flops=flops.backward, recomputed_flops=flops.recomputed,
        activation_bytes=tracker.peak,
        **resident_bytes(model, optimizer, caches), encoded=counts,
        re_encoded={k: v for k, v in again.items() if v}, fake=fake, world_size=world,
        comm_bytes=sum(c["sent_bytes"] for c in breakdown.values()), comm=breakdown,
        wire_bytes=comm.wire if comm is not None else None,
        saved_tensors=tracker.count, peak_bytes=peak, device=str(device), notes=notes)
