"""The learner's own copies of the student editions: `make lab` works in `my-work/`, never in the
tracked `notebooks/student/`, so `git pull` always applies cleanly and nothing a learner wrote is
overwritten.

    python tools/lab.py                  # copy every student edition not yet in my-work/
    python tools/lab.py --refresh 02     # take lesson 02 afresh (your old copy is kept aside)

A copy is made once, when it is missing; after that it is yours. When a lesson changes upstream
(`git pull`), your copy stays as it is; `--refresh NN` replaces it with the new edition and keeps
your old one as `my-work/NN_name.<date-time>.ipynb`.
"""
from __future__ import annotations

import argparse
import datetime
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDENT = ROOT / "notebooks" / "student"
WORK = ROOT / "my-work"


def editions(student: Path = STUDENT) -> list[Path]:
    return sorted(student.glob("[0-9][0-9]_*.ipynb"))


def prepare(work: Path = WORK, student: Path = STUDENT) -> list[Path]:
    """Copy each student edition that ``work`` does not have yet; return the copies made."""
    work.mkdir(exist_ok=True)
    made = []
    for edition in editions(student):
        copy = work / edition.name
        if not copy.exists():
            shutil.copy2(edition, copy)
            made.append(copy)
    return made


def refresh(prefix: str, work: Path = WORK, student: Path = STUDENT) -> tuple[Path, Path | None]:
    """Replace the copy of lesson ``prefix`` with the current edition; keep the old one aside.
    Returns (new copy, where the old one went or None)."""
    matches = [e for e in editions(student) if e.name.startswith(f"{prefix}_")]
    if len(matches) != 1:
        names = ", ".join(e.name[:2] for e in editions(student))
        raise SystemExit(f"--refresh {prefix!r}: no single lesson starts with that; choose one of {names}")
    edition = matches[0]
    work.mkdir(exist_ok=True)
    copy, kept = work / edition.name, None
    if copy.exists():
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        kept = copy.with_name(f"{copy.stem}.{stamp}.ipynb")
        copy.rename(kept)
    shutil.copy2(edition, copy)
    return copy, kept


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--refresh", metavar="NN", help="take this lesson's student edition afresh")
    args = p.parse_args(argv)
    if args.refresh:
        copy, kept = refresh(args.refresh)
        print(f"{copy.relative_to(ROOT)} is the current edition"
              + (f"; your previous copy is {kept.relative_to(ROOT)}" if kept else ""))
        return 0
    made = prepare()
    print(f"your notebooks are in {WORK.relative_to(ROOT)}/ ({len(made)} new cop"
          f"{'y' if len(made) == 1 else 'ies'}; existing ones untouched)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
