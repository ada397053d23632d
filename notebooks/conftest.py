"""nbval runs every lesson with its reference solutions; here it also runs each question's tests
as grading would (tools/grade.py), once per lesson and without a sandbox:

- before a question's first test cell, the kernel rebinds that question's answers as the trusted
  grading stage binds them (``grade_stages.as_graded``: the claim held to the declared kinds by the
  grader's ``check_answers``, values rebuilt from plain data, functions called with plain data
  both ways), so a reference that only works as a live kit object fails
  here instead of losing its points when an instructor grades;
- a test cell shows nothing: otter runs it as a doctest that expects no output.

tests/test_assignments.py still grades one lesson for real, in the sandbox."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
MARKERS = ("# BEGIN SOLUTION", "# END SOLUTION", "# BEGIN TESTS", "# END TESTS")
REBIND = """
import sys as _sys
_sys.path.insert(0, {tools!r})
import grade_stages as _grade_stages
_notes = _grade_stages.as_graded(globals(), {sources!r})
_sys.path.remove({tools!r})
del _sys, _grade_stages
assert not _notes, "grading would not use the reference's answers: " + "; ".join(_notes)
del _notes
"""


def _roles(nb) -> dict[int, tuple[str, list[str]]]:
    """id(cell) -> ("solution", []) | ("first test", the question's solution sources) | ("test", [])
    for one notebook."""
    roles, where, solutions, first = {}, None, [], False
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
            solutions.append(cell.source)
            roles[id(cell)] = ("solution", [])
        elif first:
            roles[id(cell)], solutions, first = ("first test", solutions), [], False
        else:
            roles[id(cell)] = ("test", [])
    return roles


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
    role, solutions = parent._grading_roles.get(id(item.cell), (None, []))
    if role == "first test" and solutions:
        _run_in_kernel(item, REBIND.format(tools=str(TOOLS), sources=solutions))
    result = yield
    if role in ("first test", "test"):
        shown = _shown(item.test_outputs)
        assert not shown, (f"{item.name} is a test cell and shows {json.dumps(shown)[:300]}: otter "
                           "grades it as a doctest that expects no output; write `_ = ...`")
    return result
