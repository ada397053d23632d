"""Student editions (notebooks/student/, built by tools/student.py) and their checks
(course_utils.exercises): up to date with the lesson sources, no solution or hidden-test text,
every exercise followed by its check, nothing after an exercise depending on its answer; the
checks' feedback; and, executed in a fresh kernel at CI scale, every check reports "not attempted"
with the exercises blank and passes with the revealed solutions. Execution is costly (a whole
lesson): a sample runs by default, COURSE_STUDENT_LESSONS=all (or a comma list) runs more;
tests/test_wheel.py runs 00 and 01 from an installed wheel. The per-lesson checks (up to date, no
solution or hidden-test text, a check after every exercise, nothing after one using its answer)
are rules in tests/notebook_rules.py, run once per lesson by tests/test_notebook_rules.py.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import kernel_run  # noqa: E402
import notebooks  # noqa: E402
from notebook_rules import CHECK  # noqa: E402

from course_utils.exercises import Exercises, load_lesson  # noqa: E402

SOURCES = notebooks.sources()
NAMES = [s.stem for s in SOURCES]


def _executed_lessons() -> list[str]:
    wanted = os.environ.get("COURSE_STUDENT_LESSONS", "").strip()
    if wanted == "all":
        return NAMES
    return [n for n in NAMES if n in (wanted.split(",") if wanted else ["06_training_memory"])]


def test_no_stale_student_editions():
    built = {p.stem for p in notebooks.STUDENT.glob("*.ipynb")} | \
        {p.stem for p in notebooks.PRACTICE_DATA.glob("*.json")}
    assert built <= set(NAMES), f"student files without a lesson source: {built - set(NAMES)}"


# --------------------------------------------------------------------------- the checks' feedback

# a question in the practice-data format whose public test needs no lesson state (the lessons'
# own questions measure a per-student configuration, so they need the lesson's variables)
ADAM = "01_resource_ledger", "q3_adam_resident"
ADAM_QUESTION = {
    "answer_names": ["adam_resident_bytes"],
    "public_tests": ['assert adam_resident_bytes(1000) == 16 * 1000, '
                     '"weights, gradients and two moments: 4 fp32 copies of each parameter"'],
    "solution": "def adam_resident_bytes(n):\n    return 16 * n  # weights, gradients, two moments",
}


def _exercises() -> Exercises:
    ex = Exercises(ADAM[0])
    ex.questions = {**ex.questions, ADAM[1]: ADAM_QUESTION}
    return ex


def _check(answer_src: str):
    ns: dict = {}
    exec(answer_src, ns)
    return _exercises().check(ADAM[1], ns)


def test_check_says_not_attempted_for_the_skeleton_and_for_an_unrun_cell():
    r = _check("def adam_resident_bytes(n):\n    ...")
    assert r.status == "not attempted" and not r and "still `...`" in repr(r)
    r = _exercises().check(ADAM[1], {})
    assert r.status == "not attempted" and "not defined" in repr(r)
    r = _exercises().check(ADAM[1], {"adam_resident_bytes": ...})
    assert r.status == "not attempted"


def test_check_shows_the_answer_how_it_misses_and_the_hint_never_the_expected_value():
    r = _check("def adam_resident_bytes(n):\n    return 12 * n")
    shown = repr(r)
    assert r.status == "failed" and (r.passed, r.total) == (0, 1)
    assert "yours: adam_resident_bytes(1000) = 12,000: 25–50% too small" in shown
    assert "16,000" not in shown and "16000" not in shown and "16 * 1000" not in shown
    assert "hint: weights, gradients and two moments" in shown
    assert 'exercises.reveal("q3_adam_resident")' in shown


def test_check_names_the_error_the_answer_raised():
    r = _check("def adam_resident_bytes(n):\n    return n.numel() * 16")
    assert r.status == "failed" and "raised AttributeError" in repr(r)


def test_check_passes_the_solution_and_reveal_prints_it(capsys):
    _exercises().reveal(ADAM[1])
    solution = capsys.readouterr().out
    assert "def adam_resident_bytes(n):" in solution and "SOLUTION" not in solution.split("\n", 1)[1]
    r = _check(solution)
    assert r.status == "passed" and r and "all 1 public check(s) pass" in repr(r)


def test_check_rejects_unknown_names():
    with pytest.raises(ValueError, match="no exercises for lesson"):
        Exercises("99_nope")
    with pytest.raises(ValueError, match="has no exercise 'q9'"):
        Exercises(ADAM[0]).check("q9", {})


# --------------------------------------------------------------------------- executed

SOLVE_ALL = '''
import json as _json, course_utils as _kit
_results = {}
for _q, _entry in exercises.questions.items():
    exec(_entry["solution"], globals())
    _results[_q] = exercises.check(_q).status
print("SOLVED", _json.dumps({"kit": _kit.__file__, "status": _results}))
'''


def blank_then_solve(path: Path) -> nbformat.NotebookNode:
    """A student edition as handed out (answers blank) plus one last cell that pastes every
    revealed solution and checks it in the same kernel."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(SOLVE_ALL))
    return nb


def solved(nb: nbformat.NotebookNode) -> dict:
    """{"kit": course_utils.__file__ in the kernel, "status": {question: status after solving}}."""
    out = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    assert "SOLVED" in out, f"the solving cell did not finish: {nb.cells[-1].outputs}"
    return json.loads(out.split("SOLVED", 1)[1])


def assert_blank_run(nb: nbformat.NotebookNode, name: str) -> None:
    """No error anywhere; every check cell reports "not attempted"."""
    errors = [(i, o.ename) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{name}: errors in the blank student edition: {errors}"
    for cell in nb.cells:
        if cell.cell_type == "code" and CHECK.match(cell.source.strip()):
            shown = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
            assert "not attempted" in shown, f"{name}: {cell.source}: {shown!r}"


@pytest.mark.parametrize("name", _executed_lessons())
def test_student_edition_runs_blank_and_the_solutions_pass(name):
    nb = kernel_run.execute(blank_then_solve(notebooks.STUDENT / f"{name}.ipynb"), notebooks.STUDENT)
    assert_blank_run(nb, name)
    status = solved(nb)["status"]
    assert status == {q: "passed" for q in load_lesson(name)["questions"]}, status
