"""Graded exercises: tools/assign.py + otter-grader turn each lesson into a student notebook and an
autograder zip; tools/grade.py grades a folder of submissions without Docker.

Cheap checks run for every lesson with exercises (and the fixture tests/fixtures/98_sample.py):
assign succeeds, the student notebook holds no solution and no hidden-test text, its cells up to
the first exercise are the lesson's own (which nbval runs in `make test`), answer cells are
editable. Expensive checks (each executes a whole notebook in a fresh kernel) run for a sample:
the fixture, and the first lesson with exercises; `COURSE_GRADE_LESSONS=all` (or a comma list of
lesson names) grades more. Grading a lesson = reference solutions get full marks, the untouched
student notebook gets zero with readable feedback and runs without errors up to the first exercise.
"""
from __future__ import annotations

import ast
import csv
import json
import os
import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tools"))
import assign  # noqa: E402  (imports otter: slow, once per session)
import grade  # noqa: E402
from notebooks import render  # noqa: E402
from template import INSTALL_CELL  # noqa: E402

from course_utils.exercises import check_close, check_equal, check_raises, check_shape  # noqa: E402

SAMPLE = "98_sample"
LESSONS = [p.stem for p in assign.lessons()]
ALL_NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NAMES = [SAMPLE] + LESSONS


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

def source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def code_lines(text: str) -> list[str]:
    """Stripped lines worth comparing: not blank, not a lone bracket/keyword/placeholder."""
    trivial = {"", "...", "pass", "return", ")", "]", "}", "else:", "try:", "):", '"""'}
    return [l.strip() for l in text.split("\n") if l.strip() not in trivial]


def split_source(nb: dict) -> tuple[list[str], list[str], list[str]]:
    """(solution lines, hidden-test lines, public lines) of a lesson notebook with solutions.

    Solution lines: between inline ``# BEGIN SOLUTION`` / ``# END SOLUTION`` comments, or ending in
    ``# SOLUTION`` (marker dropped). Hidden-test lines: the code of test cells whose first line is
    a comment with "hidden" or that carry ``hidden: true`` in a TEST CONFIG. Public: the rest.
    """
    solution, hidden, public = [], [], []
    in_tests = False
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] == "raw":
            if re.match(r"#\s+BEGIN\s+TESTS", text, re.I):
                in_tests = True
            elif re.match(r"#\s+END\s+TESTS", text, re.I):
                in_tests = False
            continue
        if cell["cell_type"] != "code":
            public += code_lines(text)
            continue
        lines = text.split("\n")
        first = lines[0].strip() if lines else ""
        is_hidden = in_tests and ((first.startswith("#") and re.search(r"\bhidden\b", first, re.I))
                                  or re.search(r"hidden:\s*true", text, re.I))
        if is_hidden:
            hidden += [l for l in code_lines(text)
                       if not re.search(r"TEST CONFIG|hidden|^\"\"\"", l, re.I)]
            continue
        inside = False
        for line in lines:
            s = line.strip()
            if re.match(r"#\s*BEGIN SOLUTION", s):
                inside = True
            elif re.match(r"#\s*END SOLUTION", s):
                inside = False
            elif inside:
                solution += code_lines(line)
            elif re.search(r"#\s?SOLUTION\s*$", s):
                solution += code_lines(re.sub(r"#\s?SOLUTION\s*$", "", s))
            else:
                public += code_lines(line)
    public_set = set(public)
    # a line that also appears in the public part of the lesson is not a secret
    return ([l for l in solution if l not in public_set],
            [l for l in hidden if l not in public_set], public)


def hidden_statements(nb: dict) -> list[str]:
    """The hidden test cells' code as otter stores it (ast.unparse), one line per entry."""
    out, in_tests = [], False
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] == "raw":
            in_tests = bool(re.match(r"#\s+BEGIN\s+TESTS", text, re.I)) or (
                in_tests and not re.match(r"#\s+END\s+TESTS", text, re.I))
            continue
        first = text.split("\n")[0].strip()
        if in_tests and cell["cell_type"] == "code" and (
                (first.startswith("#") and re.search(r"\bhidden\b", first, re.I))
                or re.search(r"hidden:\s*true", text, re.I)):
            body = re.sub(r'(?s)^.*?END TEST CONFIG[^\n]*\n', "", text)
            out += [l.strip() for l in ast.unparse(ast.parse(body)).split("\n") if l.strip()]
    return out


def autograder_test_lines(zip_path: Path) -> list[str]:
    """Code lines of every test case in an autograder zip (doctest prompts removed)."""
    lines = []
    with zipfile.ZipFile(zip_path) as z:
        for n in z.namelist():
            if n.startswith("tests/") and n.endswith(".py"):
                ns: dict = {}
                exec(z.read(n).decode(), ns)  # our own generated file: `test = {...}`
                for suite in ns["test"]["suites"]:
                    for case in suite["cases"]:
                        lines += [l[4:].strip() for l in case["code"].split("\n")
                                  if l.startswith((">>> ", "... "))]
    return lines


def student_text(folder: Path, name: str) -> str:
    """Everything a student receives: the notebook's cell sources and the public test files."""
    nb = load(folder / "student" / f"{name}.ipynb")
    parts = [source(c) for c in nb["cells"]]
    parts += [p.read_text() for p in sorted((folder / "student" / "tests").glob("*.py"))]
    return "\n".join(parts)


def first_question_cell(nb: dict) -> int:
    """Index of the injected otter init cell, i.e. where the exercises start."""
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] == "code" and "grader = otter.Notebook(" in source(c):
            return i
    raise AssertionError("no otter init cell (grader = otter.Notebook(...)) found")


def lesson_path(name: str) -> Path:
    return ROOT / "notebooks" / f"{name}.ipynb"


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, Path]:
    """name -> the lesson notebook with solutions (the fixture is rendered from its percent source)."""
    tmp = tmp_path_factory.mktemp("sources")
    sample = tmp / f"{SAMPLE}.ipynb"
    sample.write_text(render(FIXTURES / f"{SAMPLE}.py"))
    return {SAMPLE: sample, **{n: lesson_path(n) for n in LESSONS}}


@pytest.fixture(scope="session")
def dist(tmp_path_factory, sources) -> dict[str, Path | Exception]:
    """Run otter assign once per notebook (without executing it); a failure is kept per name."""
    out = tmp_path_factory.mktemp("dist")
    result: dict[str, Path | Exception] = {}
    for name, path in sources.items():
        try:
            result[name] = assign.assign(path, out, run_tests=False, quiet=True)
        except Exception as err:  # reported by test_assign_succeeds for that lesson only
            result[name] = err
    return result


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


# --------------------------------------------------------------------------- every lesson

@pytest.mark.parametrize("nb", ALL_NOTEBOOKS, ids=lambda p: p.stem)
def test_every_lesson_has_two_to_four_exercises(nb):
    n = len(assign.question_indices(load(nb)))
    assert 2 <= n <= 4, f"{nb.name} has {n} exercises ('# BEGIN QUESTION' raw cells); want 2-4"


@pytest.mark.parametrize("name", NAMES)
def test_assign_succeeds(dist, sources, name):
    folder = assigned(dist, name)
    assert (folder / "student" / f"{name}.ipynb").is_file()
    assert (folder / "autograder" / f"{name}.ipynb").is_file()
    with zipfile.ZipFile(folder / f"{name}-autograder.zip") as z:
        tests = [n for n in z.namelist() if n.startswith("tests/") and n.endswith(".py")]
        config = json.loads(z.read("otter_config.json"))
    assert len(tests) == len(assign.question_indices(load(sources[name]))), tests
    assert config["assignment_name"] == name and config["pdf"] is False


@pytest.mark.parametrize("name", NAMES)
def test_student_notebook_has_no_solutions(dist, sources, name):
    folder = assigned(dist, name)
    solution, _, _ = split_source(load(sources[name]))
    assert solution, f"{name}: found no solution lines in the source; are the markers right?"
    text = student_text(folder, name)
    given = set(code_lines(text))
    leaked = [l for l in solution if l in given]
    assert not leaked, f"{name}: solution lines handed to students: {leaked}"
    assert not re.search(r"#\s*(BEGIN |END )?SOLUTION", text), f"{name}: solution marker left"


@pytest.mark.parametrize("name", NAMES)
def test_hidden_tests_only_in_autograder(dist, sources, name):
    folder = assigned(dist, name)
    _, hidden, _ = split_source(load(sources[name]))
    assert hidden, f"{name}: no hidden test found (first line '# HIDDEN' in a test cell)"
    given = student_text(folder, name)
    leaked = [l for l in hidden if l in given]
    assert not leaked, f"{name}: hidden-test lines handed to students: {leaked}"
    graded = set(autograder_test_lines(folder / f"{name}-autograder.zip"))
    missing = [l for l in hidden_statements(load(sources[name])) if l not in graded]
    assert not missing, f"{name}: hidden tests missing from the autograder zip: {missing}"


def _test_cells(nb: dict) -> list[tuple[int, ast.Module]]:
    """(cell index, parsed code) of every code cell inside a ``# BEGIN TESTS`` block."""
    out, in_tests = [], False
    for i, cell in enumerate(nb["cells"]):
        text = source(cell)
        if cell["cell_type"] == "raw":
            if re.match(r"#\s+BEGIN\s+TESTS", text, re.I):
                in_tests = True
            elif re.match(r"#\s+END\s+TESTS", text, re.I):
                in_tests = False
        elif in_tests and cell["cell_type"] == "code":
            out.append((i, ast.parse(text)))
    return out


def _defined(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        for t in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} if t else set()
    return names


@pytest.mark.parametrize("name", NAMES)
def test_test_cells_do_not_share_helpers(sources, name):
    """otter runs every test cell on its own copy of the notebook's globals: a name defined in one
    test cell is a NameError in another (at grading time only; nbval runs them in one kernel)."""
    nb = load(sources[name])
    cells = _test_cells(nb)
    in_tests = {i for i, _ in cells}
    body = set()
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code" and i not in in_tests:
            try:
                body |= _defined(ast.parse(source(cell)))
            except SyntaxError:
                pass
    for i, tree in cells:
        mine = _defined(tree)
        others = set().union(*[_defined(t) for j, t in cells if j != i]) - mine - body
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        shared = sorted(used & others)
        assert not shared, f"{name}: test cell {i} uses {shared}, defined only in another test " \
                           "cell; move the helper to a code cell before the first question"


@pytest.mark.parametrize("name", NAMES)
def test_test_cells_print_nothing(sources, name):
    """Test cells are doctests that expect no output: a bare expression with a value fails."""
    for i, tree in _test_cells(load(sources[name])):
        for node in tree.body:
            if not isinstance(node, ast.Expr) or isinstance(node.value, ast.Constant):
                continue  # statements, and the TEST CONFIG string
            call = node.value if isinstance(node.value, ast.Call) else None
            inplace = call is not None and isinstance(call.func, ast.Attribute) \
                and call.func.attr.endswith("_") and not call.func.attr.startswith("_")
            printing = call is not None and isinstance(call.func, ast.Name) and call.func.id == "print"
            assert call is not None and not inplace and not printing, \
                f"{name}: test cell {i}, line {node.lineno}: `{ast.unparse(node)}` shows a value, " \
                "which the doctest compares with nothing; write `_ = ...`"


@pytest.mark.parametrize("name", NAMES)
def test_every_question_has_public_tests(dist, sources, name):
    """Students only see public tests: a question without one gives them no feedback at all."""
    folder = assigned(dist, name)
    tests = sorted((folder / "student" / "tests").glob("*.py"))
    questions = len(assign.question_indices(load(sources[name])))
    public = {}
    for t in tests:
        ns: dict = {}
        exec(t.read_text(), ns)  # generated by otter: `test = {...}`
        public[t.stem] = sum(len(su["cases"]) for su in ns["test"]["suites"])
    assert len(public) == questions and all(public.values()), \
        f"{name}: {questions} questions; public test cases per question: {public}"


@pytest.mark.parametrize("name", NAMES)
def test_student_answer_cells_are_editable(dist, sources, name):
    nb = load(assigned(dist, name) / "student" / f"{name}.ipynb")
    answers = [c for c in nb["cells"] if "otter_answer_cell" in c["metadata"].get("tags", [])]
    questions = len(assign.question_indices(load(sources[name])))
    assert len(answers) >= questions, \
        f"{name}: {len(answers)} answer cells for {questions} questions (answer code belongs " \
        "between '# BEGIN SOLUTION' / '# END SOLUTION' raw cells)"
    locked = [source(c)[:60] for c in answers if c["metadata"].get("editable") is False]
    assert not locked, f"{name}: answer cells locked against editing: {locked}"


@pytest.mark.parametrize("name", NAMES)
def test_student_notebook_starts_like_the_lesson(dist, sources, name):
    """Up to the first exercise the student notebook is the lesson itself (minus the Colab badge,
    which would open the version with solutions), so the lesson's nbval run covers it."""
    student = load(assigned(dist, name) / "student" / f"{name}.ipynb")["cells"]
    lesson = load(sources[name])["cells"]
    k = first_question_cell({"cells": student})
    q = assign.question_indices({"cells": lesson})[0]
    assert "colab.research.google.com" not in source(student[0])
    assert source(student[1]) == INSTALL_CELL, "second cell must stay the install cell"
    assert "parameters" in student[2]["metadata"].get("tags", [])
    got = [(c["cell_type"], source(c)) for c in student[1:k]]
    want = [(c["cell_type"], source(c)) for c in lesson[1:q]]
    assert got == want, f"{name}: student cells before the exercises differ from the lesson's"


# --------------------------------------------------------------------------- a sample, graded



@pytest.fixture(scope="session")
def graded(dist, tmp_path_factory) -> dict[tuple[str, str], tuple[dict, Path]]:
    """(name, "reference"|"blank") -> (tools/grade.py result, folder with executed.ipynb).

    Each run is tools/grade.py's per-submission child process with a time limit; two at a time
    (each is one single-threaded kernel executing a whole notebook)."""
    jobs = {}
    for name in GRADED:
        if isinstance(dist[name], Exception):
            continue
        folder = dist[name]
        jobs[(name, "reference")] = folder / "autograder" / f"{name}.ipynb"
        jobs[(name, "blank")] = folder / "student" / f"{name}.ipynb"

    def run(key):
        keep = tmp_path_factory.mktemp(f"graded_{key[0]}_{key[1]}")
        zip_path = dist[key[0]] / f"{key[0]}-autograder.zip"
        return key, (grade.run_one(jobs[key], zip_path, timeout=GRADE_TIMEOUT, scale="ci",
                                   keep=keep), keep)

    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        return dict(pool.map(run, jobs))


def graded_ok(graded, dist, name, kind) -> tuple[dict, Path]:
    assigned(dist, name)
    r, keep = graded[(name, kind)]
    assert r["status"] == "ok", f"grading {name} ({kind}): {r['status']}: {r['feedback'][:3000]}"
    return r, keep


def public_feedback(raw: dict) -> str:
    return "\n".join(t.get("output", "") for t in raw["tests"] if t.get("max_score") is None)


@pytest.mark.parametrize("name", GRADED)
def test_reference_solutions_get_full_marks(graded, dist, name):
    r, _ = graded_ok(graded, dist, name, "reference")
    assert r["scores"], "no graded questions"
    short = {q: s for q, (s, mx) in r["scores"].items() if s != mx}
    assert not short, f"{name}: reference solutions lose points on {short}:\n{r['feedback'][:4000]}"


@pytest.mark.parametrize("name", GRADED)
def test_untouched_student_notebook_gets_zero_and_runs_to_first_exercise(graded, dist, name):
    r, keep = graded_ok(graded, dist, name, "blank")
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
