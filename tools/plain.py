"""Plain data: the only thing that crosses from a submission's sandbox to the code that grades it.

Grading (tools/grade.py) never runs a submission's code where a score is decided. What a
submission's kernel (stage 1) or a student's function (the function sandboxes) hands back is
encoded here as JSON, in a small tagged form, and decoded on the trusted side by :func:`decode`,
which accepts only these shapes, within size and depth limits, and builds fresh objects of exact
built-in types (a ``torch.Tensor`` is rebuilt with ``torch.tensor`` from numbers), so no object of
the submission's making, and none of its methods, ever reaches a check:

    3, 2.5, "text", true, null             JSON scalars (finite floats; ints of any size)
    {"float": "nan" | "inf" | "-inf"}       the non-finite floats JSON cannot spell
    {"list": [...]}, {"tuple": [...]}       sequences
    {"dict": [[key, value], ...]}           a dict; keys are scalars
    {"tensor": {"dtype": "float32", "shape": [2, 3], "data": [...flat numbers...]}}
    {"ellipsis": true}                      ``...``: the placeholder of an unanswered exercise

Why hand-written: ``json`` alone cannot tell a tuple from a list or carry a tensor, and pickle
would run the submission's code on load (``__reduce__``); this is the smallest format that keeps
the answers' types and can be checked completely. :func:`encode` runs on the untrusted side, so
nothing depends on it being honest: :func:`decode` checks everything.
"""
from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 24                 # nesting of lists/dicts/tuples
MAX_ITEMS = 2_000_000          # scalars and containers in one value, tensors' numbers included
MAX_STRING = 100_000           # characters in one string
MAX_TENSOR_ELEMENTS = 1_000_000
TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class TensorData(dict):
    """A validated tensor not yet built (``decode(..., build_tensors=False)``)."""


class NotPlainData(ValueError):
    """The value is not one of the shapes above (or exceeds a limit); the message says which."""


# --------------------------------------------------------------------------- untrusted side

def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as plain JSON data; raises NotPlainData for anything else (an object, a
    function, a model). Tensors (and their subclasses, read through ``torch.Tensor``'s own
    methods) become dtype, shape and numbers."""
    if _depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, (int, str)):  # subclasses (an IntEnum, torch.Size's items) as the base
        return int(value) if isinstance(value, int) else str(value)
    if isinstance(value, float):
        value = float(value)
        return value if math.isfinite(value) else {"float": repr(value)}
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [encode(v, _depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in value.items()]}
    torch = _torch_if_loaded()
    if torch is not None and isinstance(value, torch.Tensor):
        plain = torch.Tensor.as_subclass(value, torch.Tensor).detach().cpu()
        return {"tensor": {"dtype": str(plain.dtype).removeprefix("torch."),
                           "shape": list(plain.shape),
                           "data": [_number(x) for x in plain.flatten().tolist()]}}
    numpy_scalar = getattr(value, "item", None) if type(value).__module__ == "numpy" else None
    if numpy_scalar is not None:
        return encode(numpy_scalar(), _depth)
    raise NotPlainData(f"a {type(value).__name__} is not plain data (give a number, string, "
                       "list, tuple, dict or tensor)")


def _number(x):
    return x if not (type(x) is float and not math.isfinite(x)) else {"float": repr(x)}


def _torch_if_loaded():
    import sys
    return sys.modules.get("torch")


def dumps(value: Any) -> str:
    return json.dumps(encode(value), allow_nan=False)


# --------------------------------------------------------------------------- trusted side

def loads(text: str | bytes, *, max_bytes: int = 64 * 2**20, build_tensors: bool = True) -> Any:
    """Parse JSON text and :func:`decode` it. Raises NotPlainData for anything malformed (too
    large, too deep, not JSON, not one of the shapes)."""
    if len(text) > max_bytes:
        raise NotPlainData(f"more than {max_bytes} bytes")
    return decode(parse_json(text), build_tensors=build_tensors)


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` that turns every way it can fail (bad bytes, deep nesting) into
    NotPlainData, and refuses NaN/Infinity literals."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise NotPlainData("nested too deeply") from None
    except (ValueError, TypeError) as err:
        raise NotPlainData(f"not JSON ({str(err)[:200]})") from None


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def decode(data: Any, *, build_tensors: bool = True) -> Any:
    """The value that plain ``data`` (parsed JSON) encodes, built from exact built-in types
    (and ``torch.tensor``); NotPlainData if it is not plain data within the limits.
    ``build_tensors=False`` validates a tensor without importing torch and returns its dict."""
    budget = [MAX_ITEMS]
    return _decode(data, 0, budget, build_tensors)


def _decode(data: Any, depth: int, budget: list[int], build: bool) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlainData(f"more than {MAX_ITEMS} items")
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    if data is None or type(data) in (bool, int):
        return data
    if type(data) is float:
        if not math.isfinite(data):
            raise NotPlainData("a non-finite float must be spelled {'float': 'nan'}")
        return data
    if type(data) is str:
        if len(data) > MAX_STRING:
            raise NotPlainData(f"a string longer than {MAX_STRING} characters")
        return data
    if type(data) is not dict or len(data) != 1:
        raise NotPlainData(f"unexpected {type(data).__name__}")
    (tag, body), = data.items()
    if tag == "float" and body in _NONFINITE:
        return _NONFINITE[body]
    if tag == "ellipsis" and body is True:
        return ...
    if tag in ("list", "tuple") and type(body) is list:
        items = [_decode(v, depth + 1, budget, build) for v in body]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and type(body) is list:
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise NotPlainData("a dict entry must be [key, value]")
            key = _decode(pair[0], depth + 1, budget, build)
            if not (key is None or type(key) in (bool, int, float, str)):
                raise NotPlainData("dict keys must be numbers or strings")
            out[key] = _decode(pair[1], depth + 1, budget, build)
        return out
    if tag == "tensor" and type(body) is dict:
        return _tensor(body, budget, build)
    raise NotPlainData(f"unknown form {tag!r}")


def _tensor(body: dict, budget: list[int], build: bool):
    if set(body) != {"dtype", "shape", "data"}:
        raise NotPlainData("a tensor has exactly dtype, shape and data")
    dtype, shape, data = body["dtype"], body["shape"], body["data"]
    if dtype not in TENSOR_DTYPES:
        raise NotPlainData(f"tensor dtype {dtype!r} is not one of {TENSOR_DTYPES}")
    if type(shape) is not list or len(shape) > 8 or \
            not all(type(s) is int and 0 <= s <= MAX_TENSOR_ELEMENTS for s in shape):
        raise NotPlainData("a tensor's shape is a list of at most 8 sizes")
    if type(data) is not list or len(data) > MAX_TENSOR_ELEMENTS or len(data) != math.prod(shape):
        raise NotPlainData("a tensor's data must hold prod(shape) numbers")
    budget[0] -= len(data)
    if budget[0] < 0:
        raise NotPlainData(f"more than {MAX_ITEMS} items")
    numbers = []
    for x in data:
        if type(x) in (bool, int, float):
            numbers.append(x)
        elif type(x) is dict and len(x) == 1 and x.get("float") in _NONFINITE:
            numbers.append(_NONFINITE[x["float"]])
        else:
            raise NotPlainData("a tensor's data must be numbers")
    if not build:
        return TensorData(tensor={"dtype": dtype, "shape": shape, "data": numbers})
    import torch
    try:
        return torch.tensor(numbers, dtype=getattr(torch, dtype)).reshape(shape)
    except (RuntimeError, TypeError, OverflowError) as err:
        raise NotPlainData(f"tensor data do not fit dtype {dtype}: {err}") from None


def reencode(value: Any) -> Any:
    """Decoded data (``build_tensors=False``) back to its plain form, for handing validated data
    on to the next stage."""
    if type(value) is TensorData:
        t = value["tensor"]
        return {"tensor": {**t, "data": [_number(x) for x in t["data"]]}}
    if type(value) is float and not math.isfinite(value):
        return {"float": repr(value)}
    if value is Ellipsis:
        return {"ellipsis": True}
    if type(value) in (list, tuple):
        return {type(value).__name__: [reencode(v) for v in value]}
    if type(value) is dict:
        return {"dict": [[reencode(k), reencode(v)] for k, v in value.items()]}
    return value


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
            if chr(c) not in "\n\t"}


def printable_text(text: str, *, keep_newlines: bool = True) -> str:
    """Submission text made safe to print or store: control characters (ANSI escapes that
    rewrite a terminal, carriage returns) as ``\\xNN``, and what UTF-8 cannot encode (a lone
    surrogate) as a backslash escape."""
    table = dict(_CONTROL) if keep_newlines else {**_CONTROL, 0x0A: "\\n", 0x09: "\\t"}
    return text.translate(table).encode("utf-8", "backslashreplace").decode("utf-8")
