"""`make course`: execute every lesson notebook with papermill into build/, print headline figures.

Each notebook records its headline figures with ``course_utils.report.headline`` into the file
named by $COURSE_HEADLINE_FILE, which this runner sets per notebook. As each lesson finishes the
runner prints its time, its headline figures and where the executed notebook is (or, on an error,
the failing cell), exports it to HTML, and rewrites build/index.html: one page linking every
executed lesson beside its figures and time.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time
from pathlib import Path

import nbformat
import papermill as pm
from nbconvert import HTMLExporter
from traitlets.config import Config

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
# IPC transport (unix sockets) instead of TCP on localhost: the kernel then has no plain-text
# network traffic to warn about ("Kernel is running over TCP without encryption", ipykernel).
KERNEL_CONFIG = Config({"KernelManager": {"transport": "ipc"}})


def lessons(only: list[str]) -> list[Path]:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(nb.stem.startswith(o) for o in only)]
        if not notebooks:
            sys.exit(f"no notebook matches {only}; names start with 00, 01, ...")
    return notebooks


def execute(nb: Path, out: Path, scale: str) -> dict:
    """Run one lesson; {"name", "seconds", "figures", "error"} (error: None or a sentence)."""
    headline_file = BUILD / "headlines" / f"{nb.stem}.json"
    headline_file.unlink(missing_ok=True)
    os.environ["COURSE_HEADLINE_FILE"] = str(headline_file)
    start = time.time()
    error = None
    try:
        pm.execute_notebook(str(nb), str(out), parameters={"SCALE": scale}, cwd=str(nb.parent),
                            kernel_name="python3", progress_bar=True, config=KERNEL_CONFIG)
    except pm.PapermillExecutionError as err:
        first = next((l for l in err.source.splitlines() if l.strip()), "")
        error = (f"cell {lesson_cell_index(out, err.cell_index)} of notebooks/{nb.name} "
                 f"(In [{err.exec_count}]: {first.strip()[:80]})\n"
                 f"    {err.ename}: {err.evalue[:1500]}")
    except Exception as err:  # kernel died, timeout, ...: keep going, report every broken lesson
        error = f"{type(err).__name__}: {str(err)[-1500:]}"
    figures = json.loads(headline_file.read_text()) if headline_file.exists() else {}
    return {"name": nb.stem, "seconds": time.time() - start, "figures": figures, "error": error}


def lesson_cell_index(executed: Path, index: int) -> int:
    """Index in the lesson of cell ``index`` of its executed copy, which papermill gave one more
    cell (the injected parameters) after the parameters cell."""
    try:
        cells = nbformat.read(executed, as_version=4).cells
    except (OSError, ValueError):
        return index
    return index - sum(1 for c in cells[:index] if "injected-parameters" in c.metadata.get("tags", []))


def show(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def report(result: dict, out: Path) -> None:
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    if result["error"]:
        print(f"FAILED {result['name']} after {result['seconds']:.0f} s at {result['error']}\n"
              f"    the executed notebook, with the error, is {where}", flush=True)
        return
    print(f"{result['name']} done in {result['seconds']:.0f} s -> {where}", flush=True)
    for k, v in result["figures"].items():
        print(f"    {k}: {show(v)}", flush=True)


def export_html(executed: Path) -> Path | None:
    """The executed notebook as one self-contained HTML page (plots embedded), or None."""
    if not executed.exists():
        return None
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    target = executed.with_suffix(".html")
    target.write_text(body)
    return target


def write_index(results: list[dict], scale: str) -> Path:
    """build/index.html: every executed lesson, its time, its headline figures, a link."""
    rows = []
    for r in results:
        link = f'<a href="{html.escape(r["name"])}.html">{html.escape(r["name"])}</a>' \
            if r.get("html") else html.escape(r["name"])
        if r["error"]:
            figures = f'<pre class="error">{html.escape(r["error"])}</pre>'
        else:
            figures = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(show(v))}</td></tr>"
                              for k, v in r["figures"].items())
            figures = f"<table>{figures}</table>"
        rows.append(f"<tr><td>{link}</td><td>{r['seconds']:.0f} s</td><td>{figures}</td></tr>")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Training-ledger course: results (SCALE={scale})</title>
<style>body{{font-family:sans-serif;margin:2em}} td{{vertical-align:top;padding:2px 8px}}
.error{{color:#b00}} table table td{{padding:0 8px 0 0}}</style></head>
<body><h1>Training-ledger course: results at SCALE={html.escape(scale)}</h1>
<p>Each lesson as executed by <code>make course</code>, with its headline figures and time.</p>
<table><tr><th>lesson</th><th>time</th><th>headline figures</th></tr>
{chr(10).join(rows)}
</table></body></html>
"""
    index = BUILD / "index.html"
    index.write_text(page)
    return index


def run(scale: str, only: list[str]) -> int:
    notebooks = lessons(only)
    BUILD.mkdir(exist_ok=True)
    results = []
    for i, nb in enumerate(notebooks, 1):
        out = BUILD / nb.name
        print(f"\n=== [{i}/{len(notebooks)}] {nb.stem} (SCALE={scale})", flush=True)
        result = execute(nb, out, scale)
        report(result, out)
        result["html"] = export_html(out)
        results.append(result)
        index = write_index(results, scale)
    print(f"\n=== {len(results)} lesson(s) in {sum(r['seconds'] for r in results):.0f} s; "
          f"results page: {index.relative_to(ROOT)}")
    for r in results:
        status = "FAILED" if r["error"] else "ok"
        print(f"    {r['name']:<32} {r['seconds']:>5.0f} s  {status}")
    failures = [r["name"] for r in results if r["error"]]
    if failures:
        print(f"\n{len(failures)} notebook(s) failed: {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", default="default", choices=["ci", "default", "gpu"])
    p.add_argument("only", nargs="*", help="notebook prefixes to run, e.g. 01 04 (default: all)")
    args = p.parse_args()
    sys.exit(run(args.scale, args.only))
