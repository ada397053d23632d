"""Student editions of the lessons: the notebook a learner opens, with no solutions in it.

``tools/notebooks.py build`` (``make notebooks``) calls ``student_edition`` for every lesson and
writes

    notebooks/student/NN_name.ipynb            the lesson, each answer cell a skeleton, each
                                               exercise's tests replaced by one check cell
    course_utils/practice_data/NN_name.json    per question: the names the answer defines, its
                                               public tests, its solution (for reveal)

from the lesson notebook (otter-grader assign format, docs/authoring.md), which stays the single
source. Solutions are stripped with otter's own ``replace_solutions`` so the student edition and
``make assignments``' student notebook leave the same skeleton. Hidden tests go nowhere: they stay
in the lesson and in the autograder zip. ``course_utils.exercises`` runs the checks.
"""
from __future__ import annotations

import ast
import re

import nbformat

from assign import _block_marker, _source  # noqa: E402  (tools/ is on sys.path)

INTRO = ("**Your turn.** Each exercise below leaves a cell for your answer (the `...`): fill it "
         "in, run it, then run the check cell after it. The checks run the exercise's public "
         "tests here, offline, and say what disagrees; a graded run may test more cases. "
         "Stuck after trying? `exercises.reveal(\"<exercise name>\")` prints a solution.")
INIT = '''from course_utils.exercises import Exercises

exercises = Exercises("{lesson}")  # the checks below; exercises.reveal("...") shows a solution'''
CHECK = 'exercises.check("{question}")'
MARKDOWN_PROMPT = "_Type your answer here, replacing this text._"  # otter's prompt for prose
TEST_CONFIG = re.compile(r'(?s)^\s*"""\s*#\s*BEGIN TEST CONFIG.*?END TEST CONFIG[^\n]*\n?')
SOLUTION_MARKERS = re.compile(r"^\s*#\s*(BEGIN|END) SOLUTION( NO PROMPT)?\s*$")
SOLUTION_SUFFIX = re.compile(r"\s*#\s?SOLUTION( NO PROMPT)?\s*$")


def is_hidden_test(text: str) -> bool:
    """otter's rule: a test cell is hidden when its first line is a comment mentioning "hidden",
    or its TEST CONFIG says ``hidden: true``."""
    first = text.strip().split("\n")[0] if text.strip() else ""
    if first.startswith("#") and re.search(r"\bhidden\b", first, re.I):
        return True
    config = TEST_CONFIG.match(text)
    return bool(config and re.search(r"hidden:\s*true", config.group(0), re.I))


def skeleton(code: str) -> str:
    """The answer cell a learner starts from (otter's solution stripping)."""
    from otter.assign.solutions import replace_solutions  # slow import, only when building
    return "\n".join(replace_solutions(code.split("\n"), "python"))


def solution_text(code: str) -> str:
    """The answer cell with its solution markers removed: what ``reveal`` prints."""
    lines = [l for l in code.split("\n") if not SOLUTION_MARKERS.match(l)]
    return "\n".join(SOLUTION_SUFFIX.sub("", l) for l in lines)


def defined_names(code: str) -> list[str]:
    """Top-level names an answer cell defines (functions, classes, assignment targets)."""
    names: list[str] = []
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def _question_name(raw: str, where: str) -> str:
    m = re.search(r"^name:\s*(\S+)\s*$", raw, re.M)
    if not m:
        raise ValueError(f"{where}: '# BEGIN QUESTION' cell without a 'name:' line")
    return m.group(1)


def _new(kind: str, text: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}[kind]
    cell = make(text)
    if tags:
        cell.metadata["tags"] = tags
    return cell


def student_edition(nb: nbformat.NotebookNode, lesson: str) -> tuple[nbformat.NotebookNode, dict]:
    """(student notebook, practice data) for lesson notebook ``nb``. Cells before the first
    exercise are the lesson's own; raw otter cells are dropped."""
    out = nbformat.v4.new_notebook(metadata=nb.metadata)
    questions: dict[str, dict] = {}
    stack: list[str] = []
    current: dict | None = None
    for i, cell in enumerate(nb.cells):
        marker = _block_marker(cell)
        where = f"{lesson}: cell {i}"
        if marker:
            kind, block = marker
            if kind == "BEGIN":
                stack.append(block)
                if block == "QUESTION":
                    if not questions:
                        out.cells += [_new("markdown", INTRO), _new("code", INIT.format(lesson=lesson))]
                    name = _question_name(_source(cell), where)
                    current = questions[name] = {"answer_names": [], "public_tests": [],
                                                 "solution": []}
            else:
                if not stack or stack[-1] != block:
                    raise ValueError(f"{where}: '# END {block}' does not close {stack or 'anything'}")
                stack.pop()
                if block == "TESTS":
                    out.cells.append(_new("code", CHECK.format(question=name)))
                elif block == "QUESTION":
                    current = None
            continue
        if cell.cell_type == "raw" or current is None:
            out.cells.append(_copy(cell))
            continue
        text = _source(cell)
        if "SOLUTION" in stack:
            current["solution"].append(solution_text(text))
            if cell.cell_type == "code":
                current["answer_names"] += defined_names(solution_text(text))
                out.cells.append(_new("code", skeleton(text)))
            else:
                out.cells.append(_new("markdown", MARKDOWN_PROMPT))
        elif "TESTS" in stack:
            if cell.cell_type == "code" and not is_hidden_test(text):
                current["public_tests"].append(TEST_CONFIG.sub("", text).strip("\n"))
        else:
            out.cells.append(_copy(cell))
    if stack:
        raise ValueError(f"{lesson}: unclosed blocks at the end: {stack}")
    for i, cell in enumerate(out.cells):
        cell.id = f"cell-{i:03d}"
    data = {"lesson": lesson, "questions": {
        q: {"answer_names": list(dict.fromkeys(v["answer_names"])), "public_tests": v["public_tests"],
            "solution": "\n\n".join(v["solution"])} for q, v in questions.items()}}
    for q, v in data["questions"].items():
        if not v["public_tests"]:
            raise ValueError(f"{lesson}: exercise {q} has no public test; its check cell would "
                             "have nothing to run (docs/authoring.md, Exercises)")
    return out, data


def _copy(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    tags = cell.metadata.get("tags")
    kind = cell.cell_type
    if kind == "raw":
        new = nbformat.v4.new_raw_cell(_source(cell))
        if tags:
            new.metadata["tags"] = tags
        return new
    return _new(kind, _source(cell), tags)
