"""The house rules every lesson follows, in one place: one plain function per rule, each taking a
:class:`Lesson` and returning the problems it finds as sentences that tell the author what to do
(an empty list: the rule holds). ``problems(name)`` applies every rule that concerns a lesson;
tests/test_notebook_rules.py runs it once per lesson (and for the fixture tests/fixtures/98_sample.py)
and shows every problem at once.

A lesson is its source ``notebooks/src/NN_name.py``, its notebook ``notebooks/NN_name.ipynb`` (the
version with solutions), its student edition ``notebooks/student/NN_name.ipynb`` with its practice
data, and, when it has exercises, the assignment tools/assign.py builds from it (student notebook,
public tests, autograder zip). The fixture 98_sample has only a notebook (rendered from its percent
source) and an assignment, so only the assignment rules concern it, as before.

Which rule replaced which test (each old test ran once per notebook; the rules run for the same
notebooks):

  tests/test_assignments.py (the fixture and every lesson with exercises; the first: every lesson)
    test_every_lesson_has_two_to_four_exercises     -> two_to_four_exercises
    test_assign_succeeds                            -> assign_succeeds
    test_student_notebook_has_no_solutions          -> student_notebook_has_no_solutions
    test_hidden_tests_only_in_autograder            -> hidden_tests_only_in_autograder
    test_test_cells_do_not_share_helpers            -> helpers_not_shared_between_test_cells
    test_test_cells_print_nothing                   -> no_test_cell_shows_a_value
    test_every_question_has_public_tests            -> every_question_has_public_tests
    test_student_answer_cells_are_editable          -> student_answer_cells_are_editable
    test_student_notebook_starts_like_the_lesson    -> student_notebook_starts_like_the_lesson
  tests/test_colab.py (every lesson notebook; the first two also its student edition)
    test_badge_opens_the_student_edition_from_the_repo -> badge_opens_the_student_edition
    test_first_code_cell_is_the_install_cell        -> first_code_cell_is_the_install_cell
    test_parameters_cell_reads_scale_from_the_environment -> parameters_cell_reads_scale_from_the_environment
    test_scale_goes_through_runtime_setup           -> scale_goes_through_runtime_setup
  tests/test_notebooks_meta.py (every lesson notebook; the first: every source)
    test_notebook_is_what_jupytext_builds           -> notebook_is_what_jupytext_builds
    test_no_outputs_committed                       -> no_outputs_committed
    test_first_cells                                -> first_cells (its title-badge and install-cell
                                                       asserts are badge_opens_the_student_edition's
                                                       and first_code_cell_is_the_install_cell's, so
                                                       one mistake is reported once)
    test_five_part_pattern                          -> five_part_pattern
  tests/test_student_editions.py (every source)
    test_student_edition_is_up_to_date              -> student_edition_is_up_to_date
    test_student_edition_has_no_solutions_or_hidden_tests -> student_edition_has_no_solutions_or_hidden_tests
    test_every_exercise_is_followed_by_its_check    -> every_exercise_is_followed_by_its_check
    test_nothing_after_an_exercise_uses_its_answer  -> nothing_after_an_exercise_uses_its_answer

Rules added since (no old test): markdown_lines_are_comments (every source).

The checks that are not per notebook (there are notebooks, no stale student editions, the install
cell on and off Colab, retargeting a fork, ...) and everything that executes or grades a notebook
stay in those four files.
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NOTEBOOKS = ROOT / "notebooks"
SRC = NOTEBOOKS / "src"
STUDENT = NOTEBOOKS / "student"
sys.path.insert(0, str(ROOT / "tools"))
import assign  # noqa: E402  (imports otter: slow, once per session)
import notebooks as build  # noqa: E402
from template import INSTALL_CELL, REF, REPO, badge  # noqa: E402

SAMPLE = "98_sample"
PATTERN = "[0-9][0-9]_*"


def lesson_names() -> list[str]:
    """Every lesson that has a source, a notebook or a student edition."""
    stems = {p.stem for p in NOTEBOOKS.glob(f"{PATTERN}.ipynb")} | \
        {p.stem for p in SRC.glob(f"{PATTERN}.py")} | {p.stem for p in STUDENT.glob(f"{PATTERN}.ipynb")}
    return sorted(stems)


NAMES = [SAMPLE] + lesson_names()


# --------------------------------------------------------------------------- helpers

def source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def rel(path: Path) -> str:
    """A path as an author finds it: relative to the repository where it lies inside it."""
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


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
    for _, cell, in_tests in cells_with_test_flag(nb):
        text = source(cell)
        if cell["cell_type"] == "raw":
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


def cells_with_test_flag(nb: dict):
    """(cell index, cell, whether it is inside a ``# BEGIN TESTS`` block) for every cell."""
    in_tests = False
    for i, cell in enumerate(nb["cells"]):
        text = source(cell)
        if cell["cell_type"] == "raw":
            if re.match(r"#\s+BEGIN\s+TESTS", text, re.I):
                in_tests = True
            elif re.match(r"#\s+END\s+TESTS", text, re.I):
                in_tests = False
        yield i, cell, in_tests


def cells_in_tests(nb: dict) -> list[tuple[int, ast.Module]]:
    """(cell index, parsed code) of every code cell inside a ``# BEGIN TESTS`` block."""
    return [(i, ast.parse(source(cell))) for i, cell, in_tests in cells_with_test_flag(nb)
            if in_tests and cell["cell_type"] == "code"]


def bound_names(tree: ast.Module) -> set[str]:
    """Every name a cell's top-level statements bind (functions, classes, any assignment target)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        for t in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} if t else set()
    return names


def defined_names(src: str) -> set[str]:
    """Functions, classes and plainly assigned names a cell defines at top level."""
    tree = ast.parse(src)
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | \
        {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
         if isinstance(t, ast.Name)}


CHECK = re.compile(r'^exercises\.check\("(\w+)"\)$')


@contextlib.contextmanager
def course_scale(value: str | None):
    """$COURSE_SCALE set to ``value`` (None: unset) for the block, then as it was."""
    old = os.environ.get("COURSE_SCALE")
    try:
        if value is None:
            os.environ.pop("COURSE_SCALE", None)
        else:
            os.environ["COURSE_SCALE"] = value
        yield
    finally:
        if old is None:
            os.environ.pop("COURSE_SCALE", None)
        else:
            os.environ["COURSE_SCALE"] = old


# --------------------------------------------------------------------------- a lesson

@dataclass(frozen=True)
class Lesson:
    """Where one lesson's files are. ``notebook`` is the lesson with solutions (for the fixture:
    rendered from its percent source); ``assignment`` is what tools/assign.py built from it (its
    folder, or the error it raised; None: not built)."""
    name: str
    notebook: Path
    src: Path
    student: Path
    assignment: Path | Exception | None = None
    fixture: bool = False

    @classmethod
    def of(cls, name: str, *, notebook: Path | None = None, src: Path | None = None,
           student: Path | None = None, assignment: Path | Exception | None = None) -> "Lesson":
        return cls(name=name, notebook=Path(notebook or NOTEBOOKS / f"{name}.ipynb"),
                   src=Path(src or SRC / f"{name}.py"),
                   student=Path(student or STUDENT / f"{name}.ipynb"),
                   assignment=assignment, fixture=name == SAMPLE)

    def nb(self) -> dict:
        return load(self.notebook)

    def questions(self) -> int:
        return len(assign.question_indices(self.nb()))

    def folder(self) -> Path:
        if not isinstance(self.assignment, Path):
            raise ValueError(f"{self.name}: no assignment built ({self.assignment!r})")
        return self.assignment

    def practice(self) -> dict:
        from course_utils.exercises import load_lesson
        return load_lesson(self.name)

    def editions(self) -> list[Path]:
        """The lesson notebook and, where there is one, its student edition."""
        return [self.notebook] + ([self.student] if self.student.is_file() else [])


Rule = Callable[[Lesson], list[str]]


# --------------------------------------------------------------------------- the notebook

def two_to_four_exercises(lesson: Lesson) -> list[str]:
    n = lesson.questions()
    if 2 <= n <= 4:
        return []
    return [f"{lesson.notebook.name} has {n} exercises ('# BEGIN QUESTION' raw cells); want 2-4"]


def notebook_is_what_jupytext_builds(lesson: Lesson) -> list[str]:
    def content(cell):
        return cell["cell_type"], source(cell), cell["metadata"].get("tags", [])

    built = [content(c) for c in build.read_source(lesson.src).cells]
    committed = lesson.nb()
    out = []
    if [content(c) for c in committed["cells"]] != built:
        out.append(f"{lesson.notebook.name} differs from notebooks/src/{lesson.src.name}: "
                   "run `make notebooks` and commit both")
    kernel = committed["metadata"].get("kernelspec", {}).get("name")
    if kernel != "python3":
        out.append(f"{lesson.notebook.name}: kernelspec {kernel!r}, want 'python3' (nbval and "
                   "papermill start this kernel): run `make notebooks`")
    return out


def markdown_lines_are_comments(lesson: Lesson) -> list[str]:
    """In the percent source every line of a markdown cell is a comment: an uncommented line is
    kept as text by jupytext, but tools that read the source as Python (tools/gpu_budget.py reads
    the presets from it) stop at it."""
    out, kind = [], None
    for number, line in enumerate(lesson.src.read_text().splitlines(), 1):
        if line.startswith("# %%"):
            kind = "markdown" if "[markdown]" in line else "other"
        elif kind == "markdown" and line.strip() and not line.startswith("#"):
            out.append(f"notebooks/src/{lesson.src.name}:{number}: a markdown line without '# ': {line[:60]!r}")
    return out


def no_outputs_committed(lesson: Lesson) -> list[str]:
    dirty = [i for i, c in enumerate(lesson.nb()["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    return [f"{lesson.notebook.name}: clear outputs (cells {dirty} carry outputs or an "
            "execution count)"] if dirty else []


def first_cells(lesson: Lesson) -> list[str]:
    """The parameters cell is the second code cell and sets SCALE the documented way (the title
    and install cell: badge_opens_the_student_edition, first_code_cell_is_the_install_cell)."""
    code = code_cells(lesson.nb())
    if len(code) < 2:
        return [f"{lesson.notebook.name}: want the install cell and the 'parameters' cell as the "
                f"first two code cells; found {len(code)} code cell(s)"]
    params, out = code[1], []
    if "parameters" not in params["metadata"].get("tags", []):
        out.append(f"{lesson.notebook.name}: the second code cell must be tagged 'parameters' "
                   "(# %% tags=[\"parameters\"])")
    if not re.search(r'^SCALE = os\.environ\.get\("COURSE_SCALE"\) or auto_scale\(\)  #',
                     source(params), re.M):
        out.append(f"{lesson.notebook.name}: the second code cell must set "
                   "`SCALE = os.environ.get(\"COURSE_SCALE\") or auto_scale()  # ...` "
                   "(docs/authoring.md, Notebooks)")
    return out


def five_part_pattern(lesson: Lesson) -> list[str]:
    if lesson.name.startswith("00_"):
        return []  # the tour is not a lesson
    text = "\n".join(source(c) for c in lesson.nb()["cells"] if c["cell_type"] == "markdown").lower()
    return [f"{lesson.notebook.name}: no heading for '{part}'"
            for part in ("problem", "mechanism", "worked example", "evidence", "boundary")
            if not re.search(rf"^#+ .*{part}", text, re.M)]


# --------------------------------------------------------------------------- the Colab path

BADGE_LINK = re.compile(r"\[!\[Open In Colab\]\((?P<img>[^)]+)\)\]\((?P<url>[^)]+)\)")


def _badge_problems(nb_path: Path) -> list[str]:
    shown = rel(nb_path)
    title = load(nb_path)["cells"][0]
    if title["cell_type"] != "markdown":
        return [f"{shown}: the first cell must be the markdown title with the Colab badge"]
    text, stem = source(title), nb_path.stem
    out = []
    if not re.match(rf"# {stem[:2]} · \S", text):
        out.append(f"{shown}: title must be '# {stem[:2]} · ...'")
    links = BADGE_LINK.findall(text)
    if len(links) != 1:
        return out + [f"{shown}: want exactly one Colab badge in the title cell "
                      f"(found {len(links)}): {badge(stem)}"]
    img, url = links[0]
    if img != "https://colab.research.google.com/assets/colab-badge.svg":
        out.append(f"{shown}: the badge image must be "
                   f"https://colab.research.google.com/assets/colab-badge.svg, not {img}")
    u = urlparse(url)
    prefix = f"/github/{REPO}/blob/{REF}/"
    if (u.scheme, u.netloc) != ("https", "colab.research.google.com"):
        out.append(f"{shown}: the badge must open https://colab.research.google.com, not {url}")
    elif not u.path.startswith(prefix):
        out.append(f"{shown}: badge must open github/{REPO} at {REF}: {url}")
    else:
        path_in_repo = u.path[len(prefix):]
        if path_in_repo != f"notebooks/student/{nb_path.name}":
            out.append(f"{shown}: badge opens {path_in_repo}, not the student edition (no solutions)")
        elif not (ROOT / path_in_repo).is_file():
            out.append(f"{shown}: badge opens {path_in_repo}, which does not exist: run `make notebooks`")
    if badge(stem) not in text:
        out.append(f"{shown}: the badge is not exactly what tools/template.py writes: {badge(stem)}")
    return out


def badge_opens_the_student_edition(lesson: Lesson) -> list[str]:
    """The title cell's one Colab badge opens the student edition from REPO at REF (tools/template.py),
    in the lesson notebook and in its student edition."""
    return [p for nb in lesson.editions() for p in _badge_problems(nb)]


def first_code_cell_is_the_install_cell(lesson: Lesson) -> list[str]:
    out = []
    for nb in lesson.editions():
        code = code_cells(load(nb))
        if not code or source(code[0]) != INSTALL_CELL:
            out.append(f"{rel(nb)}: the first code cell must be the install cell, exactly "
                       "tools/template.py's INSTALL_CELL (edit the source, then `make notebooks`)")
    return out


def parameters_cell_reads_scale_from_the_environment(lesson: Lesson) -> list[str]:
    name = lesson.notebook.name
    cells = code_cells(lesson.nb())
    tagged = [i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", [])]
    if tagged != [1]:
        return [f"{name}: want one 'parameters' cell, the second code cell: {tagged}"]
    params, out = source(cells[1]), []
    from course_utils.scales import auto_scale  # unset: the device chooses (gpu on CUDA)
    for scale, want in ((None, auto_scale()), ("ci", "ci"), ("gpu", "gpu")):
        ns: dict = {}
        with course_scale(scale):
            exec(compile(params, "parameters", "exec"), ns)
        if ns.get("SCALE") != want:
            given = "with COURSE_SCALE unset" if scale is None else f"with COURSE_SCALE={scale}"
            out.append(f"{name}: {given} the parameters cell sets SCALE = {ns.get('SCALE')!r}, "
                       f"want {want!r}")
    return out


def scale_goes_through_runtime_setup(lesson: Lesson) -> list[str]:
    """setup(SCALE, ...) right after the parameters is what turns "gpu" without CUDA into a
    clear message instead of a crash deep in the lesson."""
    later = "\n".join(source(c) for c in code_cells(lesson.nb())[2:4])
    if re.search(r"\bsetup\(\s*SCALE\b", later):
        return []
    return [f"{lesson.notebook.name}: call setup(SCALE, ...) in the cell after the parameters cell"]


# --------------------------------------------------------------------------- the student edition

def student_edition_is_up_to_date(lesson: Lesson) -> list[str]:
    out = []
    for path, want in build.student_files(lesson.src).items():
        if path == build.STUDENT / f"{lesson.name}.ipynb":
            path = lesson.student
        if not path.is_file() or path.read_text() != want:
            out.append(f"{rel(path)} is not what notebooks/src/{lesson.src.name} builds: "
                       "run `make notebooks`")
    return out


def student_edition_has_no_solutions_or_hidden_tests(lesson: Lesson) -> list[str]:
    name, out = lesson.name, []
    solution, hidden, _ = split_source(lesson.nb())
    if not solution:
        out.append(f"{name}: found no solution lines in the lesson; are the markers right?")
    nb, questions = load(lesson.student), lesson.practice()["questions"]
    given = set(code_lines("\n".join(source(c) for c in nb["cells"])))
    leaked = [line for line in solution if line in given]
    if leaked:
        out.append(f"{name}: solution lines in the student edition: {leaked}")
    shipped = set(code_lines("\n".join(t for q in questions.values()
                                       for t in q["public_tests"] + [q["solution"]])))
    secret = [line for line in hidden if line in shipped or line in given]
    if secret:
        out.append(f"{name}: hidden-test lines handed to learners: {secret}")
    if [c for c in nb["cells"] if c["cell_type"] == "raw"]:
        out.append(f"{name}: otter raw cells left")
    markers = [q for q, data in questions.items() if "SOLUTION" in data["solution"]]
    if markers:
        out.append(f"{name}: otter SOLUTION markers left in the shipped solutions of {markers}")
    return out


def every_exercise_is_followed_by_its_check(lesson: Lesson) -> list[str]:
    name, nb, questions = lesson.name, load(lesson.student), lesson.practice()["questions"]
    checks = [m.group(1) for c in code_cells(nb) for m in [CHECK.match(source(c).strip())] if m]
    out = []
    if checks != list(questions):
        out.append(f"{name}: check cells {checks}; want one `exercises.check(...)` cell per "
                   f"exercise, in order: {list(questions)}")
    for q, entry in questions.items():
        empty = [k for k in ("answer_names", "public_tests") if not entry[k]] + \
            (["solution"] if not entry["solution"].strip() else [])
        if empty:
            out.append(f"{name}: {q}: no {', '.join(empty)} in its practice data (every question "
                       "needs an answer cell, a public test and a solution)")
    return out


def nothing_after_an_exercise_uses_its_answer(lesson: Lesson) -> list[str]:
    """A cell after the exercises that reads an answer would crash for a learner who skipped it."""
    name, cells = lesson.name, load(lesson.student)["cells"]
    answers = {n for q in lesson.practice()["questions"].values() for n in q["answer_names"]}
    answer_cells = {source(c) for c in code_cells({"cells": cells}) if answers & defined_names(source(c))}
    out = []
    for cell in code_cells({"cells": cells}):
        src = source(cell)
        if src in answer_cells or CHECK.match(src.strip()):
            continue
        used = {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
        if used & answers:
            out.append(f"{name}: a cell uses the answers {used & answers}:\n{src[:300]}")
    return out


# --------------------------------------------------------------------------- the assignment

def assign_succeeds(lesson: Lesson) -> list[str]:
    name = lesson.name
    if isinstance(lesson.assignment, Exception):
        return [f"otter assign failed for {name}: {lesson.assignment}"]
    folder, out = lesson.folder(), []
    for part in ("student", "autograder"):
        if not (folder / part / f"{name}.ipynb").is_file():
            out.append(f"{name}: otter assign wrote no {part}/{name}.ipynb")
    with zipfile.ZipFile(folder / f"{name}-autograder.zip") as z:
        tests = [n for n in z.namelist() if n.startswith("tests/") and n.endswith(".py")]
        config = json.loads(z.read("otter_config.json"))
    if len(tests) != lesson.questions():
        out.append(f"{name}: the autograder zip has {len(tests)} test files for "
                   f"{lesson.questions()} questions: {tests}")
    if config.get("assignment_name") != name or config.get("pdf") is not False:
        out.append(f"{name}: the autograder zip's otter_config.json has assignment_name="
                   f"{config.get('assignment_name')!r}, pdf={config.get('pdf')!r}; want {name!r}, False")
    return out


def student_notebook_has_no_solutions(lesson: Lesson) -> list[str]:
    name = lesson.name
    solution, _, _ = split_source(lesson.nb())
    if not solution:
        return [f"{name}: found no solution lines in the source; are the markers right?"]
    text, out = student_text(lesson.folder(), name), []
    given = set(code_lines(text))
    leaked = [l for l in solution if l in given]
    if leaked:
        out.append(f"{name}: solution lines handed to students: {leaked}")
    if re.search(r"#\s*(BEGIN |END )?SOLUTION", text):
        out.append(f"{name}: solution marker left")
    return out


def hidden_tests_only_in_autograder(lesson: Lesson) -> list[str]:
    name, folder = lesson.name, lesson.folder()
    _, hidden, _ = split_source(lesson.nb())
    if not hidden:
        return [f"{name}: no hidden test found (first line '# HIDDEN' in a test cell)"]
    given, out = student_text(folder, name), []
    leaked = [l for l in hidden if l in given]
    if leaked:
        out.append(f"{name}: hidden-test lines handed to students: {leaked}")
    graded = set(autograder_test_lines(folder / f"{name}-autograder.zip"))
    missing = [l for l in hidden_statements(lesson.nb()) if l not in graded]
    if missing:
        out.append(f"{name}: hidden tests missing from the autograder zip: {missing}")
    return out


def helpers_not_shared_between_test_cells(lesson: Lesson) -> list[str]:
    """otter runs every test cell on its own copy of the notebook's globals: a name defined in one
    test cell is a NameError in another (at grading time only; nbval runs them in one kernel)."""
    nb = lesson.nb()
    cells = cells_in_tests(nb)
    in_tests = {i for i, _ in cells}
    body = set()
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code" and i not in in_tests:
            try:
                body |= bound_names(ast.parse(source(cell)))
            except SyntaxError:
                pass
    out = []
    for i, tree in cells:
        mine = bound_names(tree)
        others = set().union(*[bound_names(t) for j, t in cells if j != i]) - mine - body
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        shared = sorted(used & others)
        if shared:
            out.append(f"{lesson.name}: test cell {i} uses {shared}, defined only in another test "
                       "cell; move the helper to a code cell before the first question")
    return out


def no_test_cell_shows_a_value(lesson: Lesson) -> list[str]:
    """Test cells are doctests that expect no output: a bare expression with a value fails."""
    out = []
    for i, tree in cells_in_tests(lesson.nb()):
        for node in tree.body:
            if not isinstance(node, ast.Expr) or isinstance(node.value, ast.Constant):
                continue  # statements, and the TEST CONFIG string
            call = node.value if isinstance(node.value, ast.Call) else None
            inplace = call is not None and isinstance(call.func, ast.Attribute) \
                and call.func.attr.endswith("_") and not call.func.attr.startswith("_")
            printing = call is not None and isinstance(call.func, ast.Name) and call.func.id == "print"
            if call is None or inplace or printing:
                out.append(f"{lesson.name}: test cell {i}, line {node.lineno}: `{ast.unparse(node)}` "
                           "shows a value, which the doctest compares with nothing; write `_ = ...`")
    return out


def every_question_has_public_tests(lesson: Lesson) -> list[str]:
    """Students only see public tests: a question without one gives them no feedback at all."""
    tests = sorted((lesson.folder() / "student" / "tests").glob("*.py"))
    questions = lesson.questions()
    public = {}
    for t in tests:
        ns: dict = {}
        exec(t.read_text(), ns)  # generated by otter: `test = {...}`
        public[t.stem] = sum(len(su["cases"]) for su in ns["test"]["suites"])
    if len(public) == questions and all(public.values()):
        return []
    return [f"{lesson.name}: {questions} questions; public test cases per question: {public}"]


def student_answer_cells_are_editable(lesson: Lesson) -> list[str]:
    name = lesson.name
    nb = load(lesson.folder() / "student" / f"{name}.ipynb")
    answers = [c for c in nb["cells"] if "otter_answer_cell" in c["metadata"].get("tags", [])]
    questions, out = lesson.questions(), []
    if len(answers) < questions:
        out.append(f"{name}: {len(answers)} answer cells for {questions} questions (answer code "
                   "belongs between '# BEGIN SOLUTION' / '# END SOLUTION' raw cells)")
    locked = [source(c)[:60] for c in answers if c["metadata"].get("editable") is False]
    if locked:
        out.append(f"{name}: answer cells locked against editing: {locked}")
    return out


def student_notebook_starts_like_the_lesson(lesson: Lesson) -> list[str]:
    """Up to the first exercise the student notebook is the lesson itself (minus the Colab badge,
    which would open the version with solutions), so the lesson's nbval run covers it."""
    name = lesson.name
    student = load(lesson.folder() / "student" / f"{name}.ipynb")["cells"]
    lesson_cells = lesson.nb()["cells"]
    out = []
    if "colab.research.google.com" in source(student[0]):
        out.append(f"{name}: the student notebook's title (tools/assign.py) still has the Colab "
                   "badge, which opens the lesson with solutions")
    if len(student) < 3 or source(student[1]) != INSTALL_CELL:
        out.append(f"{name}: student notebook (tools/assign.py): second cell must stay the install cell")
    if len(student) < 3 or "parameters" not in student[2]["metadata"].get("tags", []):
        out.append(f"{name}: student notebook (tools/assign.py): third cell must stay the "
                   "'parameters' cell")
    try:
        k = first_question_cell({"cells": student})
    except AssertionError as err:
        return out + [f"{name}: student notebook: {err}"]
    q = assign.question_indices({"cells": lesson_cells})[0]
    got = [(c["cell_type"], source(c)) for c in student[1:k]]
    want = [(c["cell_type"], source(c)) for c in lesson_cells[1:q]]
    if got != want:
        out.append(f"{name}: student cells before the exercises differ from the lesson's")
    return out


# --------------------------------------------------------------------------- all of them

NOTEBOOK_RULES: list[Rule] = [
    notebook_is_what_jupytext_builds, no_outputs_committed, badge_opens_the_student_edition,
    first_code_cell_is_the_install_cell, first_cells, parameters_cell_reads_scale_from_the_environment,
    scale_goes_through_runtime_setup, five_part_pattern, two_to_four_exercises,
]
SOURCE_RULES: list[Rule] = [  # notebook_is_what_jupytext_builds needs the source too
    markdown_lines_are_comments, student_edition_is_up_to_date, student_edition_has_no_solutions_or_hidden_tests,
    every_exercise_is_followed_by_its_check, nothing_after_an_exercise_uses_its_answer,
]
ASSIGNMENT_RULES: list[Rule] = [  # for the fixture and every lesson with exercises
    assign_succeeds, student_notebook_has_no_solutions, hidden_tests_only_in_autograder,
    helpers_not_shared_between_test_cells, no_test_cell_shows_a_value, every_question_has_public_tests,
    student_answer_cells_are_editable, student_notebook_starts_like_the_lesson,
]
NEEDS_ASSIGNMENT = {student_notebook_has_no_solutions, hidden_tests_only_in_autograder,
                    every_question_has_public_tests, student_answer_cells_are_editable,
                    student_notebook_starts_like_the_lesson}
RULES: list[Rule] = NOTEBOOK_RULES + SOURCE_RULES + ASSIGNMENT_RULES


def rules_for(lesson: Lesson) -> tuple[list[Rule], list[str]]:
    """(the rules that concern ``lesson``, problems found on the way: files that are missing)."""
    if lesson.fixture:
        return ASSIGNMENT_RULES, []
    found, rules = [], []
    has_src, has_nb = lesson.src.is_file(), lesson.notebook.is_file()
    if not has_nb:
        found.append(f"{rel(lesson.notebook)} is missing: run `make notebooks` and commit it")
    if not has_src:
        found.append(f"{rel(lesson.src)} is missing: every lesson notebook is built from its "
                     "source (and a student edition without one is stale)")
    if has_nb:
        rules += [r for r in NOTEBOOK_RULES if has_src or r is not notebook_is_what_jupytext_builds]
    if has_src:
        rules += SOURCE_RULES
    try:
        has_exercises = has_nb and lesson.questions() > 0
    except Exception:  # an unreadable notebook: the notebook rules say so
        has_exercises = False
    if has_exercises:
        rules += ASSIGNMENT_RULES
    return rules, found


def render_sample(tmp: Path) -> Path:
    """The fixture lesson tests/fixtures/98_sample.py as a notebook with solutions, in ``tmp``."""
    sample = Path(tmp) / f"{SAMPLE}.ipynb"
    sample.write_text(build.render(FIXTURES / f"{SAMPLE}.py"))
    return sample


def lesson_notebooks(tmp: Path) -> dict[str, Path]:
    """name -> the notebook with solutions of the fixture (rendered into ``tmp``) and of every
    lesson with exercises: what tools/assign.py is run on."""
    return {SAMPLE: render_sample(tmp), **{p.stem: p for p in assign.lessons()}}


def build_assignments(notebooks: dict[str, Path], out: Path) -> dict[str, Path | Exception]:
    """Run otter assign once per notebook (without executing it); a failure is kept per name."""
    result: dict[str, Path | Exception] = {}
    for name, path in notebooks.items():
        try:
            result[name] = assign.assign(path, out, run_tests=False, quiet=True)
        except Exception as err:  # reported by assign_succeeds for that lesson only
            result[name] = err
    return result


def problems(name: str, *, notebook: Path | None = None, src: Path | None = None,
             student: Path | None = None, assignment: Path | Exception | None = None) -> list[str]:
    """Every problem every rule finds in lesson ``name`` (empty: it follows the house rules).

    The paths default to the lesson's files in notebooks/; ``assignment`` is tools/assign.py's
    folder for it (or the error it raised), built into a temporary folder when not given and the
    lesson has exercises. A rule that cannot run (a file it reads is broken) is a problem too.
    """
    with contextlib.ExitStack() as stack:
        if name == SAMPLE and notebook is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rules_")))
            notebook = render_sample(tmp)
        lesson = Lesson.of(name, notebook=notebook, src=src, student=student, assignment=assignment)
        rules, found = rules_for(lesson)
        if lesson.assignment is None and assign_succeeds in rules:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rules_dist_")))
            got = build_assignments({name: lesson.notebook}, tmp)[name]
            lesson = Lesson.of(name, notebook=notebook, src=src, student=student, assignment=got)
        for rule in rules:
            if rule in NEEDS_ASSIGNMENT and isinstance(lesson.assignment, Exception):
                continue  # assign_succeeds says why once
            try:
                found += rule(lesson)
            except Exception as err:
                found.append(f"{name}: {rule.__name__} could not check: {type(err).__name__}: {err}")
        return found
