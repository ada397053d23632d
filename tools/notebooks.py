"""Build the lesson notebooks from their plain-text sources.

Each notebook is written as a "percent" script in ``notebooks/src/NN_name.py`` so that
reviews read as plain diffs. ``python tools/notebooks.py build`` writes
``notebooks/NN_name.ipynb`` (no outputs); ``check`` fails if any committed notebook
differs from what its source would build.

Cell markers (one per line):
    # %% [markdown]            markdown cell; each line starts with "# " (or is "#")
    # %% [raw]                 raw cell (otter-grader's assign markers); same "# " prefix
    # %%                       code cell
    # %% tags=["parameters"]   code cell with tags (comma-separated, JSON list)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
MARKER = re.compile(r"^# %%(?: \[(markdown|raw)\])?(?: tags=(\[.*\]))?\s*$")

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _uncomment(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if line.startswith("# "):
            out.append(line[2:])
        elif line.rstrip() == "#":
            out.append("")
        else:
            raise ValueError(f"markdown/raw line must start with '# ': {line!r}")
    return out


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def parse(text: str) -> list[dict]:
    cells, kind, tags, body = [], None, [], []

    def flush():
        if kind is None:
            return
        lines = _trim(list(body))
        if kind in ("markdown", "raw"):
            lines = _uncomment(lines)
        source = "\n".join(lines)
        cell = {"cell_type": kind, "metadata": {}, "source": source}
        if tags:
            cell["metadata"]["tags"] = tags
        if kind == "code":
            cell["execution_count"] = None
            cell["outputs"] = []
        cells.append(cell)

    for line in text.splitlines():
        m = MARKER.match(line)
        if m:
            flush()
            kind = m.group(1) or "code"
            tags = json.loads(m.group(2)) if m.group(2) else []
            body = []
        elif kind is not None:
            body.append(line)
    flush()
    return cells


def to_notebook(cells: list[dict]) -> dict:
    out = []
    for i, cell in enumerate(cells):
        cell = dict(cell)
        cell["id"] = f"cell-{i:03d}"
        src = cell["source"].split("\n")
        cell["source"] = [s + "\n" for s in src[:-1]] + [src[-1]]
        out.append(cell)
    return {
        "cells": out,
        "metadata": {
            "kernelspec": KERNELSPEC,
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def render(src: Path) -> str:
    return json.dumps(to_notebook(parse(src.read_text())), indent=1, ensure_ascii=False) + "\n"


def sources() -> list[Path]:
    return sorted(SRC.glob("[0-9][0-9]_*.py"))


def build() -> None:
    for src in sources():
        target = OUT / (src.stem + ".ipynb")
        text = render(src)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")


def check() -> int:
    stale = [s.stem for s in sources()
             if not (OUT / (s.stem + ".ipynb")).exists()
             or (OUT / (s.stem + ".ipynb")).read_text() != render(s)]
    for name in stale:
        print(f"notebooks/{name}.ipynb is out of date: run `make notebooks`")
    return 1 if stale else 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "build"
    if cmd == "build":
        build()
    elif cmd == "check":
        sys.exit(check())
    else:
        sys.exit(f"usage: {sys.argv[0]} build|check")
