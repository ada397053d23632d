"""`make lab` works on the learner's own copies (tools/lab.py): they survive a `git pull` that
changes a student edition, git sees nothing to commit, and --refresh takes a lesson afresh while
keeping the old copy."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import lab  # noqa: E402

GIT = shutil.which("git")


def git(cwd, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_working_copies_survive_a_pull_that_changes_their_edition(tmp_path):
    origin = tmp_path / "origin"
    (origin / "notebooks" / "student").mkdir(parents=True)
    shutil.copy(ROOT / ".gitignore", origin / ".gitignore")       # the kit's own ignore rules
    edition = origin / "notebooks" / "student" / "00_tour.ipynb"
    edition.write_text('{"v": 1}')
    git(origin, "init", "-q")
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "v1")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    work, student = clone / lab.WORK.name, clone / "notebooks" / "student"

    made = lab.prepare(work, student)
    assert [p.name for p in made] == ["00_tour.ipynb"]
    mine = work / "00_tour.ipynb"
    mine.write_text('{"v": 1, "my answer": 42}')                   # the learner's work
    assert lab.prepare(work, student) == []                        # never overwritten
    assert git(clone, "status", "--porcelain") == ""               # git sees nothing of it

    edition.write_text('{"v": 2}')                                 # upstream changes the lesson
    git(origin, "commit", "-qam", "v2")
    git(clone, "pull", "-q")                                       # applies cleanly
    assert (student / "00_tour.ipynb").read_text() == '{"v": 2}'
    assert mine.read_text() == '{"v": 1, "my answer": 42}'

    copy, kept = lab.refresh("00", work, student)
    assert copy.read_text() == '{"v": 2}' and kept.read_text() == '{"v": 1, "my answer": 42}'


def test_refresh_names_the_lessons_when_it_cannot_find_one(tmp_path):
    with pytest.raises(SystemExit, match="choose one of 00"):
        lab.refresh("99", tmp_path / "work", ROOT / "notebooks" / "student")


def test_make_lab_opens_the_copies_not_the_tracked_editions():
    recipe = (ROOT / "Makefile").read_text().split("\nlab:")[1].split("\n\n")[0]
    assert "tools/lab.py" in recipe and "my-work/" in recipe and "notebooks/student" not in recipe
