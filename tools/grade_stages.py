"""The two stages of grading one submission, each run by tools/grade.py in its own sandbox
(tools/sandbox.py). Nothing here trusts the submission.

    python grade_stages.py execute SUBMISSION.ipynb NAMES_JSON
        Stage 1. Executes the student's notebook in a Jupyter kernel (errors do not stop it),
        writes ./executed.ipynb, then exports from the kernel the answers named in NAMES_JSON
        (plus what the student's functions use) to ./answers.json; see :func:`export_answers`.

    python grade_stages.py score LESSON.ipynb ANSWERS.json TESTS_DIR RESULT_FD
        Stage 2. A fresh interpreter that never saw the student's kernel: runs the instructor's
        student edition of the lesson (the trusted cells), puts the student's answers where the
        answer cells are, runs otter's test files on the result and writes otter-style results
        (``{"tests": [{name, score, max_score, output}, ...]}``) to file descriptor RESULT_FD.

answers.json maps a name to one of
    {"kind": "literal", "repr": "2.0"}           numbers, strings, lists/tuples/dicts of them:
                                                 rebuilt with ast.literal_eval, never eval
    {"kind": "float", "repr": "nan"}             nan and inf
    {"kind": "ellipsis"}                         the untouched placeholder ``...``
    {"kind": "tensor", "dtype": "float32", "shape": [2], "data": "[1.0, 2.0]"}
    {"kind": "function", "source": "def f(x):\\n    return 2 * x\\n"}
    {"kind": "module", "module": "math"}         re-imported from the read-only environment
    {"kind": "ref", "module": "math", "qualname": "sqrt"}   a function/class of a library
    {"kind": "unsupported", "type": "Foo"}       anything else: the answer is missing in stage 2
"""
from __future__ import annotations

import ast
import importlib
import json
import math
import os
import sys
import textwrap
import types
from pathlib import Path

MAX_ANSWERS_BYTES = 16 * 2**20
MAX_TENSOR_ELEMENTS = 1_000_000
SKIP_MARKERS = ("grader.check(", "otter.Notebook(")  # otter's own cells in the student edition


# --------------------------------------------------------------------------- stage 1 (untrusted)

def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def describe(value) -> tuple[dict, set[str]]:
    """(answers.json entry, global names the value's code uses) for one value of the kernel."""
    if value is Ellipsis:
        return {"kind": "ellipsis"}, set()
    if isinstance(value, types.ModuleType):
        return {"kind": "module", "module": value.__name__}, set()
    if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
        import inspect
        try:
            source = textwrap.dedent(inspect.getsource(value))
        except (OSError, TypeError):
            return {"kind": "unsupported", "type": "function without source"}, set()
        return {"kind": "function", "source": source}, _code_names(value.__code__)
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        if value.numel() > MAX_TENSOR_ELEMENTS:
            return {"kind": "unsupported", "type": f"tensor of {value.numel()} elements"}, set()
        return {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape),
                "data": repr(value.detach().cpu().flatten().tolist())}, set()
    if isinstance(value, float) and not math.isfinite(value):
        return {"kind": "float", "repr": repr(value)}, set()
    if callable(value) and getattr(value, "__module__", "__main__") != "__main__" \
            and "<" not in getattr(value, "__qualname__", "<"):
        return {"kind": "ref", "module": value.__module__, "qualname": value.__qualname__}, set()
    try:
        text = repr(value)
        if type(ast.literal_eval(text)) is type(value) and ast.literal_eval(text) == value:
            return {"kind": "literal", "repr": text}, set()
    except Exception:  # not a literal (or a repr that raises): not carried
        pass
    return {"kind": "unsupported", "type": type(value).__qualname__}, set()


def export_answers(namespace: dict, names: list[str], path: str) -> None:
    """Write the answers ``names`` (and, transitively, the globals their functions use) from the
    kernel's ``namespace`` to ``path``. Runs in the student's kernel, so its output is only ever
    treated as the student's claim of what the answers are."""
    out: dict[str, dict] = {}
    todo = [n for n in names if n in namespace]
    while todo:
        name = todo.pop()
        if name in out or name.startswith("__"):
            continue
        entry, uses = describe(namespace[name])
        entry["answer"] = name in names
        out[name] = entry
        todo += [n for n in uses if n in namespace and n not in out]
    Path(path).write_text(json.dumps(out))


def execute(submission: str, names_json: str) -> None:
    import nbformat
    from jupyter_client.connect import ConnectionFileMixin
    from nbclient import NotebookClient

    # unix sockets, not TCP ports: with TCP we saw grading hang now and then on a busy machine
    # where other kernels start at the same time (port races)
    ConnectionFileMixin.class_traits()["transport"].default_value = "ipc"
    nb = nbformat.read(submission, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    client = NotebookClient(nb, timeout=None, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": os.getcwd()}})
    exporter = nbformat.v4.new_code_cell(
        f"import sys as _gs; _gs.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import grade_stages as _gs\n"
        f"_gs.export_answers(globals(), {json.loads(names_json)!r}, 'answers.json')")
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        nbformat.write(nb, "executed.ipynb")
        nb.cells.append(exporter)
        client.execute_cell(exporter, len(nb.cells) - 1)


# --------------------------------------------------------------------------- stage 2 (trusted)

def defined_names(source: str) -> list[str]:
    """Top-level names an answer cell of the student edition binds (def, class, assignment)."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
            if target is not None:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return names


def _def_time_names(node: ast.AST) -> set[str]:
    """Names evaluated when a ``def`` (or lambda) statement runs: decorators, defaults,
    annotations. The body only runs when called."""
    exprs = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        exprs += getattr(node, "decorator_list", [])
        a = node.args
        exprs += a.defaults + [d for d in a.kw_defaults if d is not None]
        if not isinstance(node, ast.Lambda):
            exprs += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs
                      + [a.vararg, a.kwarg] if x is not None and x.annotation is not None]
            exprs += [node.returns] if node.returns is not None else []
    return {n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)}


def rebuild(name: str, entry: dict, namespace: dict, student_functions: set[str]):
    """The value of one answers.json entry, rebuilt without running student code; a function is
    defined from its source (its body runs only when called). Raises ValueError if refused."""
    kind = entry.get("kind")
    if kind == "literal":
        return ast.literal_eval(entry["repr"])
    if kind == "float":
        return float(entry["repr"]) if entry["repr"] in ("nan", "inf", "-inf") else \
            _refuse(name, "not a float")
    if kind == "ellipsis":
        return ...
    if kind == "tensor":
        import torch
        data = ast.literal_eval(entry["data"])
        dtype = getattr(torch, entry["dtype"], None)
        if not isinstance(dtype, torch.dtype) or len(data) > MAX_TENSOR_ELEMENTS:
            _refuse(name, "not a tensor")
        return torch.tensor(data, dtype=dtype).reshape(entry["shape"])
    if kind == "module":
        return importlib.import_module(entry["module"])
    if kind == "ref":
        obj = importlib.import_module(entry["module"])
        for part in entry["qualname"].split("."):
            obj = getattr(obj, part)
        return obj
    if kind == "function":
        tree = ast.parse(entry["source"])
        node = tree.body[0] if len(tree.body) == 1 else None
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda) and \
                [getattr(t, "id", None) for t in node.targets] == [name]:
            lam = node.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            lam = node
        else:
            _refuse(name, "its source is not one `def` (or `name = lambda`) of that name")
        if _def_time_names(lam) & student_functions:
            _refuse(name, "its decorators or default values call code of the submission")
        scope = {}
        exec(compile(tree, f"<answer {name}>", "exec"), namespace, scope)
        return scope[name]
    _refuse(name, f"a {entry.get('type', kind)} cannot be carried from the submission to the "
                  "grader (give a number, string, list, dict, tensor or function)")


def _refuse(name: str, why: str):
    raise ValueError(f"answer `{name}` not used: {why}")


def run_lesson(lesson: str, answers: dict[str, dict]) -> tuple[dict, list[str]]:
    """Execute the trusted cells of the student edition in this interpreter, binding the
    student's answers in place of each answer cell; return (namespace, notes for feedback)."""
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    ns = shell.user_ns
    student_functions = {n for n, e in answers.items() if e.get("kind") == "function"}
    notes: list[str] = []
    deps_bound = False
    for cell in nbformat.read(lesson, as_version=4).cells:
        if cell.cell_type != "code" or any(m in cell.source for m in SKIP_MARKERS):
            continue
        if "otter_answer_cell" not in cell.metadata.get("tags", []):
            shell.run_cell(cell.source, store_history=False)
            continue
        wanted = defined_names(cell.source)
        for name in wanted:
            ns.pop(name, None)
        extra = [] if deps_bound else [n for n, e in answers.items() if not e.get("answer")]
        deps_bound = True
        for name in wanted + extra:
            if name not in answers:
                if name in wanted:
                    notes.append(f"answer `{name}` is not defined in the submission")
                continue
            if name in extra and name in ns:
                continue  # the lesson's own definition wins over the submission's
            try:
                ns[name] = rebuild(name, answers[name], ns, student_functions)
            except Exception as err:  # refused or malformed: the answer is missing
                notes.append(str(err) if isinstance(err, ValueError) else
                             f"answer `{name}` not used: {type(err).__name__}: {err}")
    return ns, notes


def score(lesson: str, answers_path: str, tests_dir: str, result_fd: str) -> None:
    channel = os.fdopen(int(result_fd), "w")
    raw = Path(answers_path).read_bytes()
    answers = json.loads(raw) if len(raw) <= MAX_ANSWERS_BYTES else {}
    if not isinstance(answers, dict) or not all(isinstance(e, dict) for e in answers.values()):
        answers = {}
    from otter.test_files import GradingResults, OKTestFile

    ns, notes = run_lesson(lesson, answers)
    test_files = []
    for path in sorted(Path(tests_dir).glob("*.py")):
        tf = OKTestFile.from_file(str(path))
        tf.run(dict(ns))
        test_files.append(tf)
    results = GradingResults(test_files)
    prefix = "".join(f"note: {n}\n" for n in notes)
    tests = [{"name": "Public Tests", "output": prefix + results.summary(public_only=True)}]
    tests += [{"name": tf.name, "score": tf.score, "max_score": tf.possible,
               "output": prefix + tf.summary()} for tf in test_files]
    json.dump({"tests": tests}, channel)
    channel.close()


if __name__ == "__main__":
    stage, *args = sys.argv[1:]
    {"execute": execute, "score": score}[stage](*args)
