"""Student notebooks and autograder zips from the lesson notebooks (otter-grader assign, v1).

    python tools/assign.py                      # every lesson with exercises -> dist/
    python tools/assign.py notebooks/06_training_memory.ipynb --out dist --no-run-tests

For each lesson ``NN_name.ipynb`` that contains a ``# BEGIN QUESTION`` raw cell this writes

    dist/NN_name/student/NN_name.ipynb          hand this out (no solutions, no hidden tests)
    dist/NN_name/student/tests/*.py             public tests, used by grader.check(...)
    dist/NN_name/autograder/NN_name.ipynb       solutions, for the instructor
    dist/NN_name/NN_name-autograder.zip         all tests; `otter run -a` / tools/grade.py use it

The lessons carry no otter boilerplate. Before calling ``otter assign`` this script writes a
prepared copy of the lesson into a temporary folder:
  * the course's one ASSIGNMENT CONFIG raw cell (``assignment_config``) goes first;
  * the Colab badge is dropped from the title (it opens the lesson *with* solutions);
  * one Otter init cell goes right before the first question, not at the top where otter puts
    it: the first cells stay title / install / parameters, and on Colab ``import otter`` only
    runs after the install cell could have installed it.
Then the solutions notebook is graded like a submission (tools/grade.py: own process, time limit,
``COURSE_SCALE=ci``, no network) and must get full marks, unless ``--no-run-tests``.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import grade  # noqa: E402
from template import kit_source  # noqa: E402

# slow (~5-8 s), mostly jsonschema importing rfc3987_syntax
from otter.assign import main as otter_assign  # noqa: E402

QUESTION = re.compile(r"^#\s+BEGIN\s+QUESTION", re.IGNORECASE)
CONFIG = re.compile(r"^#\s+ASSIGNMENT\s+CONFIG", re.IGNORECASE)
BADGE = re.compile(r"^\[!\[Open In Colab\]\(.*?\)\]\(.*?\)\s*$")

INIT_CELL = '''# Otter checks your answers: run this cell once, then each `grader.check(...)` cell.
# On Colab, first upload the tests/ folder that came with this notebook (to /content).
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "otter-grader"], check=True)
import otter
grader = otter.Notebook(tests_dir="tests")'''


def assignment_config(name: str) -> str:
    """The one ASSIGNMENT CONFIG of the course (yaml), the same for every lesson but its name.

    name: otter checks a submission's notebook metadata against it, so a student who hands in
      lesson 03 for lesson 06 gets an error rather than a zero.
    tests.files: public tests as tests/*.py next to the notebook; notebook-metadata tests do not
      work on Colab.
    init_cell false: tools/assign.py places its own init cell (see INIT_CELL).
    export_cell false, no PDFs: students hand in the .ipynb itself; nothing needs LaTeX.
    requirements: only used if the zip is run in otter's Docker image or on Gradescope; `otter run`
      (no Docker) grades in the current environment, which must have the kit installed.
    """
    return "\n".join([
        "# ASSIGNMENT CONFIG",
        f"name: {name}",
        "requirements: requirements.txt",
        "init_cell: false",
        "check_all_cell: false",
        "export_cell: false",
        "solutions_pdf: false",
        "template_pdf: false",
        "tests:",
        "  files: true",
        "generate:",
        "  pdf: false",
        "  show_stdout: true",
    ])


REQUIREMENTS = f"course-utils @ {kit_source()}\n"


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def question_indices(nb: dict) -> list[int]:
    """Indices of the raw ``# BEGIN QUESTION`` cells."""
    return [i for i, c in enumerate(nb["cells"])
            if c["cell_type"] == "raw" and QUESTION.match(_source(c))]


def has_exercises(path: Path) -> bool:
    return bool(question_indices(json.loads(path.read_text())))


def lessons(root: Path = ROOT) -> list[Path]:
    """Every lesson notebook in notebooks/ that contains exercises."""
    return [p for p in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")) if has_exercises(p)]


def _cell(kind: str, source: str) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


SOLUTION_LINE = re.compile(r"#\s*(BEGIN SOLUTION|END SOLUTION|SOLUTION)\b")
BLOCK = re.compile(r"^#\s+(BEGIN|END)\s+(QUESTION|SOLUTION|TESTS|PROMPT)\b", re.IGNORECASE)


def _block_marker(cell: dict) -> tuple[str, str] | None:
    """("BEGIN"|"END", "QUESTION"|"SOLUTION"|"TESTS"|"PROMPT") for otter's raw block cells."""
    m = BLOCK.match(_source(cell)) if cell["cell_type"] == "raw" else None
    return (m.group(1).upper(), m.group(2).upper()) if m else None


def wrap_loose_solutions(cells: list[dict], name: str) -> list[dict]:
    """Put raw ``# BEGIN/END SOLUTION`` cells around answer cells that lack them.

    otter only strips ``# SOLUTION`` lines from cells inside a SOLUTION block; a question cell
    outside one is copied to the student notebook verbatim *and* locked. Wrapping here keeps
    such a lesson from leaking its answers; the warning tells its owner to add the raw cells.
    """
    out, stack = [], []
    for i, cell in enumerate(cells):
        marker = _block_marker(cell)
        if marker:
            kind, block = marker
            if kind == "BEGIN":
                stack.append(block)
            elif stack and stack[-1] == block:
                stack.pop()
        elif (cell["cell_type"] == "code" and stack == ["QUESTION"]
              and any(SOLUTION_LINE.search(l) for l in _source(cell).split("\n"))):
            print(f"warning: {name}: cell {i} has solution markers outside a "
                  "'# BEGIN SOLUTION' raw block; wrapped it (see docs/authoring.md, Exercises)",
                  file=sys.stderr)
            out += [_cell("raw", "# BEGIN SOLUTION"), cell, _cell("raw", "# END SOLUTION")]
            continue
        out.append(cell)
    return out


def prepare(nb: dict, name: str) -> dict:
    """The lesson as otter assign should see it: config first, badge out, init cell in."""
    nb = json.loads(json.dumps(nb))  # deep copy
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "raw" and CONFIG.match(_source(cell)):
            raise ValueError(f"{name}: cell {i} is an ASSIGNMENT CONFIG; lessons must not carry "
                             "one, tools/assign.py adds the course's config. Delete that cell.")
    starts = question_indices(nb)
    if not starts:
        raise ValueError(f"{name}: no '# BEGIN QUESTION' raw cell, nothing to assign")
    nb["cells"] = cells = wrap_loose_solutions(nb["cells"], name)
    starts = question_indices(nb)
    if cells and cells[0]["cell_type"] == "markdown":
        lines = _source(cells[0]).split("\n")
        cells[0]["source"] = "\n".join(l for l in lines if not BADGE.match(l.strip()))
    cells.insert(starts[0], _cell("code", INIT_CELL))
    cells.insert(0, _cell("raw", assignment_config(name)))
    for i, cell in enumerate(cells):  # unique, stable ids after the insertions
        cell["id"] = f"cell-{i:03d}"
    return nb


def assign(notebook: Path, out: Path, *, run_tests: bool = True, timeout: float = 900.0,
           quiet: bool = False) -> Path:
    """Run otter assign on one lesson; return the folder dist/NN_name it wrote."""
    notebook = Path(notebook).resolve()
    name = notebook.stem
    target = Path(out).resolve() / name
    if target.exists():
        shutil.rmtree(target)
    with tempfile.TemporaryDirectory(prefix=f"assign_{name}_") as tmp:
        master = Path(tmp) / notebook.name
        master.write_text(json.dumps(prepare(json.loads(notebook.read_text()), name), indent=1))
        (Path(tmp) / "requirements.txt").write_text(REQUIREMENTS)
        try:
            otter_assign(str(master), str(target), no_pdfs=True, no_run_tests=True)
        except Exception as err:  # otter raises bare RuntimeError/AssertionError/ValueError
            raise RuntimeError(f"otter assign failed on {notebook.name}: "
                               f"{type(err).__name__}: {err}") from err
    zips = sorted((target / "autograder").glob(f"{name}-autograder_*.zip"))
    if len(zips) != 1:
        raise RuntimeError(f"expected one autograder zip in {target / 'autograder'}, found {zips}")
    zip_path = target / f"{name}-autograder.zip"
    shutil.move(zips[0], zip_path)
    if run_tests:
        check_reference(target / "autograder" / notebook.name, zip_path, timeout=timeout)
    if not quiet:
        shown = target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target
        print(f"{name}: {shown} (student/, autograder/, {zip_path.name})")
    return target


def check_reference(notebook: Path, zip_path: Path, *, timeout: float) -> None:
    """Grade the solutions notebook like a submission (tools/grade.py: own process, time limit,
    COURSE_SCALE=ci); raise unless it gets full marks. Replaces otter assign's own check, which
    runs in-process with no time limit."""
    r = grade.run_one(notebook, zip_path, timeout=timeout, scale="ci")
    if r["status"] != "ok":
        raise RuntimeError(f"grading the solutions of {notebook.name}: {r['status']}\n"
                           f"{_tail(r['feedback'])}")
    short = {q: f"{s:g}/{mx:g}" for q, (s, mx) in r["scores"].items() if s != mx}
    if short:
        why = "\n".join(_failures(t["output"]) for t in r["raw"]["tests"] if t["name"] in short)
        raise RuntimeError(f"the solutions of {notebook.name} lose points on {short}:\n{why}")


def _failures(output: str, per_case: int = 14) -> str:
    """The failing test cases of one question's otter output, each cut to its first lines."""
    cases = re.split(r"\n(?=\s*❌)", output)
    return "\n".join("\n".join(c.strip("\n").splitlines()[:per_case]) for c in cases if "❌" in c)


def _tail(text: str, n: int = 80) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="lesson notebooks (default: every notebooks/NN_*.ipynb with exercises)")
    ap.add_argument("--out", type=Path, default=ROOT / "dist", help="output folder (default dist/)")
    ap.add_argument("--no-run-tests", action="store_true",
                    help="skip grading the solutions notebook (faster)")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds allowed for grading one solutions notebook (default 900)")
    args = ap.parse_args(argv)
    paths = args.notebooks or lessons()
    if not paths:
        print("no lesson notebook with exercises found in notebooks/")
        return 0
    failed = []
    for path in paths:
        try:
            assign(path, args.out, run_tests=not args.no_run_tests, timeout=args.timeout)
        except (RuntimeError, ValueError) as err:
            failed.append(path.name)
            print(f"FAILED {path.name}: {err}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} of {len(paths)} failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
