"""Student editions (notebooks/student/, built by tools/student.py) and their checks
(course_utils.practice): up to date with the lesson sources, no solution or hidden-test text,
every exercise followed by its check, nothing after an exercise depending on its answer; the
checks' feedback; and, executed in a fresh kernel at CI scale, every check reports "not attempted"
with the exercises blank and passes with the revealed solutions. Execution is costly (a whole
lesson): a sample runs by default, COURSE_STUDENT_LESSONS=all (or a comma list) runs more;
tests/test_wheel.py runs 00 and 01 from an installed wheel.
"""
from __future__ import annotations

import ast
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import notebooks  # noqa: E402
from test_assignments import code_lines, split_source  # noqa: E402

from course_utils.practice import Exercises, load_lesson  # noqa: E402

SOURCES = notebooks.sources()
NAMES = [s.stem for s in SOURCES]
CHECK = re.compile(r'^exercises\.check\("(\w+)"\)$')


def _executed_lessons() -> list[str]:
    wanted = os.environ.get("COURSE_STUDENT_LESSONS", "").strip()
    if wanted == "all":
        return NAMES
    return [n for n in NAMES if n in (wanted.split(",") if wanted else ["06_training_memory"])]


def student(name: str) -> dict:
    return json.loads((notebooks.STUDENT / f"{name}.ipynb").read_text())


def text(cell: dict) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_student_edition_is_up_to_date(src):
    for path, want in notebooks.student_files(src).items():
        assert path.is_file() and path.read_text() == want, \
            f"{path.relative_to(ROOT)} is not what notebooks/src/{src.name} builds: run `make notebooks`"


def test_no_stale_student_editions():
    built = {p.stem for p in notebooks.STUDENT.glob("*.ipynb")} | \
        {p.stem for p in notebooks.PRACTICE_DATA.glob("*.json")}
    assert built <= set(NAMES), f"student files without a lesson source: {built - set(NAMES)}"


@pytest.mark.parametrize("name", NAMES)
def test_student_edition_has_no_solutions_or_hidden_tests(name):
    lesson = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    solution, hidden, _ = split_source(lesson)
    assert solution, f"{name}: found no solution lines in the lesson; are the markers right?"
    nb = student(name)
    given = set(code_lines("\n".join(text(c) for c in nb["cells"])))
    leaked = [line for line in solution if line in given]
    assert not leaked, f"{name}: solution lines in the student edition: {leaked}"
    shipped = set(code_lines("\n".join(t for q in load_lesson(name)["questions"].values()
                                       for t in q["public_tests"] + [q["solution"]])))
    secret = [line for line in hidden if line in shipped or line in given]
    assert not secret, f"{name}: hidden-test lines handed to learners: {secret}"
    assert not [c for c in nb["cells"] if c["cell_type"] == "raw"], f"{name}: otter raw cells left"
    markers = [q for q, data in load_lesson(name)["questions"].items() if "SOLUTION" in data["solution"]]
    assert not markers, f"{name}: otter SOLUTION markers left in the shipped solutions of {markers}"


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_is_followed_by_its_check(name):
    nb, data = student(name), load_lesson(name)
    checks = [m.group(1) for c in nb["cells"] if c["cell_type"] == "code"
              for m in [CHECK.match(text(c).strip())] if m]
    assert checks == list(data["questions"]), f"{name}: check cells {checks}"
    for q, entry in data["questions"].items():
        assert entry["answer_names"] and entry["public_tests"] and entry["solution"].strip(), q


@pytest.mark.parametrize("name", NAMES)
def test_nothing_after_an_exercise_uses_its_answer(name):
    """A cell after the exercises that reads an answer would crash for a learner who skipped it."""
    answers = {n for q in load_lesson(name)["questions"].values() for n in q["answer_names"]}
    answer_cells = {text(c) for c in student(name)["cells"]
                    if c["cell_type"] == "code" and answers & _defined(text(c))}
    for cell in student(name)["cells"]:
        src = text(cell)
        if cell["cell_type"] != "code" or src in answer_cells or CHECK.match(src.strip()):
            continue
        used = {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
        assert not used & answers, f"{name}: a cell uses the answers {used & answers}:\n{src[:300]}"


def _defined(src: str) -> set[str]:
    tree = ast.parse(src)
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | \
        {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
         if isinstance(t, ast.Name)}


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
    nb = blank_then_solve(notebooks.STUDENT / f"{name}.ipynb")
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(notebooks.STUDENT)}}).execute()
    assert_blank_run(nb, name)
    status = solved(nb)["status"]
    assert status == {q: "passed" for q in load_lesson(name)["questions"]}, status
