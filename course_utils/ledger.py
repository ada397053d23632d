"""The resource ledger of one training step: measured, and predicted by hand.

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
- ``peak_bytes``: on CUDA only, ``torch.cuda.max_memory_allocated`` during the step.

What is *not* measured on CPU: peak process memory, allocator caching and fragmentation,
temporaries freed inside one op (e.g. the softmax workspace), and element-wise FLOPs (the
counter counts only matmul-like ops, which dominate). The record says so in ``notes``.
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from .report import format_table

LEDGER_LINES = ("flops", "forward_flops", "backward_flops", "activation_bytes",
                "param_bytes", "grad_bytes", "optimizer_bytes", "cache_bytes")


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


# --------------------------------------------------------------------------- record
@dataclass
class LedgerRecord:
    flops: int
    forward_flops: int
    backward_flops: int
    activation_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    cache_bytes: int
    encoded: dict = field(default_factory=dict)
    saved_tensors: int = 0
    peak_bytes: int | None = None
    device: str = "cpu"
    notes: str = ""

    @property
    def resident_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.cache_bytes

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in LEDGER_LINES}
        d.update(resident_bytes=self.resident_bytes, peak_bytes=self.peak_bytes,
                 encoded=dict(self.encoded), device=self.device)
        return d

    def rows(self) -> list[dict]:
        rows = [{"line": k, "measured": getattr(self, k)} for k in LEDGER_LINES]
        rows += [{"line": f"encoded: {k}", "measured": v} for k, v in self.encoded.items()]
        rows.append({"line": "peak_bytes (CUDA)",
                     "measured": "not measured on CPU" if self.peak_bytes is None else self.peak_bytes})
        return rows

    def __str__(self) -> str:
        return format_table(self.rows()) + (f"\n{self.notes}" if self.notes else "")

    def compare(self, prediction: dict) -> "Comparison":
        """Line-by-line comparison with an analytic prediction (keys = ledger line names)."""
        unknown = set(prediction) - set(LEDGER_LINES)
        if unknown:
            raise ValueError(f"prediction has unknown ledger lines {sorted(unknown)}; "
                             f"use names from {LEDGER_LINES}")
        return Comparison([(k, int(prediction[k]), getattr(self, k)) for k in LEDGER_LINES
                           if k in prediction])


@dataclass
class Comparison:
    lines: list  # (name, predicted, measured)

    def rows(self) -> list[dict]:
        return [{"line": n, "predicted": p, "measured": m,
                 "measured/predicted": (m / p if p else (1.0 if m == 0 else float("inf")))}
                for n, p, m in self.lines]

    def max_relative_error(self) -> float:
        errs = [abs(m - p) / max(abs(p), 1) for _, p, m in self.lines]
        return max(errs, default=0.0)

    def assert_close(self, rtol: float = 0.01) -> None:
        bad = [(n, p, m) for n, p, m in self.lines if abs(m - p) > rtol * max(abs(p), 1)]
        if bad:
            detail = "; ".join(f"{n}: predicted {p:,} measured {m:,}" for n, p, m in bad)
            raise AssertionError(f"ledger prediction off by more than {rtol:.1%}: {detail}")

    def __str__(self) -> str:
        return format_table(self.rows())


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
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)

    tracker = _SavedTensorTracker(exclude)
    counts, handles = _count_items(encoders)
    try:
        with _FlopSplitter() as flops, torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
            step()
    finally:
        for h in handles:
            h.remove()
    peak = None
    if cuda:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base

    notes = ("" if cuda else "On CPU: no peak-memory reading (allocator caching, temporaries inside "
             "an op and fragmentation are not measured); FLOPs count matmul/conv/attention ops only.")
    return LedgerRecord(
        flops=flops.forward + flops.backward, forward_flops=flops.forward,
        backward_flops=flops.backward, activation_bytes=tracker.peak,
        **resident_bytes(model, optimizer, caches), encoded=counts,
        saved_tensors=tracker.count, peak_bytes=peak, device=str(device), notes=notes)


# --------------------------------------------------------------------------- predict
OPTIMIZER_STATE_PER_PARAM = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}


def _trace_leaves(model: nn.Module, input_shape, dtype):
    """Shapes of every leaf module's input and output, from a forward pass on the meta device."""
    meta = copy.deepcopy(model).to("meta")
    calls = []

    def hook(mod, args, out):
        calls.append((mod, args[0], out))
    handles = [m.register_forward_hook(hook) for m in meta.modules() if not list(m.children())]
    try:
        x = torch.empty(input_shape, device="meta", dtype=dtype)
        out = meta(x)
    finally:
        for h in handles:
            h.remove()
    return x, calls, out


def _root(t):
    while getattr(t, "_base", None) is not None:
        t = t._base
    return id(t)


def predict_step(model: nn.Module, input_shape, *, num_classes: int | None = None,
                 optimizer: str = "sgd", dtype=torch.float32) -> dict:
    """Analytic ledger of one supervised step (forward, cross-entropy, backward, update).

    Per leaf layer, with ``n`` rows reaching it (batch × positions):

    - Linear(in, out): forward 2·n·in·out FLOPs; backward 2·n·in·out for the weight gradient
      plus 2·n·in·out for the input gradient unless the input is the raw batch (no grad needed).
      Saves its input.
    - Conv2d: the same with MACs = B·H_out·W_out·C_out·(C_in/groups)·k_h·k_w. Saves its input.
    - BatchNorm2d (training): saves its input plus per-channel mean and inverse std (2·C values).
    - ReLU: saves its output.  Flatten/Identity/Dropout(p=0)/pooling to 1×1: see code.
    - cross-entropy: saves the log-softmax output (B × classes), the int64 targets and one
      scalar (the total weight NLL divides by).

    A tensor saved by two layers (ReLU's output is the next layer's input) counts once.
    Resident: parameters, one gradient per parameter, optimizer states per parameter
    (SGD 0, SGD+momentum 1, Adam/AdamW 2 copies).
    """
    if optimizer not in OPTIMIZER_STATE_PER_PARAM:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {sorted(OPTIMIZER_STATE_PER_PARAM)}")
    if len(input_shape) < 2 or any(int(s) <= 0 for s in input_shape):
        raise ValueError(f"input_shape must be (batch, ...) with positive sizes, got {tuple(input_shape)}")
    esize = torch.empty((), dtype=dtype).element_size()
    x, calls, out = _trace_leaves(model, tuple(input_shape), dtype)
    batch = input_shape[0]

    fwd = bwd = 0
    saved: dict[int, int] = {}  # root tensor id -> bytes

    def keep(t, nbytes=None):
        saved.setdefault(_root(t), t.numel() * esize if nbytes is None else nbytes)

    for mod, inp, outp in calls:
        needs_input_grad = _root(inp) != _root(x)
        if isinstance(mod, nn.Linear):
            macs = inp.numel() // mod.in_features * mod.in_features * mod.out_features
        elif isinstance(mod, nn.Conv2d):
            kh, kw = mod.kernel_size
            macs = outp.numel() * (mod.in_channels // mod.groups) * kh * kw
        else:
            macs = 0
        if macs:
            fwd += 2 * macs
            bwd += 2 * macs * (2 if needs_input_grad else 1)
            keep(inp)
        elif isinstance(mod, nn.BatchNorm2d):
            keep(inp)
            saved[id(mod)] = 2 * mod.num_features * esize
        elif isinstance(mod, nn.ReLU):
            keep(outp)
        elif isinstance(mod, nn.AdaptiveAvgPool2d):
            pass  # backward needs only the input's shape
        elif isinstance(mod, (nn.Flatten, nn.Identity)) or (isinstance(mod, nn.Dropout) and mod.p == 0):
            pass
        else:
            raise ValueError(f"predict_step has no rule for {type(mod).__name__}; it covers "
                             "Linear, Conv2d, BatchNorm2d, ReLU, AdaptiveAvgPool2d, Flatten")
    classes = num_classes or out.shape[-1]
    # log-softmax output, int64 targets, NLL's total-weight scalar
    activation = sum(saved.values()) + batch * classes * esize + batch * 8 + esize

    n_params = sum(p.numel() for p in model.parameters())
    return {
        "forward_flops": fwd, "backward_flops": bwd, "flops": fwd + bwd,
        "activation_bytes": activation,
        "param_bytes": n_params * esize, "grad_bytes": n_params * esize,
        "optimizer_bytes": OPTIMIZER_STATE_PER_PARAM[optimizer] * n_params * esize,
    }
