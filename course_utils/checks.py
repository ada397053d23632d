"""Argument checks, written once, so kernels read as math and every error says what to pass.

Each check returns the (normalised) value or raises ``TypeError`` (wrong kind of thing) or
``ValueError`` (right kind, wrong value) with a message naming the argument, what it got, and
what to pass instead. ``bool`` is refused where an int or float is asked for: ``True`` is an int
to Python, never a batch size to a learner.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any, name: str, *, minimum: int = 1, hint: str = "") -> int:
    """An int >= ``minimum`` (1 by default; pass 0 for "non-negative")."""
    want = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    tail = f"; {hint}" if hint else ""
    if not _is_int(value):
        raise TypeError(f"{name} must be {want}, got {value!r} ({type(value).__name__}){tail}")
    if value < minimum:
        raise ValueError(f"{name} must be {want}, got {value}{tail}")
    return value


def positive_float(value: Any, name: str, *, hint: str = "") -> float:
    """A real number > 0, returned as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {value!r}" + (f"; {hint}" if hint else ""))
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}" + (f"; {hint}" if hint else ""))
    return float(value)


def float_in_range(value: Any, name: str, low: float = 0.0, high: float = math.inf, *,
                   hint: str = "") -> float:
    """A real number in [low, high] (by default: >= 0), returned as float."""
    where = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number {where}, got {value!r}" + (f"; {hint}" if hint else ""))
    if not low <= value <= high:
        raise ValueError(f"{name} must be a number {where}, got {value}" + (f"; {hint}" if hint else ""))
    return float(value)


def fraction(value: Any, name: str, *, closed_right: bool = False, hint: str = "") -> float:
    """A real number in [0, 1) (or [0, 1] with ``closed_right``), returned as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1{']' if closed_right else ')'}, got {value!r}")
    ok = 0.0 <= value <= 1.0 if closed_right else 0.0 <= value < 1.0
    if not ok:
        raise ValueError(f"{name} must be in [0, 1{']' if closed_right else ')'}, got {value}"
                         + (f"; {hint}" if hint else ""))
    return float(value)


def choice(value: Any, name: str, choices: Iterable) -> Any:
    """One of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not known; pass one of {choices}")
    return value


def instance(value: Any, name: str, kind: type | tuple, *, what: str = "", optional: bool = False) -> Any:
    """``isinstance(value, kind)`` (or None when ``optional``)."""
    if optional and value is None:
        return value
    if not isinstance(value, kind):
        want = what or (kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind))
        raise TypeError(f"{name} must be {want}, got {type(value).__name__}")
    return value


def tensor(value: Any, name: str, *, dim: int | None = None, shape_hint: str = "") -> torch.Tensor:
    """A tensor, optionally of ``dim`` dimensions (``shape_hint`` says which, e.g. "N×d")."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{' of shape ' + shape_hint if shape_hint else ''}, "
                        f"got {type(value).__name__}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D{' (' + shape_hint + ')' if shape_hint else ''}, "
                         f"got shape {tuple(value.shape)}")
    return value


def generator(value: Any, name: str = "generator") -> torch.Generator | None:
    """A torch.Generator or None."""
    return instance(value, name, torch.Generator, what="a torch.Generator or None", optional=True)


def device(value: Any) -> torch.device:
    """A device that exists on this machine (a ``torch.device`` is returned as it is: the
    placement check in ``distributed.device_check`` knows the lesson's device by identity)."""
    try:
        dev = value if isinstance(value, torch.device) else torch.device(value)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={value!r} is not a device; pass 'cpu', 'cuda' or a torch.device") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but CUDA is not available here; pass device='cpu'")
    return dev
