"""Stage 2's scorer (tools/grade.py ``Scorer``): one process per grading worker, one forked child
per submission. What the class run in tests/test_grading_sandbox.py cannot see from its scores: each
child starts from the scorer as it was before any job (no state, file or temporary file of one
submission's scoring reaches the next), with that submission's student ID, and a job past its time
is killed with its scorer, the next job starting a fresh one."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import grade  # noqa: E402
import sandbox  # noqa: E402

LESSON_CELLS = [
    ("import os, sys, tempfile\n"
     "sys.jobs_seen = getattr(sys, 'jobs_seen', 0) + 1  # 1 in every child of a fresh fork\n"
     "folder_before = sorted(os.listdir('.'))\n"
     "isolated = os.getcwd().startswith('/grade/')  # in bwrap: the sandbox's scratch\n"
     "marks = ['/tmp/left_by_a_job', '/dev/shm/left_by_a_job'] if isolated else []\n"
     "def command_of(pid):  # a process may end while the list is read\n"
     "    try:\n"
     "        return open(f'/proc/{pid}/cmdline', 'rb').read()\n"
     "    except OSError:\n"
     "        return b''\n"
     "left_by_earlier = [m for m in marks if os.path.exists(m)] + [\n"
     "    pid for pid in os.listdir('/proc') if pid.isdigit()\n"
     "    and command_of(pid) == b'sleep\\x003601\\x00']\n"
     "for m in marks:\n"
     "    open(m, 'w').write('x')\n"
     "import subprocess  # outside the job's session in a sandbox: only the sweep ends it\n"
     "subprocess.Popen(['sleep', '3601'], start_new_session=isolated)\n"
     "open('left_behind', 'w').write('by an earlier job?')\n"
     "temporary = tempfile.mkstemp()[1]\n"
     "started = open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()[19]\n"
     "print('scorer', f'{os.getppid()}@{started}', 'child', os.getpid(), 'student',"
     " os.environ['COURSE_STUDENT_ID'])", []),
    ("answer = ...", ["otter_answer_cell"]),
    ("import time\n"
     "if answer == 'hang':\n"
     "    time.sleep(600)", []),
]
CHECKS = [">>> sys.jobs_seen\n1\n", ">>> folder_before\n['home', 'tmp']\n",
          ">>> temporary.startswith(os.path.join(os.getcwd(), 'tmp'))\nTrue\n",
          ">>> os.environ['HOME'] == os.path.join(os.getcwd(), 'home')\nTrue\n",
          ">>> left_by_earlier\n[]\n",
          ">>> answer\n42\n"]


def trusted_lesson(folder: Path) -> grade.TrustedLesson:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source, metadata={"tags": tags})
                for source, tags in LESSON_CELLS]
    (folder / "tests").mkdir(parents=True)
    nbformat.write(nb, folder / "lesson.ipynb")
    test = {"name": "q1", "points": 1, "suites": [{
        "cases": [{"code": code, "hidden": False, "locked": False} for code in CHECKS],
        "scored": True, "setup": "", "teardown": "", "type": "doctest"}]}
    (folder / "tests" / "q1.py").write_text(f"OK_FORMAT = True\n\ntest = {test!r}\n")
    return grade.TrustedLesson(folder / "lesson.ipynb", folder / "tests", {"answer": "value"},
                               "scorer_test")


def job(scorer: grade.Scorer, answer, student: str, timeout: float = 60):
    """(exit status or None, results or None, printed output) of one job."""
    result_r, result_w = os.pipe()
    output_r, output_w = os.pipe()
    collect = grade._Collect(result_r, grade.MAX_RESULT_BYTES, time.monotonic() + 120)
    output = sandbox.Tail(output_r)
    try:
        code = scorer.score({"values": {"answer": answer}, "notes": []}, {}, student,
                            result_w=result_w, output_w=output_w, timeout=timeout)
    finally:
        os.close(result_w)
        os.close(output_w)
    collect.join(30)
    output.join(30)
    results = json.loads(collect.data) if collect.data else None
    return code, results, output.text()


def pids(printed: str) -> tuple[str, int, str]:
    """(the scorer as PID@start time, the child's PID, the student ID) a job printed."""
    line = next(ln for ln in printed.splitlines() if ln.startswith("scorer "))
    _, scorer, _, child, _, student = line.split()
    return scorer, int(child), student


@pytest.mark.parametrize("isolated", [True, False], ids=["sandboxed", "unsafe-no-sandbox"])
def test_each_submission_is_scored_in_a_fresh_child_and_a_hung_one_costs_its_scorer(
        isolated, tmp_path, monkeypatch):
    """Without bwrap the scorer cannot clean /tmp or sweep a PID namespace (it has none): only
    its job's session is killed, which is where the lesson's process is started there."""
    if isolated and sandbox.bwrap() is None:
        pytest.skip("bubblewrap (bwrap) missing or unusable")
    if not isolated:
        monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    scorer = grade.Scorer(trusted_lesson(tmp_path / "trusted"), scale="ci",
                          limits=sandbox.Limits(scratch_bytes=64 * 2**20))
    try:
        first, second = job(scorer, 42, "ada"), job(scorer, 42, "linus")
        for code, results, printed in (first, second):
            assert code == 0, printed[-3000:]
            q1 = next(t for t in results["tests"] if t["name"] == "q1")
            assert q1["score"] == pytest.approx(1), q1["output"]  # state, folder and temporary file: fresh
        (scorer1, child1, who1), (scorer2, child2, who2) = pids(first[2]), pids(second[2])
        assert scorer1 == scorer2 and child1 != child2  # one scorer, a child per job
        assert (who1, who2) == ("ada", "linus")

        began = time.monotonic()
        code, results, _ = job(scorer, "hang", "mallory", timeout=3)
        assert code is None and results is None  # past its time: killed, no result
        assert time.monotonic() - began < 20  # killed at its time, not when the sleep ends

        code, results, printed = job(scorer, 41, "bob")  # a fresh scorer takes the next job
        assert code == 0, printed[-3000:]
        q1 = next(t for t in results["tests"] if t["name"] == "q1")
        assert q1["score"] == pytest.approx(1 - 1 / len(CHECKS)), q1["output"]  # fresh again;
        # only the wrong answer fails
        assert pids(printed)[0] != scorer1
    finally:
        scorer.close()


def test_between_jobs_everything_but_the_mounts_is_emptied(tmp_path):
    """grade_stages._empty on a stand-in for the sandbox's /tmp: bwrap's mount points and the
    folders leading to them stay, with anything else inside those folders removed."""
    import grade_stages
    bound = tmp_path / "grade_lesson_x" / "trusted"
    bound.mkdir(parents=True)
    (bound / "lesson.ipynb").write_text("{}")
    (tmp_path / "grade_lesson_x" / "left.txt").write_text("x")
    (tmp_path / "left_folder" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(bound)
    assert grade_stages._empty(tmp_path, {bound}) == []
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "grade_lesson_x", "grade_lesson_x/trusted", "grade_lesson_x/trusted/lesson.ipynb"]


def test_mount_points_are_read_with_their_escapes():
    import grade_stages
    line = "tmpfs /tmp/jos\u00e9\\040x tmpfs rw,nosuid 0 0"
    assert grade_stages._mount_point(line) == Path("/tmp/jos\u00e9 x")
