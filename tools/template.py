"""Text every lesson notebook starts with; tests/notebook_rules.py checks it.

Where the kit lives is ONE setting, ``REPO`` and ``REF`` below: the Colab badge opens the
student edition from github.com/REPO at REF, and the install cell pip-installs the kit from the
same place, so a notebook and the kit it installs always match. A fork retargets everything with

    python tools/template.py --repo you/your-fork --ref main     # then: make notebooks

which rewrites REPO/REF here and the badge and install cell of every lesson source.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

REPO = "training-ledger/course-kit"
REF = "main"

ROOT = Path(__file__).resolve().parent.parent
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/{repo}/blob/{ref}/notebooks/student/{name}.ipynb)")


def kit_source(repo: str = REPO, ref: str = REF) -> str:
    """The pip requirement that installs the kit from the course repository."""
    return f"git+https://github.com/{repo}.git@{ref}"


def install_cell(repo: str = REPO, ref: str = REF) -> str:
    return f'''# On Colab, install the kit with one pip command (Colab's own torch is kept); elsewhere this does nothing.
# Scale: a GPU runtime runs SCALE="gpu", any other "default"; to choose, run %env COURSE_SCALE=ci first.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "{kit_source(repo, ref)}"], check=True)'''


INSTALL_CELL = install_cell()


def badge(name: str, repo: str = REPO, ref: str = REF) -> str:
    """The Colab badge of lesson ``name``: it opens the student edition (no solutions)."""
    return BADGE.format(repo=repo, ref=ref, name=name)


def retarget(repo: str, ref: str, root: Path = ROOT, setting: Path = Path(__file__)) -> list[Path]:
    """Point the badge and install cell of every lesson source under ``root``, and the setting
    (this file), at ``repo``@``ref``. Returns the files changed."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise ValueError(f"repo must look like 'owner/name', got {repo!r}")
    if not re.fullmatch(r"[\w./-]+", ref):
        raise ValueError(f"ref must be a branch or tag name, got {ref!r}")
    changed = []
    for src in sorted((root / "notebooks" / "src").glob("[0-9][0-9]_*.py")):
        text = src.read_text()
        new = text.replace(INSTALL_CELL, install_cell(repo, ref))
        new = new.replace(badge(src.stem), badge(src.stem, repo, ref))
        if new != text:
            src.write_text(new)
            changed.append(src)
    me = setting
    text = me.read_text()
    new = re.sub(r'^REPO = ".*"$', f'REPO = "{repo}"', text, count=1, flags=re.M)
    new = re.sub(r'^REF = ".*"$', f'REF = "{ref}"', new, count=1, flags=re.M)
    if new != text:
        me.write_text(new)
        changed.append(me)
    return changed


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Point every lesson's Colab badge and install cell "
                                             "at another repository (for forks).")
    ap.add_argument("--repo", required=True, help="owner/name on GitHub")
    ap.add_argument("--ref", default="main", help="branch or tag (default main)")
    args = ap.parse_args()
    for path in retarget(args.repo, args.ref):
        print(f"rewrote {path.relative_to(ROOT)}")
    print("now run `make notebooks` and commit")
