"""Self-study checks for the student editions (``notebooks/student/NN_name.ipynb``).

A student edition ends each exercise with a check cell::

    exercises = Exercises("01_resource_ledger")      # once, before the first exercise
    exercises.check("q1_mlp_activation_bytes")       # after the learner's answer cell
    exercises.reveal("q1_mlp_activation_bytes")      # only when asked for: prints a solution

``check`` runs the exercise's public tests (the same ones ``make assignments`` hands out) on the
notebook's own variables, offline: the tests ship inside the kit (``course_utils/practice_data/``,
written by ``make notebooks`` from the lesson sources), so neither JupyterLab nor Colab needs a
tests folder. It answers in sentences: "not attempted" while an answer is still ``...``; for a
failing ``assert left == right, hint`` the side computed from the learner's answer, its value,
how it misses (direction and factor for numbers, where for sequences) and the hint; for a failing
``check_*`` its message; for any other error the exception and the test line that raised it.
Feedback never shows the expected value (the side of a comparison that does not come from the
answer, the arguments of a ``check_*`` after the answer): a wrong try must not give away a
predict-then-measure answer; ``reveal`` is the way to see a solution. Hidden tests are not
shipped: graded runs (``tools/grade.py``) may check more cases.

Why not otter's ``Notebook.check``, which runs the same tests: it reads them from a tests folder
beside the notebook (a Colab learner who opens one notebook has none), it reports a failure as
the test's source and traceback (which, for a predict-then-measure exercise, prints the value
to be predicted), and it would add otter-grader to every learner's install. Otter stays what
builds the assignments and grades them (``tools/assign.py``, ``tools/grade.py``).
"""
from __future__ import annotations

import ast
import dis
import json
import operator
import sys
import traceback
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .feedback import _is_number, describe_difference, describe_miss, is_unanswered

__all__ = ["Exercises", "CheckResult", "load_lesson"]

NOT_ATTEMPTED, PASSED, FAILED = "not attempted", "passed", "failed"
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def load_lesson(lesson: str) -> dict:
    """The exercise data of one lesson: {"lesson", "questions": {name: {"answer_names",
    "public_tests", "solution"}}}, read from the installed kit."""
    if not isinstance(lesson, str) or not lesson:
        raise TypeError(f"lesson must be a notebook name like '01_resource_ledger', got {lesson!r}")
    path = resources.files("course_utils") / "practice_data" / f"{lesson}.json"
    if not path.is_file():
        have = sorted(p.name[:-5] for p in (resources.files("course_utils") / "practice_data")
                      .iterdir() if p.name.endswith(".json"))
        raise ValueError(f"no exercises for lesson {lesson!r} in this kit; lessons with "
                         f"exercises: {have}. Is the kit older than the notebook? Reinstall it.")
    return json.loads(path.read_text())


@dataclass
class CheckResult:
    """What one ``check`` found. ``status``: "passed", "failed" or "not attempted"; ``lines``: the
    feedback shown in the notebook (its repr)."""
    question: str
    status: str
    passed: int = 0
    total: int = 0
    lines: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return "\n".join(self.lines)

    def __bool__(self) -> bool:
        return self.status == PASSED


class Exercises:
    """The checks of one lesson's exercises; see the module docstring."""

    def __init__(self, lesson: str):
        self.lesson = lesson
        self.questions = load_lesson(lesson)["questions"]

    def _question(self, name: str) -> dict:
        if name not in self.questions:
            raise ValueError(f"{self.lesson} has no exercise {name!r}; its exercises: "
                             f"{list(self.questions)}")
        return self.questions[name]

    def check(self, name: str, namespace: dict | None = None) -> CheckResult:
        """Run question ``name``'s public tests on ``namespace`` (default: the caller's globals,
        i.e. the notebook's variables); return the feedback (shown by the notebook)."""
        q = self._question(name)
        ns = sys._getframe(1).f_globals if namespace is None else namespace
        missing = _unanswered(q["answer_names"], ns)
        if missing:
            return CheckResult(name, NOT_ATTEMPTED, 0, len(q["public_tests"]), [
                f"{name}: not attempted yet — {missing}. Write your answer in the cell above, "
                "run that cell, then run this check again."])
        failures = [f for f in (_run_test(src, dict(ns), q["answer_names"])
                                for src in q["public_tests"]) if f]
        total = len(q["public_tests"])
        if not failures:
            return CheckResult(name, PASSED, total, total, [
                f"{name}: all {total} public check(s) pass ✓ (graded runs may add hidden cases)"])
        lines = [f"{name}: {total - len(failures)} of {total} public check(s) pass"]
        lines += [line for f in failures for line in f]
        lines.append(f'Stuck? exercises.reveal("{name}") prints a solution.')
        return CheckResult(name, FAILED, total - len(failures), total, lines)

    def reveal(self, name: str) -> None:
        """Print a solution of question ``name`` (on purpose: try the check first)."""
        q = self._question(name)
        print(f"# A solution to {self.lesson} · {name}; paste it into the answer cell and run it.\n")
        print(q["solution"])


def _unanswered(names: list[str], ns: dict) -> str:
    """'' when every answer name holds an answer, else a sentence naming the first that does not."""
    for n in names:
        if n not in ns:
            return f"`{n}` is not defined (has the cell above been run?)"
        value = ns[n]
        if is_unanswered(value):
            return f"`{n}` is still `{'...' if value is Ellipsis else repr(value)}`"
        if callable(value) and _body_is_ellipsis(value):
            return f"the body of `{n}` is still `...`"
    return ""


def _body_is_ellipsis(fn: Any) -> bool:
    """True for a function whose body does nothing: only ``...``, ``pass`` or a docstring (the
    skeleton). Python compiles a bare ``...`` away, so this reads the bytecode: nothing but
    constants loaded and returned."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_CONST", "RETURN_CONST"):
            if not isinstance(ins.argval, (type(Ellipsis), str, type(None))):
                return False
        elif ins.opname not in ("RESUME", "NOP", "RETURN_VALUE", "CACHE", "POP_TOP"):
            return False
    return True


def _run_test(src: str, ns: dict, answer_names: list[str] = ()) -> list[str]:
    """Execute one public test cell statement by statement in ``ns``; [] if it passes, else
    feedback lines for the first statement that fails. ``answer_names`` (and every name a
    statement assigns from them) mark what is the learner's: only that side of a comparison is
    shown."""
    try:
        tree = ast.parse(src)
    except SyntaxError as err:  # a broken test is our bug, say so rather than blame the learner
        return [f"  ✗ this check does not parse ({err}); please report it"]
    yours = set(answer_names)
    for stmt in tree.body:
        text = ast.get_source_segment(src, stmt) or ast.unparse(stmt)
        try:
            if isinstance(stmt, ast.Assert) and _is_simple_compare(stmt.test):
                failed = _compare(stmt, ns, yours)
                if failed:
                    return failed
            else:
                exec(compile(ast.Module([stmt], []), "<check>", "exec"), ns)
        except AssertionError as err:
            return [f"  ✗ {_headline(stmt, text)}", f"    {err}" if str(err) else "    (assert failed)"]
        except Exception as err:  # the learner's code raised: show what and where
            return [f"  ✗ {_headline(stmt, text)}", f"    raised {type(err).__name__}: {err}",
                    *_learner_frame(err)]
        if _names(stmt) & yours:     # computed from the answer: the learner's too
            yours |= _stored(stmt)
    return []


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _stored(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _headline(stmt: ast.stmt, text: str) -> str:
    """The failing statement as shown: a ``check_*(answer, expected, ...)`` call as
    ``check_*(answer, …)`` (its later arguments may spell the expected value), else its first
    line."""
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    if call is not None and call.args:
        func = call.func.id if isinstance(call.func, ast.Name) else \
            call.func.attr if isinstance(call.func, ast.Attribute) else ""
        if func.startswith("check_"):
            return _first_line(f"{func}({ast.unparse(call.args[0])}, …)")
    return _first_line(text)


def _is_simple_compare(test: ast.expr) -> bool:
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARE


_OP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def _compare(stmt: ast.Assert, ns: dict, yours: set[str]) -> list[str]:
    """Evaluate both sides of ``assert left OP right, hint`` once; feedback lines if it fails:
    the side computed from the learner's answer with its value and how it misses, never the
    other side's value."""
    test = stmt.test
    sides = (test.left, test.comparators[0])
    left, right = (eval(compile(ast.Expression(e), "<check>", "eval"), ns) for e in sides)
    ok = _COMPARE[type(test.ops[0])](left, right)
    if bool(getattr(ok, "all", lambda: ok)()):
        return []
    op = _OP[type(test.ops[0])]
    mine = [bool(_names(e) & yours) for e in sides]
    if mine[0] == mine[1]:   # both or neither side is the learner's: show no value
        lines = [f"  ✗ {_first_line('assert ' + ast.unparse(test))}",
                 "    this comparison does not hold"]
    else:
        i = 0 if mine[0] else 1
        value, other = (left, right) if i == 0 else (right, left)
        expr = ast.unparse(sides[i])
        shown = (f"{expr} {op} …" if i == 0 else f"… {op} {expr}")
        lines = [f"  ✗ assert {_first_line(shown)}", f"    yours: {_first_line(expr)} = {_show(value)}"]
        if isinstance(test.ops[0], ast.Eq) and _is_number(value) and _is_number(other):
            lines[-1] += f": {describe_miss(float(value), float(other), 'it must be exact')}"
        elif isinstance(test.ops[0], ast.Eq):
            diff = describe_difference(value, other)
            if diff:
                lines.append(f"    {diff}")
        else:   # a bound, not an answer: its expression (never its value) says what was wanted
            other_expr = ast.unparse(sides[1 - i])
            lines.append(f"    it should be {op if i == 0 else _FLIP[op]} {_first_line(other_expr)}")
    if stmt.msg is not None:
        lines.append(f"    hint: {eval(compile(ast.Expression(stmt.msg), '<check>', 'eval'), ns)}")
    return lines


_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _learner_frame(err: BaseException) -> list[str]:
    """The innermost traceback line that is the notebook's code (not the kit's, not the check's)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if "ipykernel" in f.filename or f.filename.startswith("<ipython")]
    if not frames:
        return []
    f = frames[-1]
    return [f"    in your code, `{f.name}`: {f.line}"] if f.line else []


def _first_line(text: str) -> str:
    first = text.strip().split("\n")[0].rstrip("\\").rstrip()
    return first if len(first) <= 100 else first[:97] + "..."


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
