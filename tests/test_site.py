"""`make site` (tools/course_site.py): the executed lessons as pages a browser shows.

The browser test builds the site from executed notebooks and opens it in headless Chromium: the
landing page lists every lesson with its headline figures in units and an image that decoded, and
each lesson page shows its plots and links its neighbours. By default the notebooks are small
stand-ins written here (a real plot, real headline figures) so the test costs a second; with
COURSE_SITE_BUILD=build (after `make course`) the same checks run on the real course's build.
The static test checks what the stand-ins cannot: every lesson source makes a plot and has a
title, so every real lesson has something for its card.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import course_site  # noqa: E402
from test_browser import chromium  # noqa: E402


def _png() -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1, 2], [0, 1, 4])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _executed(path: Path, heading: str, figures: dict, *, plot: bool = True, echo: str | None = None,
              error: bool = False) -> None:
    """An executed lesson as papermill leaves it: parameters, a heading, printed figures, a plot."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["papermill"] = {"parameters": {"SCALE": "ci"}, "exception": error}
    printed = nbformat.v4.new_code_cell("headline(...)", outputs=[nbformat.v4.new_output(
        "stream", name="stdout", text="\n".join(f"{k}  {v}" for k, v in figures.items()))])
    cells = [nbformat.v4.new_markdown_cell(f"# {heading}\n\nProse."), printed]
    if plot:
        cells.append(nbformat.v4.new_code_cell("plt.show()", outputs=[nbformat.v4.new_output(
            "display_data", data={"image/png": _png(), "text/plain": "<Figure>"})]))
    if echo:
        cells.append(nbformat.v4.new_code_cell("x", execution_count=3, outputs=[nbformat.v4.new_output(
            "execute_result", data={"text/plain": echo}, execution_count=3)]))
    if error:
        cells.append(nbformat.v4.new_code_cell("1 / 0", outputs=[nbformat.v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])]))
    nb.cells = cells
    nbformat.write(nb, path)
    (path.parent / "headlines").mkdir(exist_ok=True)
    (path.parent / "headlines" / f"{path.stem}.json").write_text(json.dumps(figures))


@pytest.fixture
def stand_in_build(tmp_path) -> Path:
    _executed(tmp_path / "00_first.ipynb", "00 · First", {"activation_bytes_per_image": 83200})
    _executed(tmp_path / "01_second.ipynb", "01 · Second", {"ledger_flops_16_images": 303587328},
              echo="{'raw': 1}")
    _executed(tmp_path / "02_broken.ipynb", "02 · Broken", {}, plot=False, error=True)
    (tmp_path / "times-ci.json").write_text(json.dumps({"00_first": 6.0, "01_second": 7.4}))
    return tmp_path


def test_the_landing_page_shows_each_lesson_its_units_figure_time_or_error(stand_in_build):
    index = course_site.build_site(stand_in_build).read_text()
    assert index.index("00_first") < index.index("01_second") < index.index("02_broken")
    assert "83.2 kB" in index and "303.6 MFLOP" in index, "headline figures with their units"
    assert index.count("data:image/png;base64,") == 2 and "(no figure)" in index
    assert "ci: 6 s" in index and "ci: 7 s" in index
    assert "ZeroDivisionError: division by zero" in index, "a failed lesson says where it stopped"
    page = (stand_in_build / "01_second.html").read_text()
    assert 'href="index.html"' in page and 'href="00_first.html"' in page and 'href="02_broken.html"' in page


def test_a_lesson_still_being_written_does_not_stop_the_site(stand_in_build):
    """`make course` rebuilds the site while another lesson's notebook is half written."""
    (stand_in_build / "03_running.ipynb").write_text("")
    index = course_site.build_site(stand_in_build).read_text()
    assert "03_running" in index and "not readable yet" in index and "83.2 kB" in index


def test_a_raw_echo_is_reported_and_an_empty_build_says_what_to_run(stand_in_build, tmp_path_factory, capsys):
    assert course_site.raw_echoes(nbformat.read(stand_in_build / "00_first.ipynb", as_version=4)) == []
    assert course_site.main(["--build", str(stand_in_build)]) == 0
    out = capsys.readouterr().out
    assert "01_second: a value echoed raw" in out and "{'raw': 1}" in out and "00_first" not in out
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(FileNotFoundError, match="run `make course`"):
        course_site.build_site(empty)
    assert course_site.main(["--build", str(empty)]) == 1


def test_every_lesson_has_a_title_and_a_plot_for_its_card():
    """The card needs a heading (its title) and a figure: each lesson source has both."""
    sources = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    assert len(sources) == 14
    for src in sources:
        text = src.read_text()
        assert "# # " in text, f"{src.name}: no markdown heading for the site's card"
        assert "plt.show()" in text or "display(" in text and "fig" in text, f"{src.name}: no plot"


def test_the_site_in_a_browser_shows_every_lesson_and_its_plots(stand_in_build, tmp_path):
    browser = chromium()
    build = Path(os.environ["COURSE_SITE_BUILD"]).resolve() if os.environ.get("COURSE_SITE_BUILD") \
        else stand_in_build
    if build != stand_in_build:   # a real build: work on a copy, the repository's build/ untouched
        build = Path(shutil.copytree(build, tmp_path / "build"))
    course_site.build_site(build)
    lessons = [p.stem for p in course_site.lesson_notebooks(build)]
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=browser, headless=True, args=["--no-sandbox"])
        try:
            page = chrome.new_page()
            page.goto((build / "index.html").as_uri())
            for name in lessons:
                card = page.locator(f"[id='{name}']")
                assert card.count() == 1, f"{name} missing from the landing page"
                failed = card.locator(".error").count() > 0
                loaded = card.locator("img").evaluate_all("els => els.map(e => e.naturalWidth)")
                assert failed or (loaded and loaded[0] > 0), f"{name}: no figure on its card"
            page.locator(f"[id='{lessons[0]}'] h2 a").click()
            page.wait_for_load_state()
            assert page.url.endswith(f"{lessons[0]}.html")
            assert page.locator(".nav a", has_text="all lessons").count() == 1
            for name in lessons:   # every lesson page shows its plots (embedded as data: URIs;
                page.goto((build / f"{name}.html").as_uri())   # the Colab badge is on the web)
                widths = page.locator("img[src^='data:']").evaluate_all("els => els.map(e => e.naturalWidth)")
                failed = course_site.failure(nbformat.read(build / f"{name}.ipynb", as_version=4))
                assert failed or (widths and min(widths) > 0), f"{name}.html shows no plot"
        finally:
            chrome.close()
