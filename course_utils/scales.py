"""Scales: one notebook, three sizes of the same experiment.

``ci`` proves the notebook runs (seconds), ``default`` teaches (real curves within minutes on a
laptop CPU), ``gpu`` uses real datasets on a Colab GPU. Every scale runs the same code path; only
the numbers in the preset differ.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

SCALES = ("ci", "default", "gpu")
ENV_VAR = "COURSE_SCALE"


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
