"""Showing results: small tables, and the headline figures ``make course`` prints."""
from __future__ import annotations

import json
import os
from pathlib import Path

HEADLINE_ENV = "COURSE_HEADLINE_FILE"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """Rows of dicts as a fixed-width text table."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
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
        print(f"{k.ljust(width)}  {_fmt(v)}")
    target = os.environ.get(HEADLINE_ENV)
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(clean, indent=1, default=str))
