"""Graded exercises: tools/assign.py + otter-grader turn each lesson into a student notebook and an
autograder zip; tools/grade.py grades a folder of submissions without Docker.

The cheap checks of every lesson with exercises (and the fixture tests/fixtures/98_sample.py:
assign succeeds, the student notebook holds no solution and no hidden-test text, its cells up to
the first exercise are the lesson's own, answer cells are editable, ...) are house rules in
tests/notebook_rules.py, run once per lesson by tests/test_notebook_rules.py; the assignments are
built once per session (tests/conftest.py's `dist`). Every lesson's tests also run against its
reference under nbval, with the answers bound as grading binds them (notebooks/conftest.py). Here
one lesson is graded for real, in the sandbox, on a thread started with the suite
(tests/background.py): the first lesson with exercises; `COURSE_GRADE_LESSONS=all` (or a comma
list of lesson names) grades more. Grading a lesson = reference solutions get full marks, the
untouched student notebook gets zero with readable feedback and runs without errors up to the
first exercise.
"""
from __future__ import annotations

import csv
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tools"))
import assign  # noqa: E402  (imports otter: slow, once per session)
import grade  # noqa: E402
import background  # noqa: E402
from notebook_rules import SAMPLE, first_question_cell, load, source  # noqa: E402

from course_utils.exercises import check_close, check_equal, check_raises, check_shape  # noqa: E402

LESSONS = [p.stem for p in assign.lessons()]


def _graded_lessons() -> list[str]:
    wanted = os.environ.get("COURSE_GRADE_LESSONS", "").strip()
    if wanted == "all":
        return LESSONS
    if wanted:
        return [n for n in LESSONS if n in wanted.split(",")]
    return LESSONS[:1]


GRADED = _graded_lessons()
GRADE_TIMEOUT = 900  # seconds per graded notebook: a hung kernel fails a test, not the suite


# --------------------------------------------------------------------------- helpers

def assigned(dist, name) -> Path:
    got = dist[name]
    if isinstance(got, Exception):
        pytest.fail(f"otter assign failed for {name}: {got}")
    return got


def grade_notebook(notebook: Path, zip_path: Path):
    """otter run, in this process (the otter import is paid once); returns GradingResults."""
    from otter.api import grade_submission
    old = os.environ.get("COURSE_SCALE")
    os.environ["COURSE_SCALE"] = "ci"
    try:
        return grade_submission(str(notebook), str(zip_path), quiet=True)
    finally:
        if old is None:
            os.environ.pop("COURSE_SCALE", None)
        else:
            os.environ["COURSE_SCALE"] = old


# --------------------------------------------------------------------------- a sample, graded



def start_in_background(tmp: Path):
    """Build each graded lesson's assignment now (otter assign changes the working directory: the
    main thread's job); return the function that grades its reference solutions and its untouched
    student notebook, one submission at a time, with one scorer per lesson as grade_folder shares
    one (tests/background.py)."""
    results: dict = {}
    lessons = []
    for name in GRADED:
        try:
            folder = assign.assign(ROOT / "notebooks" / f"{name}.ipynb", tmp / name,
                                   run_tests=False, quiet=True)
        except Exception as err:  # reported by the tests, one lesson at a time
            results[(name, "assign")] = err
            continue
        lessons.append((name, folder))

    def grade_all() -> dict:
        for name, folder in lessons:
            zip_path = folder / f"{name}-autograder.zip"
            try:
                with grade.scorer_for(zip_path, scale="ci") as scorer:
                    for kind, edition in (("reference", "autograder"), ("blank", "student")):
                        keep = tmp / "graded" / f"{name}_{kind}"
                        try:
                            results[(name, kind)] = (grade.run_one(
                                folder / edition / f"{name}.ipynb", zip_path, timeout=GRADE_TIMEOUT,
                                scale="ci", keep=keep, scorer=scorer), keep)
                        except Exception as err:
                            results[(name, kind)] = err
            except Exception as err:  # the scorer did not start (or stop): what it left ungraded
                for kind in ("reference", "blank"):
                    results.setdefault((name, kind), err)
        return results

    return grade_all


@pytest.fixture(scope="session")
def graded(request) -> dict:
    """(name, "reference"|"blank") -> (tools/grade.py result, folder with executed.ipynb), or
    the exception assigning or grading it raised."""
    return background.result(request, start_in_background, "graded")


def graded_ok(graded, name, kind) -> tuple[dict, Path]:
    for key in ((name, "assign"), (name, kind)):
        if isinstance(graded.get(key), Exception):
            pytest.fail(f"{name} ({key[1]}): {graded[key]!r}")
    assert (name, kind) in graded, f"{name} ({kind}) was not graded in time"
    r, keep = graded[(name, kind)]
    assert r["status"] == "ok", f"grading {name} ({kind}): {r['status']}: {r['feedback'][:3000]}"
    return r, keep


def public_feedback(raw: dict) -> str:
    return "\n".join(t.get("output", "") for t in raw["tests"] if t.get("max_score") is None)


@pytest.mark.parametrize("name", GRADED)
def test_reference_solutions_get_full_marks(graded, name):
    r, _ = graded_ok(graded, name, "reference")
    assert r["scores"], "no graded questions"
    short = {q: s for q, (s, mx) in r["scores"].items() if s != mx}
    assert not short, f"{name}: reference solutions lose points on {short}:\n{r['feedback'][:4000]}"


@pytest.mark.parametrize("name", GRADED)
def test_untouched_student_notebook_gets_zero_and_runs_to_first_exercise(graded, name):
    r, keep = graded_ok(graded, name, "blank")
    assert r["scores"] and sum(s for s, _ in r["scores"].values()) == 0, r["scores"]
    executed = load(keep / "executed.ipynb")
    k = first_question_cell(executed)
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(executed["cells"][:k])
              if c["cell_type"] == "code" for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, f"{name}: the student notebook fails before the first exercise: {errors}"
    assert_readable_feedback(public_feedback(r["raw"]))


def assert_readable_feedback(summary: str) -> None:
    """Every failed (public) test ends in an exception line with a message, not a bare assert."""
    finals = re.findall(r"^\s*(\w+(?:Error|Exception)):?(.*)$", summary, re.M)
    assert finals, f"no failure reason in the feedback:\n{summary}"
    bare = [e for e, msg in finals if not msg.strip()]
    assert not bare, f"failures without a message {bare}: give each assert a message or use " \
                     f"course_utils.exercises.check_*:\n{summary[:3000]}"


# --------------------------------------------------------------------------- instructor workflow

def test_instructor_doc_names_the_grading_command():
    """The command itself runs over a whole class in tests/test_grading_sandbox.py."""
    doc = (ROOT / "docs" / "instructor.md").read_text()
    assert "python tools/grade.py" in doc and "--timeout" in doc and "scores.csv" in doc


def test_grading_time_limit_kills_a_slow_submission(dist, tmp_path):
    zip_path = assigned(dist, SAMPLE) / f"{SAMPLE}-autograder.zip"
    r = grade.run_one(FIXTURES / "submissions" / "bob_blank.ipynb", zip_path, timeout=0.5,
                      scale="ci")
    assert r["status"] == "timeout" and all(s == 0 for s, _ in r["scores"].values())
    assert r["scores"] == {q: (0.0, p) for q, p in grade.questions(zip_path).items()}
    rows = [("bob_blank.ipynb", r),
            ("x.ipynb", {"status": "ok", "scores": {"q1_param_bytes": (1.0, 1.0)}})]
    grade.write_csv(tmp_path / "s.csv", rows, grade.questions(zip_path))
    got = {r["submission"]: r for r in csv.DictReader(open(tmp_path / "s.csv"))}
    assert got["bob_blank.ipynb"]["total"] == "0" and got["bob_blank.ipynb"]["possible"] == "4"
    assert got["x.ipynb"]["total"] == "1" and "killed after" in got["bob_blank.ipynb"]["reason"]


def test_a_kernel_that_spends_its_cpu_seconds_is_a_timeout(dist, tmp_path):
    """A busy loop ends at the CPU-second limit (RLIMIT_CPU) as a timeout that says so, long
    before the wall-clock limit; without the limit it would run to that one (a "killed after
    the 120 s" row), and a kernel killed by the limit but read as a crash would be an error."""
    nb = load(FIXTURES / "submissions" / "bob_blank.ipynb")
    busy = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": "while True:\n    pass"}
    nb["cells"].insert(first_question_cell(nb), busy)
    submission = tmp_path / "bob.ipynb"
    submission.write_text(json.dumps(nb))
    zip_path = assigned(dist, SAMPLE) / f"{SAMPLE}-autograder.zip"
    r = grade.run_one(submission, zip_path, timeout=120, scale="ci",
                      limits=grade.sandbox.Limits(cpu_seconds=4))
    assert r["status"] == "timeout" and "4 CPU-second limit" in r["reason"], r["reason"]
    assert all(s == 0 for s, _ in r["scores"].values())


def test_submission_of_another_lesson_is_refused(dist, tmp_path):
    nb = load(FIXTURES / "submissions" / "alice_correct.ipynb")
    nb["metadata"]["otter"]["assignment_name"] = "03_moco"
    wrong = tmp_path / "alice.ipynb"
    wrong.write_text(json.dumps(nb))
    with pytest.raises(Exception, match="assignment"):
        grade_notebook(wrong, assigned(dist, SAMPLE) / f"{SAMPLE}-autograder.zip")


def test_grade_rejects_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="autograder"):
        grade.grade_folder(tmp_path / "nope.zip", tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="no .ipynb"):
        grade.submissions(tmp_path)


@pytest.mark.parametrize("flag, value", [("--jobs", "0"), ("--processes", "-3"), ("--scratch-mib", "two"),
                                         ("--cpu-seconds", "0")])
def test_grade_command_names_the_bad_count_flag(flag, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        grade.main([str(tmp_path / "a.zip"), str(tmp_path), flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and ("at least 1" in err or "whole number" in err), err


# --------------------------------------------------------------------------- tools/assign.py

def _raw(s):
    return {"cell_type": "raw", "metadata": {}, "source": s}


def _code(s):
    return {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}


def test_prepare_injects_config_and_init_and_wraps_loose_solutions(capsys):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {},
                     "source": "# 07 · X\n[![Open In Colab](https://a/b.svg)](https://c/d.ipynb)"},
                    _code("x = 1"),
                    _raw("# BEGIN QUESTION\nname: q1"), _code("y = 2  # SOLUTION"),
                    _raw("# BEGIN TESTS"), _code("assert y == 2, 'y'"), _raw("# END TESTS"),
                    _raw("# END QUESTION")], "metadata": {}}
    out = assign.prepare(nb, "07_x")["cells"]
    assert source(out[0]).startswith("# ASSIGNMENT CONFIG") and "name: 07_x" in source(out[0])
    assert source(out[1]) == "# 07 · X"  # badge dropped
    kinds = [(c["cell_type"], source(c).split("\n")[0]) for c in out[2:]]
    assert kinds[:5] == [("code", "x = 1"), ("code", assign.INIT_CELL.split("\n")[0]),
                         ("raw", "# BEGIN QUESTION"), ("raw", "# BEGIN SOLUTION"),
                         ("code", "y = 2  # SOLUTION")]
    assert kinds[5] == ("raw", "# END SOLUTION")
    assert "wrapped it" in capsys.readouterr().err
    assert len({c["id"] for c in out}) == len(out)


def test_prepare_rejects_lesson_config_and_missing_questions():
    with pytest.raises(ValueError, match="must not carry"):
        assign.prepare({"cells": [_raw("# ASSIGNMENT CONFIG\nname: x"),
                                  _raw("# BEGIN QUESTION\nname: q")]}, "x")
    with pytest.raises(ValueError, match="no '# BEGIN QUESTION'"):
        assign.prepare({"cells": [_code("x = 1")]}, "x")


# --------------------------------------------------------------------------- course_utils.exercises

def test_check_close_explains_the_miss():
    check_close(100.4, 100.0, rtol=0.01, what="bytes")
    with pytest.raises(AssertionError, match=r"bytes: your answer 110 is 10–25% too large \(allowed: rtol=0\.01\)"):
        check_close(110, 100, rtol=0.01, what="bytes")
    with pytest.raises(AssertionError, match="not answered yet"):
        check_close(..., 1.0, what="ratio")
    with pytest.raises(AssertionError, match=r"expected shape \(3,\), got shape \(2,\)"):
        check_close(torch.ones(2), torch.ones(3), what="v")
    with pytest.raises(AssertionError, match=r"element \[1\] .*too large"):
        check_close(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]), rtol=0.1, what="v")
    with pytest.raises(AssertionError, match="inf or nan"):
        check_close(float("nan"), 1.0, what="loss")
    with pytest.raises(AssertionError, match="should be a number"):
        check_close("12", 12, what="count")
    with pytest.raises(ValueError, match="rtol"):
        check_close(1, 1, rtol=-1, what="x")
    with pytest.raises(TypeError, match="what"):
        check_close(1, 1, what="")


def test_check_equal_shape_raises():
    check_equal(3, 3, what="ptr")
    check_equal(torch.tensor([1, 2]), torch.tensor([1, 2]), what="ids")
    with pytest.raises(AssertionError, match=r"ptr: your answer 4 is 25–50% too large"):
        check_equal(4, 3, what="ptr")
    with pytest.raises(AssertionError, match=r"ids: your answer \(a tensor of shape \(2,\)\) misses most at \[0\]"):
        check_equal(torch.tensor([2, 1]), torch.tensor([1, 2]), what="ids")
    check_shape(torch.zeros(2, 5), (2, -1), what="visible")
    with pytest.raises(AssertionError, match=r"expected shape \(2, 4\), got \(2, 5\)"):
        check_shape(torch.zeros(2, 5), (2, 4), what="visible")
    check_raises(ValueError, int, "x", what="int of text")
    with pytest.raises(AssertionError, match="returned normally"):
        check_raises(ValueError, int, "3", what="int of digits")
    with pytest.raises(AssertionError, match="expected KeyError, got ValueError"):
        check_raises(KeyError, int, "x", what="int of text")
