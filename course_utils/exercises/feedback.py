"""Checks that exercise tests call, so a wrong answer reads as a sentence, not a bare assert.

Every check raises ``AssertionError`` (what otter-grader reports as a failed test) whose message
names the quantity and says how the answer disagrees: in which direction and by what factor
("your answer 49,152 is 2–5× too small (allowed: rtol=0)"; smaller misses as a percentage band:
"10–25% too large"), for a tensor which
element misses most, for things that are not numbers only that they differ. A message never
contains the expected value, so one wrong try does not give away a predict-then-measure answer
(``exercises.reveal(name)`` in a student edition is the way to see a solution). Shapes and lengths
are stated: a wrong shape is structural, not the answer. An answer still equal to ``...`` (what
``otter assign`` leaves where a solution was) is reported as "not answered yet" instead of a type
error.

    check_close(predicted_bytes, record.optimizer_bytes, rtol=0.01, what="Adam state bytes")
    check_equal(queue.ptr, 3, what="queue pointer after one enqueue")
    check_shape(visible, (2, 4, 8), what="visible tokens")
    check_raises(ValueError, random_masking, tokens, 1.5, what="mask_ratio above 1")
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import torch

from .. import checks

__all__ = ["check_close", "check_equal", "check_shape", "check_raises", "is_unanswered",
           "describe_miss", "describe_difference"]


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
    # only the answer is ever shown: the expected value is named by its type at most
    shown = f" {x!r}" if role == "answer" else ""
    if isinstance(x, torch.Tensor) and x.dtype != torch.bool:
        return x.detach().to("cpu", torch.float64)
    if isinstance(x, torch.Tensor) or (isinstance(x, (list, tuple)) and x and
                                       all(isinstance(v, bool) for v in x)):
        raise AssertionError(f"{what}: the {role} should be numbers, got booleans")
    if isinstance(x, (bool, str, bytes, dict, set)):
        raise AssertionError(f"{what}: the {role} should be a number or a tensor, "
                             f"got {type(x).__name__}{shown}")
    try:
        return torch.as_tensor(x, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        detail = f" ({err})" if role == "answer" else ""
        raise AssertionError(f"{what}: the {role}{shown} is not numeric{detail}") from None


def check_close(answer: Any, expected: Any, rtol: float = 1e-6, atol: float = 0.0, *,
                what: str = "answer") -> None:
    """Assert |answer - expected| <= atol + rtol * |expected| elementwise.

    Scalars or tensors (shapes must match exactly: no broadcasting, a wrong shape is a wrong
    answer). The failure message says in which direction and by what factor the answer (for a
    tensor, its worst element, by index) misses, never the expected value.
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
    bad = ~(err <= bound)
    if not bool(bad.any()):
        return
    worst = int(torch.argmax(torch.where(bad, err - bound, torch.full_like(err, -math.inf))))
    g, w = got.flatten()[worst].item(), want.flatten()[worst].item()
    allowed = f"allowed: rtol={rtol:g}" + (f", atol={atol:g}" if atol else "")
    if got.dim() == 0:
        raise AssertionError(f"{what}: your answer {_fmt(answer if _is_number(answer) else g, g, w)} "
                             f"is {describe_miss(g, w, allowed)}")
    where = _index(worst, tuple(got.shape))
    raise AssertionError(f"{what}: element {where} of your tensor of shape {tuple(got.shape)} "
                         f"misses most: your {_fmt(g, g, w)} there is {describe_miss(g, w, allowed)}; "
                         f"{int(bad.sum())} of {got.numel()} elements are outside the tolerance")


def check_equal(answer: Any, expected: Any, *, what: str = "answer") -> None:
    """Assert ``answer == expected`` for exact things: counts, indices, shapes, strings.

    On a miss the message says where and how the answer differs (direction and factor for
    numbers, the index for tensors and sequences, the key for dicts), never the expected value.
    """
    what = _check_what(what)
    _require_unanswered_free(answer, what)
    diff = describe_difference(answer, expected)
    if diff is not None:
        raise AssertionError(f"{what}: {diff}")


def describe_miss(got: float, want: float, allowed: str = "") -> str:
    """How ``got`` misses ``want``, without ``want``: "2–5× too small", "10–25% too large", "too large, and of the wrong sign". ``allowed`` is appended in the
    parentheses (the tolerance)."""
    if math.isnan(got) or math.isnan(want):
        return f"not a number{f' ({allowed})' if allowed else ''}"
    direction = "too large" if got > want else "too small"
    if want == 0 or got == 0 or (got > 0) != (want > 0):
        sign = "" if want == 0 or got == 0 else ", and of the wrong sign"
        return f"{direction}{sign}{f' ({allowed})' if allowed else ''}"
    rel = abs(got - want) / abs(want)
    ratio = abs(got) / abs(want)
    factor = max(ratio, 1 / ratio)
    if want > 0:
        if factor >= 2:
            return f"{_times(factor)} {direction}{f' ({allowed})' if allowed else ''}"
        return f"{_percent(rel)} {direction}{f' ({allowed})' if allowed else ''}"
    size = "too small" if ratio < 1 else "too large"  # negative numbers: speak of the magnitude
    if factor >= 2:
        return f"{direction}: its magnitude is {_times(factor)} {size}{f' ({allowed})' if allowed else ''}"
    return f"{direction}: its magnitude is {_percent(rel)} {size}{f' ({allowed})' if allowed else ''}"


def describe_difference(answer: Any, expected: Any, _where: str = "") -> str | None:
    """None if ``answer == expected``; otherwise a sentence saying where and how the answer
    differs, which shows the answer's own parts at most, never the expected value's."""
    label = f"your answer{_where}"
    if isinstance(answer, torch.Tensor) or isinstance(expected, torch.Tensor):
        return _tensor_difference(answer, expected, label)
    if _is_number(answer) and _is_number(expected):
        if answer == expected:
            return None
        return (f"{label} {_fmt(answer, float(answer), float(expected))} is "
                f"{describe_miss(float(answer), float(expected), 'it must be exact')}")
    if isinstance(answer, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(answer) != len(expected):
            return (f"{label} has {len(answer)} item(s), the check expects {len(expected)}")
        for i, (a, e) in enumerate(zip(answer, expected)):
            diff = describe_difference(a, e, f"{_where}[{i}]")
            if diff is not None:
                return diff
        if type(answer) is not type(expected):
            return f"{label} is a {type(answer).__name__}, the check expects a {type(expected).__name__}"
        return None
    if isinstance(answer, dict) and isinstance(expected, dict):
        missing = [k for k in expected if k not in answer]
        extra = [k for k in answer if k not in expected]
        if missing or extra:
            parts = ([f"lacks the key(s) {missing}"] if missing else []) + \
                ([f"has unexpected key(s) {extra}"] if extra else [])
            return f"{label} {' and '.join(parts)}"
        for k in expected:
            diff = describe_difference(answer[k], expected[k], f"{_where}[{k!r}]")
            if diff is not None:
                return diff
        return None
    if isinstance(answer, bool) != isinstance(expected, bool):  # True == 1 in Python
        return f"{label} is a {type(answer).__name__}, the check expects a {type(expected).__name__}"
    try:
        same = bool(answer == expected)
    except Exception:  # noqa: BLE001 - an answer whose == fails is not equal
        same = False
    if same:
        return None
    if type(answer) is not type(expected) and not (_is_number(answer) and _is_number(expected)):
        return f"{label} is a {type(answer).__name__}, the check expects a {type(expected).__name__}"
    return f"{label} {_short_repr(answer)} is not what the check expects"


def _tensor_difference(answer: Any, expected: Any, label: str) -> str | None:
    try:
        a, e = torch.as_tensor(answer), torch.as_tensor(expected)
    except (TypeError, ValueError, RuntimeError):
        return f"{label} is a {type(answer).__name__}, the check expects a tensor"
    if a.shape != e.shape:
        return f"{label}: expected shape {tuple(e.shape)}, got shape {tuple(a.shape)}"
    if (a.dtype == torch.bool) != (e.dtype == torch.bool):  # True is not "any non-zero number"
        return (f"{label} is a tensor of {'booleans' if a.dtype == torch.bool else 'numbers'}, "
                f"the check expects {'booleans' if e.dtype == torch.bool else 'numbers'}")
    if a.dtype == e.dtype and torch.equal(a, e):
        return None
    if e.dtype != torch.bool and a.dtype != torch.bool and e.numel() and \
            not (a.is_complex() or e.is_complex()):
        a64, e64 = a.detach().cpu().double(), e.detach().cpu().double()
        err = (a64 - e64).abs()
        differ = err != 0
        if not bool(differ.any()):
            return None
        worst = int(torch.argmax(torch.where(differ, err, torch.full_like(err, -1.0))))
        g, w = a64.flatten()[worst].item(), e64.flatten()[worst].item()
        where = "" if a.dim() == 0 else f" at {_index(worst, tuple(a.shape))}"
        count = "" if a.dim() == 0 else f"; {int(differ.sum())} of {a.numel()} elements differ"
        return (f"{label} (a tensor of shape {tuple(a.shape)}) misses most{where}: your {_fmt(g, g, w)} "
                f"there is {describe_miss(g, w, 'it must be exact')}{count}")
    common = torch.promote_types(a.dtype, e.dtype)  # never the answer's dtype: it could round
    differ = a.detach().cpu().to(common) != e.detach().cpu().to(common)
    if not bool(differ.any()):
        return None
    first = int(torch.nonzero(differ.flatten())[0])
    return (f"{label} (a tensor of shape {tuple(a.shape)}) differs at {int(differ.sum())} of "
            f"{a.numel()} position(s), first at {_index(first, tuple(a.shape))} (yours: "
            f"{a.flatten()[first].item()!r})")


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


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _fmt(x: Any, got: float | None = None, want: float | None = None) -> str:
    """A number for a message; given the answer ``got`` and what it should be, with enough
    digits that the answer does not print as if it were right."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return f"{int(x):,}"
    x = float(x)
    if x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    digits = 6
    if got is not None and want is not None and want != 0 and got != want:
        rel = abs(got - want) / abs(want)
        digits = min(17, max(6, math.ceil(-math.log10(rel)) + 2)) if rel > 0 else 6
    return f"{x:.{digits}g}"


_BANDS = (0.001, 0.01, 0.1, 0.25, 0.5, 1.0)


def _percent(rel: float) -> str:
    """A band, not the exact error: with the answer beside it an exact percentage would give the
    expected value away (4 is "33.3% too large" only of 3)."""
    for lo, hi in zip((0.0,) + _BANDS, _BANDS):
        if rel < hi:
            return f"less than {100 * hi:g}%" if lo == 0 else f"{100 * lo:g}–{100 * hi:g}%"
    return "over 100%"


_FACTOR_BANDS = (2, 5, 10, 100, 1000)


def _times(factor: float) -> str:
    """A band ("2–5×"), not the factor: with the answer beside it, a factor gives the expected
    value away (answering 1 would print it)."""
    for lo, hi in zip(_FACTOR_BANDS, _FACTOR_BANDS[1:]):
        if factor < hi:
            return f"{lo}–{hi}×"
    return f"over {_FACTOR_BANDS[-1]}×"


def _index(flat: int, shape: tuple[int, ...]) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def _short_repr(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short(t: torch.Tensor, n: int = 6) -> str:
    flat = t.flatten().tolist()
    body = ", ".join(_fmt(v) for v in flat[:n])
    more = ", ..." if len(flat) > n else ""
    return f"tensor of shape {tuple(t.shape)} [{body}{more}]"
