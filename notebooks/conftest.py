"""nbval runs every lesson with its reference solutions; here it also runs each question's tests
as grading would (tools/grade.py), once per lesson and without a sandbox:

- before a question's first test cell, the kernel rebinds that question's answers as the trusted
  grading stage binds them (``grade_stages.as_graded``: values rebuilt from plain data, functions
  called with plain data both ways), so a reference that only works as a live kit object fails
  here instead of losing its points when an instructor grades;
- a test cell shows nothing: otter runs it as a doctest that expects no output.

tests/test_assignments.py still grades one lesson for real, in the sandbox."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
MARKERS = ("# BEGIN SOLUTION", "# END SOLUTION", "# BEGIN TESTS", "# END TESTS")
REBIND = """
import sys as _sys
_sys.path.insert(0, {tools!r})
import grade_stages as _grade_stages
_notes = _grade_stages.as_graded(globals(), {names!r})
_sys.path.remove({tools!r})
del _sys, _grade_stages
assert not _notes, "grading would not use the reference's answers: " + "; ".join(_notes)
del _notes
"""


def _roles(nb) -> dict[int, tuple[str, list[str]]]:
    """id(cell) -> ("solution", []) | ("first test", answer names) | ("test", []) for one notebook."""
    roles, where, answers, first = {}, None, [], False
    for cell in nb.cells:
        text = cell.source.strip()
        if cell.cell_type == "raw" and text.startswith(MARKERS):
            marker = next(m for m in MARKERS if text.startswith(m))
            where = {"# BEGIN SOLUTION": "solution", "# BEGIN TESTS": "test"}.get(marker)
            if marker == "# BEGIN TESTS":
                first = True
            continue
        if cell.cell_type != "code" or where is None:
            continue
        if where == "solution":
            answers += [n for n in _assigned(cell.source) if n not in answers]
            roles[id(cell)] = ("solution", [])
        elif first:
            roles[id(cell)], answers, first = ("first test", answers), [], False
        else:
            roles[id(cell)] = ("test", [])
    return roles


def _assigned(source: str) -> list[str]:
    """Names a solution cell defines (as grade_stages.declared_answers reads an answer cell)."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            if target is not None:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def _run_in_kernel(item, code: str) -> None:
    """Run ``code`` in the notebook's kernel; raise with its error if it fails."""
    kernel = item.parent.kernel
    msg_id = kernel.execute_cell_input(code, allow_stdin=False)
    kernel.await_reply(msg_id, timeout=120)
    error = None
    while True:
        msg = kernel.get_message(stream="iopub", timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            error = f"{msg['content']['ename']}: {msg['content']['evalue']}"
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    if error:
        raise AssertionError(f"{item.name}: binding the answers as grading does failed: {error}")


def _shown(outputs) -> list[str]:
    shown = []
    for out in outputs or []:
        if out.get("output_type") == "stream" and out.get("name") == "stdout" and out.get("text"):
            shown.append(out["text"])
        elif out.get("output_type") in ("execute_result", "display_data"):
            shown.append(str(out.get("data", {}).get("text/plain", out.get("data"))))
    return shown


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if type(item).__name__ != "IPyNbCell":
        return (yield)
    parent = item.parent
    if not hasattr(parent, "_grading_roles"):
        parent._grading_roles = _roles(parent.nb)
    role, answers = parent._grading_roles.get(id(item.cell), (None, []))
    if role == "first test" and answers:
        _run_in_kernel(item, REBIND.format(tools=str(TOOLS), names=answers))
    result = yield
    if role in ("first test", "test"):
        shown = _shown(item.test_outputs)
        assert not shown, (f"{item.name} is a test cell and shows {json.dumps(shown)[:300]}: otter "
                           "grades it as a doctest that expects no output; write `_ = ...`")
    return result
