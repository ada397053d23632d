"""`make site`: the executed lessons in build/ as a static site, readable without running anything.

    build/index.html        landing page: every lesson with its title, time, headline figures
                            (with units) and one figure from its run
    build/NN_name.html      each executed lesson (plots embedded), with links to the landing page
                            and to the lessons before and after it

The pages are nbconvert's HTML export of the notebooks ``make course`` executed into build/, one
self-contained file each (figures inlined as PNG), so the site opens from disk or from any static
file server and needs nothing at build time but nbconvert, which the kit already installs.
Jupyter Book 2 / MyST and mkdocs-jupyter would add a navigation sidebar and search, at the price
of Node.js (MyST fetches its theme on first build) or a mkdocs stack; our machines and CI reach
package registries only, and a course of 13 pages is read in order, so prev/next links serve.

A lesson's figure on the landing page is the output of the cell tagged ``site-figure`` if it has
one, else its first plot. ``make course`` rebuilds the site after each lesson it finishes.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_utils.report import readable  # noqa: E402

BUILD = ROOT / "build"
LESSON = re.compile(r"^\d\d_\w+$")
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222}
.lesson{display:grid;grid-template-columns:minmax(0,1fr) 26em;gap:1em;border-top:1px solid #ccc;padding:1em 0}
.lesson img{max-width:26em;width:100%} .lesson h2{margin:0 0 .3em 0;font-size:1.15em}
table.figures td{padding:0 1em 0 0;vertical-align:top} table.figures td:last-child{white-space:nowrap}
.error{color:#b00;white-space:pre-wrap} .meta{color:#555;font-size:.9em}"""
NAV_STYLE = """.nav{font-family:system-ui,sans-serif;padding:.5em 1em;background:#f3f3f3;
border-bottom:1px solid #ccc}.nav a{margin-right:1.5em}"""


def lesson_notebooks(build: Path) -> list[Path]:
    """The executed lessons in ``build`` (NN_name.ipynb), in course order."""
    return sorted(p for p in build.glob("*.ipynb") if LESSON.match(p.stem))


def title(nb) -> str:
    """The first markdown heading of the notebook, without its '#'s."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def figure(nb) -> str | None:
    """Base64 PNG of the lesson's figure: the cell tagged ``site-figure``, else the first plot."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "site-figure" in c.metadata.get("tags", [])]
    for cell in tagged + code:
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                return png.replace("\n", "")
    return None


def failure(nb) -> str | None:
    """The error a papermill run stopped at, as 'ename: evalue', or None if it ran through."""
    if not nb.metadata.get("papermill", {}).get("exception"):
        return None
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"{out['ename']}: {out['evalue']}"
    return "the run stopped with an error"


def raw_echoes(nb) -> list[str]:
    """Cells whose value Jupyter echoed as a raw dict or list (``{'a': 1}`` under a printed table):
    a number a reader sees twice, once formatted and once raw. Returns 'cell N: start of echo'."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get("text/plain", "") if out.get("output_type") == "execute_result" else ""
            if text.lstrip().startswith(("{", "[{", "[(", "({")):
                found.append(f"cell {i}: {text.strip()[:60]}")
    return found


def _nav(pages: list[str], i: int) -> str:
    links = ['<a href="index.html">all lessons</a>']
    if i > 0:
        links.append(f'<a href="{pages[i - 1]}.html">← {html.escape(pages[i - 1])}</a>')
    if i + 1 < len(pages):
        links.append(f'<a href="{pages[i + 1]}.html">{html.escape(pages[i + 1])} →</a>')
    return f'<div class="nav">{"".join(links)}</div>'


def export_lesson(path: Path, nav: str = "") -> Path:
    """``path`` (an executed notebook) as build/NAME.html, plots embedded, ``nav`` atop the body."""
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(path, as_version=4))
    if nav:
        body = body.replace("</head>", f"<style>{NAV_STYLE}</style></head>", 1)
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav, body, count=1)
    target = path.with_suffix(".html")
    target.write_text(body)
    return target


def _times(build: Path) -> dict:
    """lesson -> {scale: seconds} from the runner's build/times-SCALE.json files."""
    times: dict = {}
    for f in sorted(build.glob("times-*.json")):
        for name, seconds in read_json_dict(f).items():
            times.setdefault(name, {})[f.stem.removeprefix("times-")] = seconds
    return times


def read_json_dict(path: Path) -> dict:
    """The JSON object in ``path``, or {} if it is missing or not one (a run still writing it)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _card(name: str, nb, build: Path, times: dict, error: str | None) -> str:
    scale = nb.metadata.get("papermill", {}).get("parameters", {}).get("SCALE", "?")
    took = ", ".join(f"{s}: {t:.0f} s" for s, t in times.get(name, {}).items())
    meta = f'<div class="meta">executed at SCALE={html.escape(str(scale))}' + \
        (f"; measured times {html.escape(took)}" if took else "") + "</div>"
    error = error or failure(nb)
    if error:
        body = f'<div class="error">{html.escape(error)}</div>'
    else:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(readable(k, v))}</td></tr>"
                       for k, v in read_json_dict(build / "headlines" / f"{name}.json").items())
        body = f'<table class="figures">{rows}</table>' if rows else "<p>(no headline figures)</p>"
    png = figure(nb)
    image = f'<img alt="a figure from {html.escape(name)}" src="data:image/png;base64,{png}">' \
        if png else "<p>(no figure)</p>"
    heading = html.escape(title(nb) or name)
    return (f'<div class="lesson" id="{name}"><div><h2><a href="{name}.html">{html.escape(name)}</a>'
            f" · {heading}</h2>{meta}{body}</div><div>{image}</div></div>")


def build_site(build: Path = BUILD, errors: dict | None = None, export: list[str] | None = None) -> Path:
    """Export the executed lessons in ``build`` (``export``: only these names, e.g. the one the
    runner just finished; default all) and write the landing page; returns its path.
    ``errors``: lesson -> the runner's description of where it failed (else read from the
    notebook). Raises FileNotFoundError, saying what to run, if ``build`` holds no lesson."""
    paths = lesson_notebooks(build)
    if not paths:
        raise FileNotFoundError(f"no executed lessons in {build}: run `make course` (or "
                                f"`COURSE_SCALE=ci make course` for a quick pass) first")
    names, times, cards = [p.stem for p in paths], _times(build), []
    for i, path in enumerate(paths):
        try:
            nb = nbformat.read(path, as_version=4)
        except (OSError, ValueError) as err:   # e.g. a lesson papermill is writing right now
            cards.append(f'<div class="lesson" id="{path.stem}"><div><h2>{html.escape(path.stem)}</h2>'
                         f'<div class="error">not readable yet (still running?): '
                         f'{html.escape(str(err)[:200])}</div></div></div>')
            continue
        if export is None or path.stem in export or not path.with_suffix(".html").exists():
            export_lesson(path, _nav(names, i))
        cards.append(_card(path.stem, nb, build, times, (errors or {}).get(path.stem)))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>The training-ledger course: executed lessons</title>
<style>{STYLE}</style></head>
<body><h1>The training-ledger course</h1>
<p>Each lesson as <code>make course</code> executed it on this machine: its headline figures, one
figure from its run and the time it took. Open a lesson for every table and plot.</p>
{chr(10).join(cards)}
</body></html>
"""
    index = build / "index.html"
    index.write_text(page)
    return index


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, default=BUILD, help="folder of executed lessons (default build/)")
    args = p.parse_args(argv)
    try:
        index = build_site(args.build)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 1
    for path in lesson_notebooks(args.build):
        try:
            echoes = raw_echoes(nbformat.read(path, as_version=4))
        except (OSError, ValueError):
            continue
        if echoes:
            print(f"{path.stem}: a value echoed raw under its formatted print: {'; '.join(echoes)}")
    print(f"site: {index} ({len(lesson_notebooks(args.build))} lessons)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
