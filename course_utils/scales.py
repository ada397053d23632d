"""Scales: one notebook, three sizes of the same experiment.

``ci`` proves the notebook runs (seconds), ``default`` teaches (real curves within minutes on a
laptop CPU), ``gpu`` uses real datasets on a Colab GPU. Every scale runs the same code path; only
the numbers in the preset differ.

Who chooses, in this order: papermill's ``-p SCALE ...`` or an edit of the parameters cell, then
``$COURSE_SCALE``, then the device (:func:`auto_scale`: ``gpu`` where torch sees CUDA, else
``default``). ``runtime.setup`` prints the scale a lesson runs at and which of these chose it.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

SCALES = ("ci", "default", "gpu")
ENV_VAR = "COURSE_SCALE"


_AUTO: dict[str, str] = {}  # what auto_scale last chose, and why


def auto_scale() -> str:
    """The scale for a runtime that did not choose one: ``gpu`` where torch sees a CUDA device
    (a Colab GPU runtime), else ``default``. A parameters cell calls it only when
    ``$COURSE_SCALE`` is unset."""
    import torch
    if torch.cuda.is_available():
        _AUTO.update(scale="gpu", why=f"chosen by the device: torch sees CUDA "
                                      f"({torch.cuda.get_device_name(0)})")
    else:
        _AUTO.update(scale="default", why="chosen by the device: no CUDA, so the CPU teaching scale")
    return _AUTO["scale"]


def scale_reason(scale: str) -> str:
    """Which of papermill/the parameters cell, ``$COURSE_SCALE`` or the device chose ``scale``."""
    if os.environ.get(ENV_VAR) == scale:
        return f"from ${ENV_VAR}"
    if _AUTO.get("scale") == scale and not os.environ.get(ENV_VAR):
        return _AUTO["why"]
    return "set in the parameters cell (or by papermill)"


def resolve_scale(scale: str | None = None) -> str:
    """Return a valid scale name: ``scale`` if given, else ``$COURSE_SCALE``, else "default"."""
    if scale is None:
        scale = os.environ.get(ENV_VAR, "default")
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: set SCALE (or ${ENV_VAR}) to one of {SCALES}")
    return scale


class Config(SimpleNamespace):
    """The chosen preset: attribute access, plus ``.scale`` and ``as_dict()``."""

    def as_dict(self) -> dict:
        return dict(vars(self))

    def __getitem__(self, key):
        return getattr(self, key)


def config(scale: str | None, *, ci: dict, default: dict, gpu: dict | None = None,
           common: dict | None = None) -> Config:
    """Pick the preset for ``scale``. ``common`` holds values shared by all scales.

    ``gpu`` falls back to ``default`` when a lesson has nothing GPU-specific. Every preset must
    define the same keys, so a value cannot silently exist at one scale only.
    """
    scale = resolve_scale(scale)
    presets = {"ci": ci, "default": default, "gpu": default if gpu is None else gpu}
    keys = {name: set(p) for name, p in presets.items()}
    if len({frozenset(k) for k in keys.values()}) != 1:
        all_keys = set().union(*keys.values())
        missing = {n: sorted(all_keys - k) for n, k in keys.items() if all_keys - k}
        raise ValueError(f"every scale must set the same keys; missing: {missing}")
    values = dict(common or {})
    values.update(presets[scale])
    values.setdefault("seed", 0)
    return Config(scale=scale, **values)
