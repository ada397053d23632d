"""Every lesson notebook: built by jupytext from its source, no committed outputs, a parameters cell,
the standard first cells, the five parts. Those per-notebook rules are in tests/notebook_rules.py,
run once per lesson by tests/test_notebook_rules.py; here: there are lessons, one per source."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def test_there_are_lessons():
    assert len(NOTEBOOKS) >= 2


def test_every_source_has_its_notebook():
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in SOURCES], "run `make notebooks`"
