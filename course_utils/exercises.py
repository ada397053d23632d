"""Checks that exercise tests call, so a wrong answer reads as a sentence, not a bare assert.

Every check raises ``AssertionError`` (what otter-grader reports as a failed test) whose message
names the quantity, shows the answer next to the expected value and says how far off it is.
An answer still equal to ``...`` (what ``otter assign`` leaves where a solution was) is reported
as "not answered yet" instead of a type error.

    check_close(predicted_bytes, record.optimizer_bytes, rtol=0.01, what="Adam state bytes")
    check_equal(queue.ptr, 3, what="queue pointer after one enqueue")
    check_shape(visible, (2, 4, 8), what="visible tokens")
    check_raises(ValueError, random_masking, tokens, 1.5, what="mask_ratio above 1")
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from . import checks

__all__ = ["check_close", "check_equal", "check_shape", "check_raises", "is_unanswered"]


def is_unanswered(answer: Any) -> bool:
    """True for the placeholders a student notebook starts with: ``...`` and ``None``."""
    return answer is Ellipsis or answer is None


def _require_unanswered_free(answer: Any, what: str) -> None:
    if is_unanswered(answer):
        raise AssertionError(f"{what}: not answered yet (replace the `...` with your answer "
                             "and run the cell again)")


def _check_what(what: Any) -> str:
    if not isinstance(what, str) or not what.strip():
        raise TypeError(f"what must be a non-empty str naming the quantity, got {what!r}")
    return what


def _as_tensor(x: Any, what: str, role: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    if isinstance(x, (bool, str, bytes, dict, set)):
        raise AssertionError(f"{what}: the {role} should be a number or a tensor, "
                             f"got {type(x).__name__} {x!r}")
    try:
        return torch.as_tensor(x, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise AssertionError(f"{what}: the {role} {x!r} is not numeric ({err})") from None


def check_close(answer: Any, expected: Any, rtol: float = 1e-6, atol: float = 0.0, *,
                what: str = "answer") -> None:
    """Assert |answer - expected| <= atol + rtol * |expected| elementwise.

    Scalars or tensors (shapes must match exactly: no broadcasting, a wrong shape is a wrong
    answer). The failure message gives both values and the relative error
    |answer - expected| / |expected|.
    """
    what = _check_what(what)
    checks.float_in_range(rtol, "rtol")
    checks.float_in_range(atol, "atol")
    _require_unanswered_free(answer, what)
    got = _as_tensor(answer, what, "answer")
    want = _as_tensor(expected, what, "expected value")
    if got.shape != want.shape:
        raise AssertionError(f"{what}: expected shape {tuple(want.shape)}, "
                             f"got shape {tuple(got.shape)}")
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: the answer contains inf or nan: {_short(got)}")
    err = (got - want).abs()                                  # same shape as the answer
    bound = atol + rtol * want.abs()
    if bool((err <= bound).all()):
        return
    worst = int(torch.argmax(err - bound))                    # flat index of the worst miss
    g, w = got.flatten()[worst].item(), want.flatten()[worst].item()
    rel = abs(g - w) / abs(w) if w != 0 else math.inf
    where = "" if got.dim() == 0 else f" at flat index {worst} (of {got.numel()})"
    raise AssertionError(f"{what}: got {_fmt(g)}, expected {_fmt(w)}{where}; "
                         f"off by {rel:.2%} (allowed: rtol={rtol:g}, atol={atol:g})")


def check_equal(answer: Any, expected: Any, *, what: str = "answer") -> None:
    """Assert ``answer == expected`` for exact things: counts, indices, shapes, strings."""
    what = _check_what(what)
    _require_unanswered_free(answer, what)
    if isinstance(answer, torch.Tensor) or isinstance(expected, torch.Tensor):
        a, e = torch.as_tensor(answer), torch.as_tensor(expected)
        if a.shape != e.shape or not torch.equal(a.to(e.dtype), e):
            raise AssertionError(f"{what}: got {_short(a)}, expected {_short(e)}")
        return
    if answer != expected:
        raise AssertionError(f"{what}: got {answer!r}, expected {expected!r}")


def check_shape(tensor: Any, shape: Sequence[int], *, what: str = "tensor") -> None:
    """Assert a tensor's shape; ``-1`` in ``shape`` matches any size on that axis."""
    what = _check_what(what)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(s, int) for s in shape):
        raise TypeError(f"shape must be a tuple of ints, got {shape!r}")
    _require_unanswered_free(tensor, what)
    if not isinstance(tensor, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor, got {type(tensor).__name__}")
    got = tuple(tensor.shape)
    ok = len(got) == len(shape) and all(s == -1 or s == g for s, g in zip(shape, got))
    if not ok:
        raise AssertionError(f"{what}: expected shape {tuple(shape)}, got {got}")


def check_raises(exception: type[BaseException], fn: Callable, *args: Any,
                 what: str = "invalid input", **kwargs: Any) -> None:
    """Assert ``fn(*args, **kwargs)`` raises ``exception`` (edge cases in hidden tests)."""
    what = _check_what(what)
    if not (isinstance(exception, type) and issubclass(exception, BaseException)):
        raise TypeError(f"exception must be an exception class, got {exception!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    try:
        fn(*args, **kwargs)
    except exception:
        return
    except Exception as err:  # the wrong kind of error is a wrong answer, say which
        raise AssertionError(f"{what}: expected {exception.__name__}, "
                             f"got {type(err).__name__}: {err}") from None
    raise AssertionError(f"{what}: expected {exception.__name__}, but the call returned normally")


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _short(t: torch.Tensor, n: int = 6) -> str:
    flat = t.flatten().tolist()
    body = ", ".join(_fmt(v) if isinstance(v, float) else str(v) for v in flat[:n])
    more = ", ..." if len(flat) > n else ""
    return f"tensor of shape {tuple(t.shape)} [{body}{more}]"
