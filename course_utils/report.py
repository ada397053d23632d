"""Showing results: small tables, and the headline figures ``make course`` prints."""
from __future__ import annotations

import json
import os
from pathlib import Path

HEADLINE_ENV = "COURSE_HEADLINE_FILE"


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if 1e4 <= abs(v) < 1e18:   # a large number reads as an int would show: 22,032, not 2.203e+04
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


_SCALED = {"B": ("", "k", "M", "G", "T", "P"), "FLOP": ("", "k", "M", "G", "T", "P", "E")}


def _scaled(value: float, unit: str) -> str:
    """1234567 B -> '1.23 MB' (decimal prefixes, as the lessons print MB and GB)."""
    prefixes, step = _SCALED[unit], 0
    while abs(value) >= 1000 and step < len(prefixes) - 1:
        value, step = value / 1000, step + 1
    return f"{value:.4g} {prefixes[step]}{unit}"


def quantity(value: float, unit: str) -> str:
    """A count of ``unit`` ("B" or "FLOP") with a decimal prefix: 1234567 B -> '1.23 MB'."""
    return _scaled(value, unit)


def readable(name: str, value) -> str:
    """A headline figure with its unit, read from its name: ``*_bytes`` and ``*_mb``/``_kb``/
    ``_gb``/``_gib`` in bytes, ``*flops*`` in FLOP, ``*seconds*`` in s, ``probe_*``/``*_acc``/
    ``*mfu*`` fractions as percent, ``*_points*`` as points; ``*_over_*``/``*ratio*``/``*_vs_*``
    and small ``*flops*`` figures are ratios (x). Anything else, and every non-number, as ``_fmt`` writes it. The recorded value is never
    changed: this is only how it is shown."""
    if isinstance(value, (list, tuple)):   # one figure per rank or stage: each with its unit
        return ", ".join(readable(name, v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "yes" if value is True else "no" if value is False else _fmt(value)
    key = name.lower()
    if ("_over_" in key or "ratio" in key or "_vs_" in key) and "diff" not in key and "gap" not in key:
        return f"{value:.4g}x"
    if "_points" in key or key.startswith("gain_points"):
        return f"{value:+.1f} points"
    if "probe" in key and any(w in key for w in ("spread", "standard_error")):
        return f"{100 * value:.1f} points"    # a width of accuracies (fractions)
    if "probe" in key and any(w in key for w in ("gain", "gap", "diff")):
        return f"{100 * value:+.1f} points"   # a difference of two accuracies (fractions)
    if key.endswith("_share"):
        return f"{100 * value:.1f}%"
    for suffix, factor in (("_bytes", 1), ("_kb", 1e3), ("_mb", 1e6), ("_gb", 1e9), ("_gib", 2**30)):
        if key.endswith(suffix) or f"{suffix}_" in key:
            return _scaled(value * factor, "B") if factor != 2**30 else f"{value:.4g} GiB"
    if "flops" in key:      # a count of FLOPs is large; a small "flops" figure is a ratio of two
        return _scaled(value, "FLOP") if abs(value) >= 1000 else f"{value:.4g}x"
    if "seconds" in key:
        return f"{value:.4g} s"
    if (key.startswith("probe_") and "gain" not in key and "spread" not in key and "diff" not in key
            or key.endswith("_acc") or "mfu" in key) and 0 <= value <= 1:
        return f"{100 * value:.1f}%"
    return _fmt(value)


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """Rows of dicts as a fixed-width text table."""
    if not rows:
        return "(no rows)"
    # every row's keys, in order of first appearance: rows may differ (a missing cell prints —)
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def show_table(rows: list[dict], columns: list[str] | None = None) -> None:
    print(format_table(rows, columns))


def headline(**figures) -> None:
    """Print a notebook's headline figures and, under ``make course``, record them to a file.
    Returns nothing, so that a cell ending in ``headline(...)`` shows the table once, not the
    table and then the same values again as a dict."""
    clean = {k: (float(v) if hasattr(v, "item") else v) for k, v in figures.items()}
    width = max(map(len, clean), default=0)
    for k, v in clean.items():
        print(f"{k.ljust(width)}  {readable(k, v)}")
    target = os.environ.get(HEADLINE_ENV)
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(clean, indent=1, default=str))


def committed_result(name: str, folder: str = "results") -> dict | None:
    """The committed result ``name`` (``benchmarks/<folder>/<name>.json`` of the repository the
    kit runs from: ``results`` for the benchmarks, ``gpu_runs`` for what GPU runs recorded), or
    None where the kit runs without its repository (installed from a wheel, or in a grading
    sandbox): the lessons' pointers to a benchmark check it there."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def ssl_quality_gains(result: dict, dataset: str, objectives: tuple[str, ...]) -> dict:
    """(objective, seed) -> linear-probe gain in points over the same seed's random init, from a
    committed ``ssl_quality`` result."""
    rows = result["datasets"][dataset]
    return {(name, int(seed)): run["linear_gain_points"]
            for name in objectives for seed, run in rows[name]["seeds"].items()}
