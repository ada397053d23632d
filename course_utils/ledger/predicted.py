"""The ledger predicted by hand: one supervised step's lines from shapes and per-layer rules.

``predict_step`` traces the model on the meta device (no memory, no arithmetic) and applies the
rules in its docstring; ``benchmarks/bench_ledger.py`` checks they account for every FLOP
PyTorch counts and every byte autograd saves (ratio exactly 1).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..optim import state_copies


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
    Resident: parameters, one gradient per parameter, and the state copies per parameter of
    ``optimizer`` in ``course_utils.optim.OPTIMIZERS`` (sgd 0, sgd-momentum 1, adam/adamw 2).
    """
    copies = state_copies(optimizer)
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
        "optimizer_bytes": copies * n_params * esize,
    }
