"""Build the lesson notebooks from their jupytext sources.

Each notebook is written as a jupytext "percent" script in ``notebooks/src/NN_name.py`` so that
reviews read as plain diffs (``# %%`` code cell, ``# %% [markdown]``, ``# %% [raw]`` for
otter-grader's markers, ``# %% tags=["parameters"]`` for papermill). ``python tools/notebooks.py
build`` (``make notebooks``) writes ``notebooks/NN_name.ipynb`` with no outputs; jupytext parses,
this file only fixes what the committed notebook carries: the kernelspec nbval and papermill need,
cell tags (no other cell metadata) and stable cell ids, so rebuilding an unchanged source changes
nothing. ``tests/test_notebook_rules.py`` checks every committed notebook against its source.

It also writes each lesson's student edition, ``notebooks/student/NN_name.ipynb``, and its
exercise checks, ``course_utils/practice_data/NN_name.json`` (tools/student.py);
``tests/test_notebook_rules.py`` checks they are up to date.
"""
from __future__ import annotations

import sys
from pathlib import Path

import json

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
STUDENT = OUT / "student"
PRACTICE_DATA = ROOT / "course_utils" / "practice_data"
sys.path.insert(0, str(ROOT / "tools"))

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def read_source(src: Path) -> nbformat.NotebookNode:
    """The notebook jupytext reads from a percent script (no kernelspec, jupytext's own metadata)."""
    return jupytext.read(src, fmt="py:percent")


def notebook(src: Path) -> nbformat.NotebookNode:
    """The notebook to commit for ``src``: its cells, tags only, ids ``cell-000``..., no outputs."""
    nb = read_source(src)
    nb.metadata = nbformat.from_dict({"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:03d}"
        tags = cell.metadata.get("tags")
        cell.metadata = nbformat.from_dict({"tags": tags} if tags else {})
    return nb


def render(src: Path) -> str:
    """``notebook(src)`` as the JSON text written to disk."""
    return nbformat.writes(notebook(src)) + "\n"


def student_files(src: Path) -> dict[Path, str]:
    """{path: text} of the student edition and the practice data built from ``src``."""
    from student import student_edition
    nb, data = student_edition(notebook(src), src.stem)
    return {STUDENT / f"{src.stem}.ipynb": nbformat.writes(nb) + "\n",
            PRACTICE_DATA / f"{src.stem}.json": json.dumps(data, indent=1, ensure_ascii=False) + "\n"}


def sources() -> list[Path]:
    return sorted(SRC.glob("[0-9][0-9]_*.py"))


def build() -> None:
    for src in sources():
        files = {OUT / (src.stem + ".ipynb"): render(src), **student_files(src)}
        for target, text in files.items():
            if not target.exists() or target.read_text() != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
                print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "build"
    if cmd != "build":
        sys.exit(f"usage: {sys.argv[0]} build  (tests/test_notebook_rules.py checks the result)")
    build()
