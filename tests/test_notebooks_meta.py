"""Every lesson notebook: built by jupytext from its source, no committed outputs, a parameters cell,
the standard first cells."""
import json
import re
import sys
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from template import INSTALL_CELL, badge  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def cells(nb_path):
    return json.loads(nb_path.read_text())["cells"]


def source(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def test_there_are_lessons():
    assert len(NOTEBOOKS) >= 2


def test_every_source_has_its_notebook():
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in SOURCES], "run `make notebooks`"


def _content(cell):
    return cell["cell_type"], source(cell), cell["metadata"].get("tags", [])


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_is_what_jupytext_builds(src):
    nb_path = ROOT / "notebooks" / f"{src.stem}.ipynb"
    built = [_content(c) for c in jupytext.read(src, fmt="py:percent").cells]
    committed = json.loads(nb_path.read_text())
    assert [_content(c) for c in committed["cells"]] == built, \
        f"{nb_path.name} differs from notebooks/src/{src.name}: run `make notebooks` and commit both"
    assert committed["metadata"]["kernelspec"]["name"] == "python3"  # nbval and papermill start this kernel


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_outputs_committed(nb):
    for c in cells(nb):
        if c["cell_type"] == "code":
            assert not c.get("outputs") and c.get("execution_count") is None, f"{nb.name}: clear outputs"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_cells(nb):
    cs = cells(nb)
    assert cs[0]["cell_type"] == "markdown" and badge(nb.stem) in source(cs[0])
    code = [c for c in cs if c["cell_type"] == "code"]
    assert source(code[0]) == INSTALL_CELL
    params = code[1]
    assert "parameters" in params["metadata"].get("tags", [])
    assert re.search(r'^SCALE = os\.environ\.get\("COURSE_SCALE"\) or auto_scale\(\)  #', source(params), re.M)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_five_part_pattern(nb):
    if nb.stem.startswith("00_"):
        return  # the tour is not a lesson
    text = "\n".join(source(c) for c in cells(nb) if c["cell_type"] == "markdown").lower()
    for part in ("problem", "mechanism", "worked example", "evidence", "boundary"):
        assert re.search(rf"^#+ .*{part}", text, re.M), f"{nb.name}: no heading for '{part}'"
