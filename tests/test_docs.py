"""The docs cannot drift from the code they point at (issue 25): every file or folder a doc names
in backticks exists, and every dotted ``course_utils`` name resolves. The world where this fails
is a doc left behind by a move (``course_utils.practice`` after it became
``course_utils.exercises``, ``ledger/plan.py`` after it became ``experiments/planning.py``)."""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/authoring.md", "docs/instructor.md"]
OUTPUTS = {"build", "dist", "my-work"}   # folders the kit writes, absent from a clean clone
SKIP_PARTS = {".git", ".venv", "build", "dist", "__pycache__"}


def _tree() -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if not SKIP_PARTS & set(p.relative_to(ROOT).parts)]


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc):
    text = (ROOT / doc).read_text()
    tree = _tree()
    missing = []
    for token in sorted(set(re.findall(r"`([A-Za-z0-9_./-]+(?:\.py|/))`", text))):
        path = token.rstrip("/")
        if "NN" in path or path in OUTPUTS:   # NN_name: the pattern of every lesson's files
            continue
        if not any(t == path or t.endswith("/" + path) for t in tree):
            missing.append(token)
    assert not missing, f"{doc} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_course_utils_name_a_doc_uses_resolves(doc):
    text = (ROOT / doc).read_text()
    unresolved = []
    for dotted in sorted(set(re.findall(r"\bcourse_utils(?:\.[A-Za-z_]\w*)+", text))):
        parts = dotted.split(".")
        for split in range(len(parts), 0, -1):   # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                unresolved.append(dotted)
            break
        else:
            unresolved.append(dotted)
    assert not unresolved, f"{doc} names what course_utils does not have: {unresolved}"
