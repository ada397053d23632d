"""What a real pipeline schedule did on this rank: the actions it ran and the activations it held.

``StageTrace(stages)`` wraps one schedule step of ``torch.distributed.pipelining``:

    with StageTrace(stages) as trace:
        schedule.step(...)
    trace.executed       [(kind, stage, microbatch), ...] in the order this rank ran them;
                         kind "F" forward, "B" full backward, "I" input-gradient backward
                         (its weight gradient later), "W" that weight gradient
    trace.peak[stage]    most micro-batches whose saved-for-backward tensors were alive at once
    trace.peak_rank      the same over all this rank's stages together (a (stage, mb) pair each)

Activations are counted, not assumed: every tensor autograd saves for backward during a stage's
forward of micro-batch j is packed (``torch.autograd.graph.saved_tensors_hooks``) into a token
owned by autograd's graph; micro-batch j is alive on that stage while any of its tokens is, and a
token dies when autograd frees the saved tensor (after the backward that last needs it, for a
split backward after W). Saved parameters (a Linear saves its weight) are not activations and
are left out. This is the quantity the schedule simulator calls "peak activations"
(``pipeline.Timeline.peak_activations``), here measured on the real run.
"""
from __future__ import annotations

import weakref
from collections import Counter

import torch


class _Saved:
    """A saved-for-backward tensor, wrapped so its lifetime (autograd's) can be observed."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class StageTrace:
    """Record executed actions and live saved activations of ``stages`` (this rank's
    ``PipelineStage`` objects) while the ``with`` block runs one schedule step."""

    def __init__(self, stages):
        self.stages = list(stages)
        self.executed: list[tuple[str, int, int]] = []
        self._alive: Counter = Counter()             # (stage, mb) -> saved tensors alive
        self.peak = {s.stage_index: 0 for s in self.stages}
        self.peak_rank = 0
        self._forwarding = None                       # (stage, mb) whose forward is running
        self._parameter_storages = {p.untyped_storage().data_ptr()
                                    for s in self.stages for p in s.submod.parameters()}
        self._originals = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    # -- actions ---------------------------------------------------------------------------
    def _wrap(self, stage, name):
        original = getattr(stage, name)

        def forward(chunk, *args, **kwargs):
            self.executed.append(("F", stage.stage_index, chunk))
            self._forwarding = (stage.stage_index, chunk)
            try:
                return original(chunk, *args, **kwargs)
            finally:
                self._forwarding = None

        def backward(chunk, *args, **kwargs):
            split = kwargs.get("full_backward", True) is False
            self.executed.append(("I" if split else "B", stage.stage_index, chunk))
            return original(chunk, *args, **kwargs)

        def weight(chunk, *args, **kwargs):
            self.executed.append(("W", stage.stage_index, chunk))
            return original(chunk, *args, **kwargs)

        wrapper = {"forward_one_chunk": forward, "backward_one_chunk": backward,
                   "backward_weight_one_chunk": weight}[name]
        setattr(stage, name, wrapper)               # an instance attribute shadows the method
        self._originals.append((stage, name))

    # -- activations -----------------------------------------------------------------------
    def _pack(self, tensor):
        if self._forwarding is None or tensor.untyped_storage().data_ptr() in self._parameter_storages:
            return tensor
        key = self._forwarding
        # detached: a saved *output* would otherwise hold its own grad_fn, a cycle through C++
        # that only the engine's release after backward breaks (and a split backward's I never
        # releases), so the trace itself would keep activations alive
        token = _Saved(tensor.detach())
        self._alive[key] += 1
        weakref.finalize(token, self._release, key)
        self.peak[key[0]] = max(self.peak[key[0]], self._alive_microbatches(key[0]))
        self.peak_rank = max(self.peak_rank, len(self._alive))
        return token

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key):
        self._alive[key] -= 1
        if self._alive[key] == 0:
            del self._alive[key]

    def _alive_microbatches(self, stage_index: int) -> int:
        return sum(1 for s, _ in self._alive if s == stage_index)

    def alive(self) -> int:
        """(stage, micro-batch) pairs still holding saved tensors now (0 after a full step)."""
        return len(self._alive)

    def __enter__(self):
        for stage in self.stages:
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
                self._wrap(stage, name)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for stage, name in self._originals:
            delattr(stage, name)                    # the class's method shows through again
        self._originals.clear()
        return False
