"""Grade a folder of submissions without Docker: each submission in sandboxes, scores to CSV.

    python tools/grade.py dist/06_memory/06_memory-autograder.zip submissions/06/ \\
        --out grades/06_memory --timeout 600

Writes, under ``--out``:
    scores.csv                  one row per submission, written as each finishes: submission,
                                student, status, one column per question of the zip, total,
                                possible, reason
    feedback/<student>.txt      what each test said (public and hidden), for the instructor
    results/<student>/          results.json (otter's format) and the executed notebook

The trust boundary (a programming-contest judge's: the checker never runs contestant code):

    sandbox, untrusted   stage 1: the student's notebook in a Jupyter kernel
                           -> plain data (tools/plain.py): value answers; function answers'
                              source text, through a pipe (never a file the grader opens)
    grader, trusted      checks each answer against the kind its answer cell declares (a
                         ``def`` is a function answer, anything else a value), size and depth
    sandbox, untrusted   one per function answer, without the kit: defines the student's
                         function, answers calls with plain data
    sandbox, trusted     stage 2: the instructor's copy of the notebook, the value answers bound
                         as rebuilt plain data, each function answer bound as a stub that calls
                         its sandbox; runs the zip's tests; results through a pipe. One scorer
                         process per worker, started once, forks a child per submission
                         (:class:`Scorer`); the answers reach it in the job message
    grader, trusted      keeps the scores of the zip's questions only, clamped to their points

Names and points come from the autograder zip. Any failure while grading one submission
(a malformed file, a crash, a kill) becomes that submission's ``error`` row, with the reason;
the others are graded and every finished row is already in scores.csv.

Per-student variants (course_utils/variants.py): each submission is graded as the student its
file is named after (``alice.ipynb`` -> "alice"; NFKC-normalised, case-folded, letters a-z,
digits, ``.``, ``_`` and ``-`` only), and every stage sees that ID as ``$COURSE_STUDENT_ID``.
"""
from __future__ import annotations

import argparse
import csv
import contextlib
import hashlib
import importlib.util
import json
import os
import queue
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import unicodedata
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain  # noqa: E402
import sandbox  # noqa: E402
from grade_stages import (MAX_FUNCTION_ANSWERS, check_answers, declared_answers,  # noqa: E402
                          frame, receive)

STATUS_OK, STATUS_TIMEOUT, STATUS_ERROR = "ok", "timeout", "error"
TOOLS = Path(__file__).resolve().parent
STAGES = TOOLS / "grade_stages.py"
KERNEL_SITE = TOOLS / "kernel_site"  # first on the graded kernel's path (see its module)
SUFFIXES = (".ipynb", ".zip")
MAX_NOTEBOOK_BYTES = 32 * 2**20     # a submitted notebook, outputs and all
MAX_ANSWERS_CHARS = 4 * 2**20       # the answers' JSON: real answers take kilobytes
MAX_STAGE1_BYTES = 2 * MAX_NOTEBOOK_BYTES + MAX_ANSWERS_CHARS
MAX_RESULT_BYTES = 16 * 2**20
SAFE_ID = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?")


class NotGraded(ValueError):
    """This submission cannot be graded; the message says why (and goes into its row)."""


# --------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class Submission:
    path: Path
    name: str             # the file name, printable (undecodable bytes as backslash escapes)
    student: str | None   # the normalised ID, or None when the name is refused
    problem: str = ""     # why it will not be graded, if it will not


def printable(name: str) -> str:
    """A file name as text safe to print and store: undecodable bytes and control characters
    (terminal escapes, newlines) as backslash escapes."""
    return plain.printable_text(os.fsencode(name).decode("utf-8", "backslashreplace"),
                                keep_newlines=False)


def student_id(stem: str) -> str:
    """The ID a file name stands for: NFKC-normalised, case-folded, then held to ``SAFE_ID``
    (ASCII letters, digits, ``.``, ``_``, ``-``), so look-alike letters of other scripts are
    refused, not matched to another student's variants. Raises NotGraded."""
    text = printable(stem)
    norm = unicodedata.normalize("NFKC", os.fsencode(stem).decode("utf-8", "replace")).casefold()
    if not SAFE_ID.fullmatch(norm):
        raise NotGraded(f"the file name {text!r} is not a student ID: name submissions by ID "
                        "using letters a-z, digits, '.', '_' or '-' (e.g. alice.ipynb)")
    return norm


def submissions(folder: Path) -> list[Submission]:
    """Every .ipynb or .zip (any case) directly inside ``folder``, sorted by name, each with its
    student ID or the reason it will not be graded (a refused name, a link, a duplicate ID)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions folder {folder} does not exist or is not a folder")
    found = []
    for p in sorted(folder.iterdir(), key=lambda p: os.fsencode(p.name)):
        suffix = os.path.splitext(p.name)[1].lower()
        if suffix not in SUFFIXES:
            print(f"skipped {printable(p.name)}: not a .ipynb or .zip", file=sys.stderr)
            continue
        name, problem, student = printable(p.name), "", None
        try:
            student = student_id(p.name[:-len(suffix)])
        except NotGraded as err:
            problem = str(err)
        if p.is_symlink():
            problem = "a symbolic link: hand in the notebook file itself"
        elif not p.is_file():
            problem = "not a regular file"
        found.append(Submission(p, name, student, problem))
    if not found:
        raise ValueError(f"no .ipynb or .zip submissions in {folder}")
    counts: dict[str, list[str]] = {}
    for s in found:
        if s.student is not None:
            counts.setdefault(s.student, []).append(s.name)
    return [Submission(s.path, s.name, s.student,
                       f"{len(counts[s.student])} files for student {s.student!r} "
                       f"({', '.join(counts[s.student])}): keep one and grade again")
            if s.student is not None and len(counts[s.student]) > 1 and not s.problem else s
            for s in found]


def extract_tests(z: zipfile.ZipFile, folder: Path) -> list[Path]:
    """Write the zip's test files (``tests/*.py``, none deeper) into ``folder``; their paths."""
    paths = []
    for member in z.namelist():
        if member.startswith("tests/") and member.endswith(".py") and "/" not in member[6:]:
            paths.append(folder / member[6:])
            paths[-1].write_bytes(z.read(member))
    return paths


def questions(autograder: Path) -> dict[str, float]:
    """name -> points of every question in the autograder zip (what the CSV's columns are)."""
    from otter.test_files import OKTestFile
    out = {}
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(autograder) as z:
        for path in sorted(extract_tests(z, Path(tmp))):
            tf = OKTestFile.from_file(str(path))
            out[tf.name] = float(tf.possible)
    if not out:
        raise ValueError(f"{autograder} holds no tests/*.py: is it an autograder zip from "
                         "tools/assign.py?")
    return out


def kit_paths() -> tuple[Path, list[Path], dict[str, str]]:
    """(the kit's package folder, folders the sandbox needs read-only, environment) for importing
    the kit as this process would, without importing it here."""
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
    return package, paths, env


def read_submission(path: Path) -> bytes:
    """The notebook's bytes: the file itself (never through a link), or the one notebook at the
    top of an otter export zip. Raises NotGraded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise NotGraded(f"cannot open it ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not os.path.stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise NotGraded("not a regular file")
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotGraded(f"larger than {MAX_NOTEBOOK_BYTES >> 20} MiB")
    if path.name.lower().endswith(".zip"):
        data = _notebook_in_zip(data)
    return data


def _notebook_in_zip(data: bytes) -> bytes:
    import io
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            inner = [i for i in z.infolist() if i.filename.lower().endswith(".ipynb")
                     and "/" not in i.filename]
            if len(inner) != 1:
                raise NotGraded(f"a zip must hold exactly one notebook at its top, found "
                                f"{len(inner)}")
            info = inner[0]
            if info.flag_bits & 0x1:
                raise NotGraded("its notebook is encrypted: hand in the .ipynb itself")
            if info.file_size > MAX_NOTEBOOK_BYTES:
                raise NotGraded(f"its notebook is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB")
            with z.open(info) as f:
                out = f.read(MAX_NOTEBOOK_BYTES + 1)
    except NotGraded:
        raise
    except Exception as err:  # a broken zip, an unknown compression method, a bad CRC
        raise NotGraded(f"not a readable zip ({type(err).__name__}: {err}): hand in the "
                        ".ipynb itself") from None
    if len(out) > MAX_NOTEBOOK_BYTES:
        raise NotGraded(f"its notebook is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB")
    return out


@dataclass(frozen=True)
class TrustedLesson:
    """What stage 2 reads, laid out once per grading run from the autograder zip: the student
    edition tools/assign.py wrote next to the zip, and the zip's tests."""
    lesson: Path                 # <folder>/lesson.ipynb
    tests: Path                  # <folder>/tests/
    declared: dict[str, str]     # answer name -> "value" | "function"
    assignment: str

    @classmethod
    def lay_out(cls, autograder: Path, folder: Path) -> "TrustedLesson":
        with zipfile.ZipFile(autograder) as z:
            config = json.loads(z.read("otter_config.json"))
            (folder / "tests").mkdir(parents=True)
            extract_tests(z, folder / "tests")
        name = config["assignment_name"]
        lesson = autograder.resolve().parent / "student" / f"{name}.ipynb"
        if not lesson.is_file():
            raise ValueError(f"{lesson} is missing: grading runs the student edition that "
                             "tools/assign.py writes next to the autograder zip")
        copy = folder / "lesson.ipynb"
        copy.write_bytes(lesson.read_bytes())
        declared: dict[str, str] = {}
        for cell in json.loads(copy.read_text())["cells"]:
            if "otter_answer_cell" in cell["metadata"].get("tags", []):
                declared.update(declared_answers("".join(cell["source"])))
        if sum(kind == "function" for kind in declared.values()) > MAX_FUNCTION_ANSWERS:
            raise ValueError(f"{name} has more than {MAX_FUNCTION_ANSWERS} function answers")
        return cls(copy, folder / "tests", declared, name)


class Scorer:
    """Stage 2's sandboxed process (tools/grade_stages.py ``scorer``) for one grading worker:
    started once, it imports torch, otter and the kit, then scores each submission in a child
    forked from itself. A process per submission paid those imports every time (~3.5 s of CPU,
    most of stage 2 on a small lesson). Its sandbox sees the trusted lesson and the kit, never a
    submission's files: a submission's answers arrive as plain data in the job message. Between
    jobs it removes what a job left (see ``scorer``).

    A scorer that runs past a job's time, dies, or retires (a job left something it could not
    remove) is replaced by a fresh one as soon as that is known; one found dead when a job is
    handed to it is replaced and the job handed again. Thread-safe: one job at a time."""

    def __init__(self, trusted: TrustedLesson, *, scale: str, limits: sandbox.Limits):
        self.trusted, self.scale, self.limits = trusted, scale, limits
        self._running: sandbox.Running | None = None
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        """Start the scorer unless one is running (its imports overlap a stage 1)."""
        if self._running is not None and self._running.proc.poll() is None:
            return
        self.close(wait=0)
        package, readonly, env = kit_paths()
        env.update(COURSE_SCALE=self.scale)
        # without bwrap its scratch is a folder on this disk: one of its own, so that no two
        # scorers (--jobs, or one started after a kill) share a working folder
        scratch = Path(tempfile.mkdtemp(prefix="scorer_", dir=self.trusted.lesson.parent))
        # the scorer cleans up after a job as a sandbox may (every other process, /tmp) only in
        # a PID namespace other than this one, which it checks itself
        namespace = os.stat("/proc/self/ns/pid").st_ino
        ours, theirs = socket.socketpair()
        try:
            self._running = sandbox.start(
                [sys.executable, str(STAGES), "scorer", str(self.trusted.lesson),
                 str(self.trusted.tests), str(theirs.fileno()), str(namespace)],
                scratch, readonly=readonly + [TOOLS, self.trusted.lesson.parent],
                hidden=[package / "practice_data"], env=env, limits=self.limits,
                pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours

    def score(self, answers: dict, channels: dict[str, tuple[int, int]], student: str, *,
              result_w: int, output_w: int, timeout: float) -> int | None:
        """Score one submission's checked ``answers``; the exit status of its scoring child, or
        None past ``timeout`` seconds. Results go to ``result_w``, the child's output to
        ``output_w`` (both are the caller's to close). Raises RuntimeError if the scorer died
        during the job (a fresh one takes the next)."""
        with self._lock:
            return self._score(answers, channels, student, result_w, output_w, timeout)

    def _score(self, answers, channels, student, result_w, output_w, timeout):
        deadline = time.monotonic() + timeout
        names = list(channels)
        fds = [result_w, output_w] + [fd for name in names for fd in channels[name]]
        job = frame({"student": student, "answers": answers, "channels": names})
        child = None
        try:
            for attempt in (1, 2):  # a scorer found dead before the job went out: once more
                self.start()
                self._socket.settimeout(max(deadline - time.monotonic(), 0.01))
                try:
                    socket.send_fds(self._socket, [b"j"], fds)
                    self._socket.sendall(job)
                    self._socket.settimeout(None)
                    child = int(json.loads(receive(self._socket.fileno(), deadline))["started"])
                    break
                except (BrokenPipeError, ConnectionResetError, EOFError):
                    if attempt == 2:
                        raise
                    self.close(wait=0)
            reply = json.loads(receive(self._socket.fileno(), deadline))
            if reply.get("retiring"):
                self.close()
                self.start()
            return int(reply["returncode"])
        except TimeoutError:
            self._kill_job(child)
            self.close(wait=0)
            self.start()
            return None
        except (OSError, EOFError, ValueError, KeyError, TypeError):
            self._kill_job(child)
            output = self.close(wait=0)
            self.start()
            raise RuntimeError("the scoring process ended before it answered:\n"
                               + output[-3000:]) from None
        except BaseException:  # the reply is still owed: this scorer cannot take another job
            self._kill_job(child)
            self.close(wait=0)
            raise

    def _kill_job(self, child: int | None) -> None:
        """Without bwrap, kill the job's session (the scorer's death takes only the child, by
        PR_SET_PDEATHSIG, not what it started); in bwrap the PID namespace ends with the
        scorer. A session's ID is not handed to a new process while any process of it lives."""
        if child is None or child <= 0 or self._running is None or self._running.isolated:
            return
        try:
            os.killpg(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self, wait: float = 5.0) -> str:
        """Stop the scorer: closing its socket ends it once idle; past ``wait`` seconds it is
        killed, with any job it runs. Returns its own output."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._running is None:
            return ""
        running, self._running = self._running, None
        return running.wait(timeout=wait).output


def _submission_folder(text: bytes, tmp: Path) -> Path:
    """The submission in ``tmp/submission/`` (stage 1 sees only that folder)."""
    mine = tmp / "submission"
    mine.mkdir()
    (mine / "submission.ipynb").write_bytes(text)  # parsed in the sandbox, not here
    return mine / "submission.ipynb"


# --------------------------------------------------------------------------- the trust boundary
# check_answers (tools/grade_stages.py, beside declared_answers, so that the lessons' reference
# grading in notebooks/conftest.py holds answers to their kinds with the same function) checks
# stage 1's claim; what follows reads the stages' pipes.

class _Collect(threading.Thread):
    """Reads one framed message (tools/grade_stages.send) from a pipe, up to ``limit`` bytes."""

    def __init__(self, fd: int, limit: int, deadline: float):
        super().__init__(daemon=True)
        self.fd, self.limit, self.deadline = fd, limit, deadline
        self.data: bytes | None = None
        self.start()

    def run(self):
        try:
            self.data = receive(self.fd, self.deadline, self.limit)
        except (TimeoutError, EOFError, ValueError, OSError):
            self.data = None
        finally:
            os.close(self.fd)


@contextlib.contextmanager
def scorer_for(autograder: Path, *, scale: str, limits: sandbox.Limits = sandbox.Limits()):
    """A Scorer of its own for ``autograder``'s lesson (laid out in a temporary folder), closed on
    leaving: for grading one submission, or a few in a row, outside ``grade_folder``."""
    with tempfile.TemporaryDirectory(prefix="grade_lesson_") as folder:
        scorer = Scorer(TrustedLesson.lay_out(Path(autograder), Path(folder) / "trusted"),
                        scale=scale, limits=limits)
        try:
            yield scorer
        finally:
            scorer.close()


def run_one(submission: Path, autograder: Path, *, timeout: float, scale: str,
            keep: Path | None = None, limits: sandbox.Limits = sandbox.Limits(),
            student: str | None = None, points: dict[str, float] | None = None,
            scorer: Scorer | None = None) -> dict:
    """Grade one submission (every sandbox of it within ``timeout`` seconds); return status,
    scores (question -> (score, points) for the zip's questions), feedback and raw results.
    ``student`` (default: the ID the file name stands for) is the ID the exercise variants are
    drawn for. ``scorer``: a running stage 2 for this zip (grade_folder shares one per worker);
    by default one is started for this submission alone (``scorer_for``). Raises nothing for a bad submission:
    that is an ``error`` result (a failure of the grader's own, such as a scorer that died,
    raises; grade_folder makes it that submission's ``error`` row)."""
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    points = questions(Path(autograder)) if points is None else points
    if scorer is None:
        with scorer_for(autograder, scale=scale, limits=limits) as own:
            return run_one(submission, autograder, timeout=timeout, scale=scale, keep=keep,
                           limits=limits, student=student, points=points, scorer=own)
    if scorer.scale != scale:
        raise ValueError(f"the scorer grades at scale {scorer.scale!r}, not {scale!r}")
    try:
        student = student_id(Path(submission).stem) if student is None else student_id(student)
        return _grade(Path(submission), scorer, timeout=timeout, keep=keep, limits=limits,
                      student=student, points=points)
    except NotGraded as err:
        return failed(STATUS_ERROR, f"not graded: {err}", points)


def failed(status: str, why: str, points: dict[str, float], log: str = "") -> dict:
    why = plain.printable_text(why)  # control characters and lone surrogates, escaped
    return {"status": status, "scores": {q: (0.0, p) for q, p in points.items()}, "raw": None,
            "reason": why.split("\n")[0][:300],
            "feedback": f"{why}\n\n{plain.printable_text(log)}".rstrip() + "\n"}


def _grade(submission: Path, scorer: Scorer, *, timeout: float, keep: Path | None,
           limits: sandbox.Limits, student: str, points: dict[str, float]) -> dict:
    deadline = time.monotonic() + timeout
    trusted = scorer.trusted
    package, readonly, env = kit_paths()
    env.update(COURSE_SCALE=scorer.scale, COURSE_STUDENT_ID=student)
    kernel_env = dict(env, PYTHONPATH=os.pathsep.join([str(KERNEL_SITE), env["PYTHONPATH"]]))
    python = sys.executable
    practice = package / "practice_data"  # the lessons' solutions: not for graded runs

    def left() -> float:
        return max(deadline - time.monotonic(), 0.01)

    def timed_out() -> dict:
        return failed(STATUS_TIMEOUT, f"killed after the {timeout:g} s time limit", points)

    with tempfile.TemporaryDirectory(prefix="grade_") as tmp:
        tmp = Path(tmp)
        nb = _submission_folder(read_submission(submission), tmp)

        # stage 1: the student's notebook; what it hands back comes through a pipe
        read_end, write_end = os.pipe()
        collect = _Collect(read_end, MAX_STAGE1_BYTES, deadline)
        try:
            first = sandbox.run([python, str(STAGES), "execute", str(nb),
                                 json.dumps(list(trusted.declared)), str(write_end),
                                 trusted.assignment], tmp / "stage1",
                                readonly=readonly + [TOOLS, nb.parent], hidden=[practice],
                                env=kernel_env, limits=limits, pass_fds=(write_end,),
                                timeout=left())
        finally:
            os.close(write_end)
        collect.join(timeout=30)
        if first.returncode is None:
            return timed_out()
        try:
            message = plain.parse_json(collect.data or b"")
            if isinstance(message, dict) and isinstance(message.get("refused"), str):
                raise NotGraded(plain.printable_text(message["refused"][:300]))
            if isinstance(message, dict) and set(message) == {"cpu_limit"}:
                return failed(STATUS_TIMEOUT, f"killed at the {limits.cpu_seconds} CPU-second limit "
                              "of its notebook's kernel", points, first.output)
            if len(message["answers"]) > MAX_ANSWERS_CHARS:
                raise NotGraded(f"its answers take more than {MAX_ANSWERS_CHARS >> 20} MiB")
            claim = plain.parse_json(message["answers"])
            executed = message["executed"]
            if not isinstance(executed, str):
                raise TypeError
        except (plain.NotPlainData, KeyError, TypeError):
            return failed(STATUS_ERROR, "the notebook could not be executed "
                          f"(exit status {first.returncode})", points, first.output)
        if keep is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / "executed.ipynb").write_text(executed, errors="backslashreplace")
        values, functions, notes = check_answers(claim, trusted.declared)

        # one sandbox per function answer, without the kit, talking plain data over two pipes
        servers, channels, theirs = [], {}, []
        try:
            for name, bundle in functions.items():
                folder = tmp / "functions" / name
                folder.mkdir(parents=True)
                (folder / "bundle.json").write_text(json.dumps(bundle))
                calls_r, calls_w = os.pipe()
                replies_r, replies_w = os.pipe()
                try:
                    servers.append(sandbox.start(
                        [python, str(STAGES), "serve", str(folder / "bundle.json"), name,
                         str(calls_r), str(replies_w)], tmp / "serve" / name,
                        readonly=[p for p in readonly if p != package] + [TOOLS, folder],
                        hidden=[package], env={"COURSE_STUDENT_ID": student}, limits=limits,
                        pass_fds=(calls_r, replies_w)))
                finally:
                    os.close(calls_r)
                    os.close(replies_w)
                channels[name] = (calls_w, replies_r)
                theirs += [calls_w, replies_r]

            # stage 2: trusted code only, in the scorer; results and output through pipes
            result_r, result_w = os.pipe()
            output_r, output_w = os.pipe()
            collect = _Collect(result_r, MAX_RESULT_BYTES, deadline)
            output = sandbox.Tail(output_r)
            try:
                returncode = scorer.score({"values": values, "notes": notes}, channels, student,
                                          result_w=result_w, output_w=output_w, timeout=left())
            finally:
                os.close(result_w)
                os.close(output_w)
                for fd in theirs:
                    os.close(fd)
                theirs = []
        finally:
            for fd in theirs:
                os.close(fd)
            for server in servers:
                server.kill()
        collect.join(timeout=30)
        output.join(timeout=30)
        if returncode is None:
            return timed_out()
        try:
            raw = plain.parse_json(collect.data or b"")
            scores, tests = results_of(raw, points)
        except (plain.NotPlainData, KeyError, TypeError, ValueError):
            return failed(STATUS_ERROR, "scoring did not produce results "
                          f"(exit status {returncode})", points, output.text())
        raw = {"tests": tests}
        if keep is not None:
            (Path(keep) / "results.json").write_text(json.dumps(raw, indent=1),
                                                     errors="backslashreplace")
    isolation = "" if first.isolated else " WITHOUT A SANDBOX (bubblewrap missing)"
    return {"status": STATUS_OK, "scores": scores, "raw": raw, "reason": "",
            "feedback": f"graded as student {student!r}{isolation} (exercise variants are drawn "
                        f"from this ID)\n\n" + plain.printable_text(feedback_text(raw))}


def results_of(raw, points: dict[str, float]) -> tuple[dict[str, tuple[float, float]], list]:
    """(question -> (score, points), tests for the feedback) from stage 2's results: only the
    zip's questions, each score clamped to [0, its points]; a question missing scores 0."""
    by_name = {t["name"]: t for t in raw["tests"] if isinstance(t, dict) and "name" in t}
    scores, tests = {}, []
    public = by_name.get("Public Tests")
    if isinstance(public, dict):
        tests.append({"name": "Public Tests", "output": str(public.get("output", ""))})
    for q, mx in points.items():
        t = by_name.get(q, {})
        s = t.get("score")
        s = float(s) if type(s) in (int, float) and s == s else 0.0
        s = min(max(s, 0.0), mx)
        scores[q] = (s, mx)
        tests.append({"name": q, "score": s, "max_score": mx,
                      "output": str(t.get("output", "no result for this question"))})
    return scores, tests


def feedback_text(raw: dict) -> str:
    parts = []
    for t in raw["tests"]:
        head = t["name"] if t.get("max_score") is None else \
            f"{t['name']}: {t['score']:g} / {t['max_score']:g}"
        parts.append(f"== {head}\n{t.get('output', '').rstrip()}\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- a folder

class ScoreSheet:
    """scores.csv, one row appended (and flushed to disk) as each submission finishes, so a
    crash or a kill after N submissions leaves N rows; sorted by file name at the end."""

    def __init__(self, path: Path, points: dict[str, float]):
        self.path, self.points = Path(path), points
        self.header = ["submission", "student", "status", *points, "total", "possible", "reason"]
        self.rows: list[list[str]] = []
        self.lock = threading.Lock()
        self._write(self.path, [])

    def row(self, name: str, student: str | None, r: dict) -> list[str]:
        scores = [r["scores"].get(q, (0.0, 0.0))[0] for q in self.points]
        return [_cell(name), student or "", r["status"], *(f"{s:g}" for s in scores),
                f"{sum(scores):g}", f"{sum(self.points.values()):g}", _cell(r.get("reason", ""))]

    def add(self, name: str, student: str | None, r: dict) -> None:
        with self.lock:
            self.rows.append(self.row(name, student, r))
            with open(self.path, "a", newline="", encoding="utf-8", errors="backslashreplace") as f:
                csv.writer(f).writerow(self.rows[-1])
                f.flush()
                os.fsync(f.fileno())

    def finish(self) -> None:
        with self.lock:
            tmp = self.path.with_name(self.path.name + ".tmp")
            self._write(tmp, sorted(self.rows))
            os.replace(tmp, self.path)

    def _write(self, path: Path, rows: list[list[str]]) -> None:
        with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            w = csv.writer(f)
            w.writerow(self.header)
            w.writerows(rows)


def _cell(text: str) -> str:
    """A text cell a spreadsheet shows as text: one starting like a formula gets a quote."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_csv(path: Path, rows: list[tuple[str, dict]], points: dict[str, float]) -> None:
    """All rows at once (one per (file name, result)), columns from ``points``."""
    sheet = ScoreSheet(path, points)
    for name, r in rows:
        sheet.add(name, None, r)
    sheet.finish()


def _slug(sub: Submission) -> str:
    """The submission's folder name under feedback/ and results/: its ID, or for a refused name
    a stable stand-in (``invalid-`` and 8 hex digits of the raw name)."""
    if sub.student is not None:
        return sub.student
    return "invalid-" + hashlib.sha256(os.fsencode(sub.path.name)).hexdigest()[:8]


def grade_folder(autograder: Path, folder: Path, out: Path, *, timeout: float = 600.0,
                 scale: str = "ci", jobs: int = 1, limits: sandbox.Limits = sandbox.Limits(),
                 unsafe_without_sandbox: bool = False) -> Path:
    """Grade every submission in ``folder``, ``jobs`` at a time; return the path of scores.csv.
    One submission's failure is its own ``error`` row: the others are still graded. Without
    bubblewrap it refuses unless ``unsafe_without_sandbox`` (then every feedback says so)."""
    autograder, out = Path(autograder), Path(out)
    if not autograder.is_file() or autograder.suffix != ".zip":
        raise ValueError(f"autograder must be an otter autograder .zip (from tools/assign.py), "
                         f"got {autograder}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    found = submissions(folder)
    points = questions(autograder)
    missing = sandbox.missing_isolation()
    if missing:
        if not unsafe_without_sandbox:
            raise ValueError(f"{missing} To grade anyway, on a machine you can afford to lose, "
                             "pass --unsafe-no-sandbox.")
        bar = "!" * 78
        print(f"{bar}\n{missing}\n{bar}", file=sys.stderr)
    work = tempfile.TemporaryDirectory(prefix="grade_lesson_")
    try:  # a zip without its student edition stops here, before any output is written
        trusted = TrustedLesson.lay_out(autograder, Path(work.name) / "trusted")
        (out / "feedback").mkdir(parents=True, exist_ok=True)
        (out / "results").mkdir(parents=True, exist_ok=True)
    except BaseException:
        work.cleanup()
        raise
    import fcntl
    lock = open(out / ".grading.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        work.cleanup()
        raise ValueError(f"another tools/grade.py is writing to {out}: wait for it or choose "
                         "another --out") from None
    sheet = ScoreSheet(out / "scores.csv", points)
    scorers: queue.SimpleQueue[Scorer] = queue.SimpleQueue()  # one per worker thread

    def grade(sub: Submission) -> None:
        slug = _slug(sub)
        try:
            if sub.problem:
                raise NotGraded(sub.problem)
            scorer = scorers.get()
            try:
                r = run_one(sub.path, autograder, timeout=timeout, scale=scale, limits=limits,
                            keep=out / "results" / slug, student=sub.student, points=points,
                            scorer=scorer)
            finally:
                scorers.put(scorer)
        except NotGraded as err:
            r = failed(STATUS_ERROR, f"not graded: {err}", points)
        except Exception as err:  # a grader bug or a resource failure: this row only
            r = failed(STATUS_ERROR, f"grading failed: {type(err).__name__}: {err}", points,
                       traceback.format_exc())
        (out / "feedback" / f"{slug}.txt").write_text(f"{sub.name}\n{r['feedback']}",
                                                      encoding="utf-8", errors="backslashreplace")
        sheet.add(sub.name, sub.student, r)
        total = sum(s for s, _ in r["scores"].values())
        print(f"{sub.name}: {r['status']}, {total:g} / {sum(points.values()):g}"
              + (f" ({r['reason']})" if r.get("reason") else ""), flush=True)

    started: list[Scorer] = []
    try:
        for _ in range(min(jobs, sum(not s.problem for s in found))):
            started.append(Scorer(trusted, scale=scale, limits=limits))
            scorers.put(started[-1])
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(grade, found))
    finally:
        try:
            for scorer in started:
                scorer.close()
            work.cleanup()
        finally:
            sheet.finish()
            lock.close()
    print(f"wrote {out / 'scores.csv'}")
    return out / "scores.csv"


def _at_least_one(text: str) -> int:
    """argparse type of a count flag: its error names the flag (sandbox.Limits would name its field)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number is needed, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("autograder", type=Path, help="dist/NN_name/NN_name-autograder.zip")
    ap.add_argument("folder", type=Path, help="folder of submitted .ipynb (or .zip) files")
    ap.add_argument("--out", type=Path, default=Path("grades"), help="output folder (grades/)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds allowed per submission (default 600)")
    ap.add_argument("--cpu-seconds", type=_at_least_one, default=sandbox.Limits.cpu_seconds,
                    help="CPU seconds each process of a submission may use (default "
                         f"{sandbox.Limits.cpu_seconds}); a notebook whose kernel spends them is "
                         "a timeout long before --timeout on a busy machine")
    ap.add_argument("--scale", default="ci", help="COURSE_SCALE to grade at (default ci)")
    ap.add_argument("--jobs", type=_at_least_one, default=1, help="submissions graded at once (default 1)")
    ap.add_argument("--scratch-mib", type=_at_least_one, default=sandbox.Limits.scratch_bytes >> 20,
                    help="in-memory scratch space of each sandbox, MiB (default 2048)")
    ap.add_argument("--processes", type=_at_least_one, default=sandbox.Limits.processes,
                    help="processes and threads each sandbox may hold (default 256; a fork bomb "
                         "forks until this cap, lessons 07-10 start a few ranks with their threads)")
    ap.add_argument("--unsafe-no-sandbox", action="store_true",
                    help="grade even without bubblewrap: submissions can then read your files "
                         "and reach the network (see docs/instructor.md)")
    args = ap.parse_args(argv)
    try:
        limits = sandbox.Limits(scratch_bytes=args.scratch_mib * 2**20, processes=args.processes,
                                cpu_seconds=args.cpu_seconds)
        grade_folder(args.autograder, args.folder, args.out, timeout=args.timeout, scale=args.scale,
                     jobs=args.jobs, limits=limits, unsafe_without_sandbox=args.unsafe_no_sandbox)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
