"""Grade a folder of submissions without Docker: each submission in a sandbox, scores to CSV.

    python tools/grade.py dist/06_memory/06_memory-autograder.zip submissions/06/ \\
        --out grades/06_memory --timeout 600

Writes, under ``--out``:
    scores.csv                  one row per submission: file, status, each question, total, possible
    feedback/<submission>.txt   what each test said (public and hidden), for the instructor
    results/<submission>/       results.json (otter's format) and the executed notebook

Each submission is graded in two stages (tools/grade_stages.py), each in its own sandbox
(tools/sandbox.py: bubblewrap, no network, read-only environment, one scratch folder, limits on
memory, CPU time, processes and file size, a clean environment):

1. the student's notebook runs in a Jupyter kernel; from that kernel only the *answers* leave, as
   data: values (numbers, strings, lists, dicts, tensors) and the source text of functions;
2. a fresh interpreter that never saw that kernel runs the instructor's copy of the student
   notebook (``student/NN_name.ipynb`` next to the zip, as tools/assign.py writes it), binds the
   student's answers where the answer cells are, runs the zip's tests (otter's test runner) and
   sends the results to the grader through a pipe that stage 1 never had.

So what a submission does in its own kernel (replacing ``check_close``, patching otter, printing
or writing a results record, editing the lesson's variables) cannot change a score. What remains
possible: a student's *function* runs in stage 2 when a test (or a later lesson cell) calls it,
and there it can do anything Python allows in that process, including making its own checks
pass or writing a false record to the pipe; a value answer cannot. Timing, and what the tests'
error messages reveal (e.g. the expected number), are side channels the student sees in the
feedback only if you return it. Without bubblewrap the sandbox is only the limits and the clean
environment (the submission can read your files and reach the network); grading prints that
loudly. Submissions run at ``COURSE_SCALE=ci`` by default: exercise tests must not depend on it.

Per-student variants (course_utils/variants.py): each submission is graded as the student its
file is named after (``alice.ipynb`` -> "alice"; otter's exports are named the same way), and
both stages see that ID as ``$COURSE_STUDENT_ID``; tests compare answers with the kit's
measurement for that student's configuration.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import stat
import sys
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sandbox  # noqa: E402
from grade_stages import defined_names  # noqa: E402

STATUS_OK, STATUS_TIMEOUT, STATUS_ERROR = "ok", "timeout", "error"
TOOLS = Path(__file__).resolve().parent
STAGES = TOOLS / "grade_stages.py"
MAX_NOTEBOOK_BYTES = 64 * 2**20
MAX_RESULT_BYTES = 16 * 2**20


def submissions(folder: Path) -> list[Path]:
    """Notebooks (or otter export zips) directly inside ``folder``, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions folder {folder} does not exist or is not a folder")
    found = sorted(p for p in folder.iterdir() if p.suffix in (".ipynb", ".zip") and p.is_file())
    if not found:
        raise ValueError(f"no .ipynb or .zip submissions in {folder}")
    return found


def kit_paths() -> tuple[list[Path], dict[str, str]]:
    """(folders the sandbox needs read-only, environment) for importing the kit as this process
    would, without importing it here."""
    spec = importlib.util.find_spec("course_utils")
    if spec is None or spec.origin is None:
        raise ValueError("course_utils is not importable: install the kit (`make`) or set "
                         "PYTHONPATH to the repository")
    package = Path(spec.origin).resolve().parent
    paths, env = [package], {"PYTHONPATH": str(package.parent)}
    data = package.parent / "data"
    if (package.parent / "pyproject.toml").exists() and data.is_dir():
        paths.append(data)  # dataset caches, read-only (the kit regenerates what is missing)
        env["COURSE_DATA_DIR"] = str(data)
    return paths, env


def read_regular(path: Path, limit: int) -> bytes | None:
    """A file the sandbox wrote, read without following links it may have planted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def _prepare(submission: Path, autograder: Path, tmp: Path) -> tuple[Path, Path, list[str]]:
    """Unpack what the stages read: the submission into ``tmp/submission/`` (stage 1 sees only
    that), the lesson and the tests into ``tmp/trusted/`` (stage 2 only: the hidden tests never
    reach the student's kernel). Returns (submission notebook, lesson, answer names); raises
    ValueError for a submission of another lesson or a missing student edition."""
    trusted, mine = tmp / "trusted", tmp / "submission"
    mine.mkdir()
    with zipfile.ZipFile(autograder) as z:
        config = json.loads(z.read("otter_config.json"))
        (trusted / "tests").mkdir(parents=True)
        for member in z.namelist():
            if member.startswith("tests/") and member.endswith(".py") and "/" not in member[6:]:
                (trusted / member).write_bytes(z.read(member))
    name = config["assignment_name"]
    lesson = autograder.resolve().parent / "student" / f"{name}.ipynb"
    if not lesson.is_file():
        raise ValueError(f"{lesson} is missing: grading runs the student edition that "
                         "tools/assign.py writes next to the autograder zip")
    if submission.suffix == ".zip":  # an otter export: the one notebook inside
        with zipfile.ZipFile(submission) as z:
            inner = [n for n in z.namelist() if n.endswith(".ipynb") and "/" not in n]
            if len(inner) != 1 or z.getinfo(inner[0]).file_size > MAX_NOTEBOOK_BYTES:
                raise ValueError(f"expected one notebook at the top of {submission.name}")
            text = z.read(inner[0])
    else:
        text = submission.read_bytes()
    try:
        got = json.loads(text).get("metadata", {}).get("otter", {}).get("assignment_name")
    except (ValueError, AttributeError):
        raise ValueError(f"{submission.name} is not a notebook (not JSON)") from None
    if got != name:
        raise ValueError(f"{submission.name} is a notebook of assignment {got!r}, not of "
                         f"{name!r}: was it handed in for another lesson?")
    (mine / "submission.ipynb").write_bytes(text)
    lesson_copy = trusted / "lesson.ipynb"
    lesson_copy.write_bytes(lesson.read_bytes())
    cells = json.loads(lesson_copy.read_text())["cells"]
    answers = [n for c in cells if "otter_answer_cell" in c["metadata"].get("tags", [])
               for n in defined_names("".join(c["source"]))]
    return mine / "submission.ipynb", lesson_copy, answers


def _drain(fd: int, sink: bytearray) -> None:
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(65536):
            if len(sink) <= MAX_RESULT_BYTES:
                sink += chunk


def run_one(submission: Path, autograder: Path, *, timeout: float, scale: str,
            keep: Path | None = None, limits: sandbox.Limits = sandbox.Limits(),
            student: str | None = None) -> dict:
    """Grade one submission (both stages, each sandboxed, ``timeout`` seconds for both together);
    return status, scores, feedback. With ``keep``, results.json and the executed notebook are
    written there. ``student`` (default: the submission's file name without its suffix) is the
    ID the exercise variants are drawn for (``$COURSE_STUDENT_ID`` in both stages, so the trusted
    stage 2 checks the answers against *this* student's configuration, whatever the notebook's
    own STUDENT_ID says)."""
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    student = Path(submission).stem if student is None else student
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty ID (the exercise variants are drawn from "
                         f"it), got {student!r}")
    student = student.strip()
    deadline = time.monotonic() + timeout
    readonly, env = kit_paths()
    env.update(COURSE_SCALE=scale, COURSE_STUDENT_ID=student)
    python = sys.executable

    def failed(status: str, why: str, log: str = "") -> dict:
        return {"status": status, "scores": {}, "raw": None,
                "feedback": f"{why}\n\n{log}".rstrip() + "\n"}

    with tempfile.TemporaryDirectory(prefix="grade_") as tmp:
        tmp = Path(tmp)
        try:
            nb, lesson, names = _prepare(Path(submission), Path(autograder), tmp)
        except (ValueError, KeyError, zipfile.BadZipFile) as err:
            return failed(STATUS_ERROR, f"not graded: {err}")
        readonly.append(TOOLS)

        first = sandbox.run([python, str(STAGES), "execute", str(nb), json.dumps(names)],
                            tmp / "stage1", readonly=readonly + [nb.parent], env=env,
                            limits=limits,
                            timeout=max(deadline - time.monotonic(), 0.01))
        if first.returncode is None:
            return failed(STATUS_TIMEOUT, f"killed after the {timeout:g} s time limit")
        work = tmp / "stage1" / "work"
        executed = read_regular(work / "executed.ipynb", MAX_NOTEBOOK_BYTES)
        if keep is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
            if executed is not None:
                (Path(keep) / "executed.ipynb").write_bytes(executed)
        answers = read_regular(work / "answers.json", sandbox.OUTPUT_CHARS * 80)
        if first.returncode != 0 or answers is None:
            return failed(STATUS_ERROR, "the notebook could not be executed "
                          f"(exit status {first.returncode})", first.output)
        (tmp / "answers").mkdir()
        (tmp / "answers" / "answers.json").write_bytes(answers)

        read_end, write_end = os.pipe()
        result = bytearray()
        reader = threading.Thread(target=_drain, args=(read_end, result), daemon=True)
        reader.start()
        try:
            second = sandbox.run([python, str(STAGES), "score", str(lesson),
                                  str(tmp / "answers" / "answers.json"),
                                  str(lesson.parent / "tests"), str(write_end)],
                                 tmp / "stage2", readonly=readonly + [lesson.parent, tmp / "answers"],
                                 env=env,
                                 limits=limits, pass_fds=(write_end,),
                                 timeout=max(deadline - time.monotonic(), 0.01))
        finally:
            os.close(write_end)
        reader.join(timeout=30)
        if second.returncode is None:
            return failed(STATUS_TIMEOUT, f"killed after the {timeout:g} s time limit")
        try:
            raw = json.loads(bytes(result))
            scores = question_scores(raw)
        except (ValueError, KeyError, TypeError):
            return failed(STATUS_ERROR, "scoring did not produce results "
                          f"(exit status {second.returncode})", second.output)
        if keep is not None:
            (Path(keep) / "results.json").write_text(json.dumps(raw, indent=1))
    return {"status": STATUS_OK, "scores": scores, "raw": raw,
            "feedback": f"graded as student {student!r} (exercise variants are drawn "
                        f"from this ID)\n\n" + feedback_text(raw)}


def question_scores(raw: dict) -> dict[str, tuple[float, float]]:
    """name -> (score, max_score) for every graded question in otter's results.json."""
    return {t["name"]: (float(t["score"]), float(t["max_score"]))
            for t in raw["tests"] if t.get("max_score") is not None}


def feedback_text(raw: dict) -> str:
    parts = []
    for t in raw["tests"]:
        head = t["name"] if t.get("max_score") is None else \
            f"{t['name']}: {t['score']:g} / {t['max_score']:g}"
        parts.append(f"== {head}\n{t.get('output', '').rstrip()}\n")
    return "\n".join(parts)


def write_csv(path: Path, rows: list[tuple[str, dict]]) -> None:
    """One row per submission; questions in the order otter reported them."""
    questions: list[str] = []
    for _, r in rows:
        questions += [q for q in r["scores"] if q not in questions]
    # a submission that timed out or crashed has no scores: it gets 0 of what the others could get
    possible = max((sum(mx for _, mx in r["scores"].values()) for _, r in rows), default=0.0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", "status", *questions, "total", "possible"])
        for name, r in rows:
            scores = [r["scores"].get(q, (0.0, 0.0))[0] for q in questions]
            w.writerow([name, r["status"], *(f"{s:g}" for s in scores),
                        f"{sum(scores):g}", f"{possible:g}"])


def grade_folder(autograder: Path, folder: Path, out: Path, *, timeout: float = 600.0,
                 scale: str = "ci", jobs: int = 1) -> Path:
    """Grade every submission in ``folder``, ``jobs`` at a time (each sandbox has its own uid and
    limits, so they do not compete for the process limit); return the path of scores.csv."""
    autograder, out = Path(autograder), Path(out)
    if not autograder.is_file() or autograder.suffix != ".zip":
        raise ValueError(f"autograder must be an otter autograder .zip (from tools/assign.py), "
                         f"got {autograder}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    missing = sandbox.missing_isolation()
    if missing:
        bar = "!" * 78
        print(f"{bar}\n{missing}\n{bar}", file=sys.stderr)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(parents=True, exist_ok=True)
    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")

    def grade(sub: Path) -> tuple[str, dict]:
        r = run_one(sub, autograder, timeout=timeout, scale=scale, keep=out / "results" / sub.stem)
        (out / "feedback" / f"{sub.stem}.txt").write_text(r["feedback"])
        total = sum(s for s, _ in r["scores"].values())
        print(f"{sub.name}: {r['status']}, {total:g} / {sum(m for _, m in r['scores'].values()):g}",
              flush=True)
        return sub.name, r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(grade, submissions(folder)))
    write_csv(out / "scores.csv", rows)
    print(f"wrote {out / 'scores.csv'}")
    return out / "scores.csv"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("autograder", type=Path, help="dist/NN_name/NN_name-autograder.zip")
    ap.add_argument("folder", type=Path, help="folder of submitted .ipynb (or .zip) files")
    ap.add_argument("--out", type=Path, default=Path("grades"), help="output folder (grades/)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds allowed per submission (default 600)")
    ap.add_argument("--scale", default="ci", help="COURSE_SCALE to grade at (default ci)")
    ap.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    args = ap.parse_args(argv)
    try:
        grade_folder(args.autograder, args.folder, args.out, timeout=args.timeout, scale=args.scale,
                     jobs=args.jobs)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
