"""One grader run over a class, as an instructor would grade it: honest submissions (right, blank,
per-student variants, a file named in capitals), every hostile notebook in tests/fixtures/hostile/
(one per attack, on the 98_sample fixture lesson), a symlinked submission and malformed files,
all in one `tools/grade.py` command. Each attack ends as `timeout`, `error` or the score its real
answers earn (0 for the forgeries), the honest ones are graded right, scores.csv has exactly the
zip's question columns and a row for every file, no secret or host file reaches the grades, and
nothing outside the sandboxes changes."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tools"))
import assign  # noqa: E402
import sandbox  # noqa: E402
from notebooks import render  # noqa: E402
import background  # noqa: E402

needs_bwrap = pytest.mark.skipif(
    sandbox.bwrap() is None,
    reason="bubblewrap (bwrap) missing or unusable: hostile submissions are only contained in "
           "its sandbox; `apt-get install bubblewrap` (.ci/run does)")

SAMPLE = "98_sample"
QUESTIONS = ["q1_param_bytes", "q2_adam_ratio", "q3_variant_resident_bytes"]
VARIANTS = dict(d_in=(8, 16, 24, 32, 48), d_out=(4, 3, 5, 6, 7))  # as in tests/fixtures/98_sample.py
SCRATCH_BYTES = 256 * 2**20  # the sandboxes' in-memory scratch in this run (default 2 GiB)
TIMEOUT = 60  # seconds per submission: an honest one takes about 9 alone, 15 beside the rest of the
# suite, and took over 36 (two killed at once) when its window met the torchrun tests' ranks on a
# slow VM (2026-12-07); the infinite loop burns a core for all of it
PROCESSES = 64  # per sandbox (default 256): the fork bomb forks until the cap, and each fork of a
# kernel that imported torch costs CPU: 40 core-s at 256, 13 at 64 (measured alone); the sample
# lesson's honest submissions need far fewer. The cap contains the bomb the same way at any size

# file name -> what it may end as (status, total). The older hostile notebooks answer alice's first
# two questions (3 points) or nothing; each newer one says its real answers in its first cell.
EXPECTED = {
    "infinite_loop.ipynb": {("timeout", 0)},
    "fork_bomb.ipynb": {("timeout", 0), ("error", 0), ("ok", 3)},
    "memory_10gb.ipynb": {("ok", 3)},
    "write_outside.ipynb": {("ok", 3)},
    "steal_secrets.ipynb": {("ok", 3)},
    "network.ipynb": {("ok", 3)},
    "rewrite_grades.ipynb": {("ok", 0)},
    "fake_results.ipynb": {("ok", 0)},
    "monkeypatch.ipynb": {("ok", 0)},
    # code in the trusted stage: each forged full marks before
    "default_argument.ipynb": {("ok", 1)},
    "builtin_shadow.ipynb": {("ok", 1)},
    "forging_function.ipynb": {("ok", 0)},
    # objects that lie
    "lying_tensor.ipynb": {("ok", 2)},
    "fake_ref.ipynb": {("ok", 1)},
    # filesystem
    "planted_symlink.ipynb": {("ok", 2)},
    "disk_fill.ipynb": {("ok", 2)},
    "escape_namespaces.ipynb": {("ok", 2)},   # the keyring and nested user namespaces
    "mallory.ipynb": {("error", 0)},          # a symlink to the solutions notebook
    # malformed files: each its own error row
    "lone_surrogate.ipynb": {("ok", 1)},
    "deep.ipynb": {("error", 0)},             # JSON nested 100,000 deep
    " .ipynb": {("error", 0)},                # no ID
    "encrypted.zip": {("error", 0)},
    "odd_compression.zip": {("error", 0)},
    "\\xff\\xfe.ipynb": {("error", 0)},        # a file name that is not UTF-8
    "dup.ipynb": {("error", 0)},              # dup.ipynb and dup.zip: one ID, two files
    "dup.zip": {("error", 0)},
    "zoe.ipynb": {("error", 0)},              # a notebook of another lesson
    # honest
    "alice_correct.ipynb": {("ok", 4)},
    "bob_blank.ipynb": {("ok", 0)},
    "Carol.IPYNB": {("ok", 4)},               # graded as 'carol', suffix in capitals
    "ada.ipynb": {("ok", 1)},                 # typed q3 answers of their own variant
    "barbara.ipynb": {("ok", 1)},
    "linus.ipynb": {("ok", 0)},               # ada's number handed in under linus's name
}


def tree_digest(folder: Path, content: bool) -> dict[str, tuple]:
    """path -> (size, mtime, mode[, sha256]) of everything under ``folder`` but __pycache__."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if content and p.is_file() \
            and not p.is_symlink() else None
        out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns, st.st_mode, digest)
    return out


class Listener:
    """A TCP server on 127.0.0.1 that records every connection it accepts."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.accepted.append(conn.recv(100))
                except OSError:
                    self.accepted.append(b"")


def variant_answer(student: str) -> int:
    from course_utils.variants import exercise_variant
    v = exercise_variant(SAMPLE, student, **VARIANTS)
    return 16 * (v.d_in * v.d_out + v.d_out)


def zip_bytes(notebook: bytes, *, encrypted: bool = False, method: int | None = None) -> bytes:
    """An otter-style export zip; ``encrypted`` sets the encryption flag, ``method`` writes an
    unknown compression method number into the headers (zipfile can write neither)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("submission.ipynb", notebook)
    data = bytearray(buf.getvalue())
    for sig, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        i = data.find(sig)
        if encrypted:
            data[i + flags_at] |= 0x1
        if method is not None:
            data[i + flags_at + 2:i + flags_at + 4] = method.to_bytes(2, "little")
    return bytes(data)


def class_folder(folder: Path, dist: Path, student: dict, port: int, canary: Path) -> None:
    """Every submission of the run, written into ``folder``."""
    for p in [*(FIXTURES / "hostile").glob("*.ipynb"), *(FIXTURES / "submissions").glob("*.ipynb")]:
        text = p.read_text().replace("__PORT__", str(port)).replace("__CANARY__", str(canary))
        (folder / p.name).write_text(text)
    alice = (FIXTURES / "submissions" / "alice_correct.ipynb").read_bytes()
    (folder / "Carol.IPYNB").write_bytes(alice)
    (folder / "mallory.ipynb").symlink_to(dist / "autograder" / f"{SAMPLE}.ipynb")
    (folder / "deep.ipynb").write_text('{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (folder / " .ipynb").write_bytes(alice)
    (folder / "encrypted.zip").write_bytes(zip_bytes(alice, encrypted=True))
    (folder / "odd_compression.zip").write_bytes(zip_bytes(alice, method=97))
    with open(os.open(os.path.join(os.fsencode(folder), b"\xff\xfe.ipynb"),
                      os.O_WRONLY | os.O_CREAT, 0o644), "wb") as f:
        f.write(alice)
    (folder / "dup.ipynb").write_bytes(alice)
    (folder / "dup.zip").write_bytes(zip_bytes(alice))
    other = json.loads(alice)
    other["metadata"]["otter"]["assignment_name"] = "03_moco"
    (folder / "zoe.ipynb").write_text(json.dumps(other))
    handed_in = {"ada": variant_answer("ada"), "barbara": variant_answer("barbara"),
                 "linus": variant_answer("ada")}
    for name, value in handed_in.items():
        nb = json.loads(json.dumps(student))
        for cell in nb["cells"]:
            if "otter_answer_cell" in cell["metadata"].get("tags", []) and \
                    "variant_resident_bytes" in "".join(cell["source"]):
                cell["source"] = f"variant_resident_bytes = {value}"
        (folder / f"{name}.ipynb").write_text(json.dumps(nb))


def watched_root() -> dict[str, tuple]:
    """The repository's tracked files, as tree_digest gives them (mtime, no content): the rest of
    the suite runs beside the class run and writes its own caches (data/, build/) into the
    repository, which the sandboxes only ever see read-only."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:  # not a git checkout: everything but the caches
        skip = {"data", "build", ".venv", "dist"}
        files = [p for p in ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                 and not skip & set(p.relative_to(ROOT).parts[:1])]
    else:
        files = [ROOT / f for f in listed.stdout.decode().split("\0") if f]
    return {str(p.relative_to(ROOT)): (st.st_size, st.st_mtime_ns, st.st_mode)
            for p in files if (st := p.lstat())}


def start_in_background(tmp: Path):
    """Prepare the class (otter assign: in the main thread) and plant the instructor's secrets;
    return the function that grades it with the instructor's one command (tests/background.py).
    None without bubblewrap (every test here then skips and says why)."""
    if sandbox.bwrap() is None:
        return None
    lesson = tmp / f"{SAMPLE}.ipynb"
    lesson.write_text(render(FIXTURES / f"{SAMPLE}.py"))
    dist = assign.assign(lesson, tmp / "dist", run_tests=False, quiet=True)
    zip_path = dist / f"{SAMPLE}-autograder.zip"
    student = json.loads((dist / "student" / f"{SAMPLE}.ipynb").read_text())

    listener = Listener()
    canary_text = "canary-" + secrets.token_hex(16)
    canary = tmp / "host_canary.txt"
    canary.write_text(canary_text)
    folder = tmp / "submissions"
    folder.mkdir()
    class_folder(folder, dist, student, listener.port, canary)

    # the instructor's secrets: a file in a (fake) home and an environment variable
    home = tmp / "home"
    home.mkdir()
    token = secrets.token_hex(16)
    (home / ".canary_secret").write_text(canary_text)
    previous = tmp / "grades" / "00_previous"
    previous.mkdir(parents=True)
    (previous / "scores.csv").write_text("submission,status,total,possible\nx.ipynb,ok,3,3\n")
    out = tmp / "grades" / "98"
    run = dict(out=out, folder=folder, canary=canary_text, token=token, listener=listener,
               watched={home: True, folder: True, dist: True, previous: True,
                        Path(sys.prefix): False})
    command = [sys.executable, str(ROOT / "tools" / "grade.py"), str(zip_path), str(folder),
               "--out", str(out), "--timeout", str(TIMEOUT), "--jobs", "2",
               "--processes", str(PROCESSES),
               "--scratch-mib", str(SCRATCH_BYTES >> 20)]
    env = dict(os.environ, HOME=str(home), GRADER_SECRET_TOKEN=token)
    return lambda: grade_the_class(run, command, env)


def grade_the_class(run: dict, command: list[str], env: dict) -> dict:
    """Run the grader over the class; what the tests read, with what changed outside."""
    watched = run["watched"]
    before = {f: tree_digest(f, c) for f, c in watched.items()}
    before[ROOT] = watched_root()
    proc = background.popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    stdout, stderr = proc.communicate(timeout=1800)
    after = {f: tree_digest(f, c) for f, c in watched.items()}
    after[ROOT] = watched_root()
    with open(run["out"] / "scores.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, {r["submission"]: r for r in reader}
    return dict(run, returncode=proc.returncode, stdout=stdout, stderr=stderr,
                header=header, rows=rows,
                changed={str(f): sorted(k for k in set(before[f]) | set(after[f])
                                        if before[f].get(k) != after[f].get(k))[:10]
                         for f in before if after[f] != before[f]})


@pytest.fixture(scope="module")
def class_run(request):
    """The class run the suite started in the background (tests/background.py)."""
    run = background.result(request, start_in_background, "class")
    names = {os.fsencode(p.name).decode("utf-8", "backslashreplace")
             for p in run["folder"].iterdir()}
    assert names == set(EXPECTED), names ^ set(EXPECTED)
    assert len({variant_answer(s) for s in ("ada", "barbara", "linus")}) == 3
    return run


@needs_bwrap
def test_every_file_gets_the_score_its_real_answers_earn(class_run):
    rows = class_run["rows"]
    assert class_run["returncode"] == 0, class_run["stdout"][-3000:] + class_run["stderr"][-3000:]
    got = {name: (r["status"], float(r["total"])) for name, r in rows.items()}
    wrong = {n: g for n, g in got.items() if g not in EXPECTED.get(n, ())}
    assert not wrong and set(got) == set(EXPECTED), f"expected {EXPECTED}, got {got}"
    assert rows["Carol.IPYNB"]["student"] == "carol"
    # every error row says why
    assert all(r["reason"] for r in rows.values() if r["status"] == "error")


@needs_bwrap
def test_the_columns_are_the_zips(class_run):
    """Names and points come from the autograder zip: a forged record cannot add a question
    (forging_function writes q9_bonus) or change what is possible."""
    assert class_run["header"] == ["submission", "student", "status", *QUESTIONS, "total",
                                   "possible", "reason"]
    rows = class_run["rows"].values()
    assert all(float(r["possible"]) == 4 for r in rows)
    assert all(0 <= float(r[q]) <= p for r in rows for q, p in zip(QUESTIONS, (1, 2, 1)))


@needs_bwrap
def test_nothing_leaks_and_nothing_outside_changes(class_run):
    assert not class_run["listener"].accepted, \
        f"a submission reached 127.0.0.1: {class_run['listener'].accepted}"
    assert not class_run["changed"], f"{class_run['changed']} changed during grading"
    out = class_run["out"]
    for where in [class_run["stdout"], class_run["stderr"]] + [p.read_text(errors="replace")
                                                for p in out.rglob("*") if p.is_file()]:
        assert class_run["canary"] not in where and class_run["token"] not in where, \
            "a secret or a host file reached the grades"
    assert not any(p.is_symlink() for p in out.rglob("*"))
    # the stolen-secret notebook did run (its loot, printed, is in the executed notebook)
    assert "HOME" in (out / "results" / "steal_secrets" / "executed.ipynb").read_text()
    # the disk filled up to the in-memory scratch's cap, not the grader's disk
    executed = (out / "results" / "disk_fill" / "executed.ipynb").read_text()
    filled = int(executed.split("disk full after ")[1].split(" bytes")[0])
    assert 0 < filled <= SCRATCH_BYTES
    # the seccomp filter: no keyring (EPERM: -1), no user namespace inside the sandbox
    executed = (out / "results" / "escape_namespaces" / "executed.ipynb").read_text()
    assert "keyring id: -1; nested user namespace exit status: 1" in executed, executed[-2000:]
    # graded runs see the kit without its practice solutions (exercises.reveal's source)
    assert "practice solutions readable: 0" in executed, executed[-2000:]


@needs_bwrap
def test_feedback_says_why_and_never_the_expected_value(class_run):
    out, rows = class_run["out"], class_run["rows"]
    feedback = {p.stem: p.read_text(encoding="utf-8") for p in (out / "feedback").iterdir()}
    assert "should be a value" in feedback["default_argument"]
    assert "not plain data" in feedback["fake_ref"]
    assert "\\ud800" in feedback["lone_surrogate"]
    assert "symbolic link" in rows["mallory.ipynb"]["reason"]
    assert "2 files for student 'dup'" in rows["dup.zip"]["reason"]
    assert "encrypted" in rows["encrypted.zip"]["reason"]
    assert "not a student ID" in rows["\\xff\\xfe.ipynb"]["reason"]
    assert "another lesson" in rows["zoe.ipynb"]["reason"]
    assert "could not be executed" in rows["deep.ipynb"]["reason"]
    # linus handed in ada's number for his own variant: told he is wrong, never the right number
    text = feedback["linus"]
    assert "graded as student 'linus'" in text and "q3_variant_resident_bytes: 0 / 1" in text
    right = variant_answer("linus")
    for shown in {str(right), f"{right:,}", f"{right:g}", f"{float(right):.6g}", f"{right:.4e}"}:
        assert shown not in text, f"linus's feedback reveals the expected {shown}"


# What the distributed lessons (07-10) need inside the sandbox, without torch (seconds): a lock
# in /dev/shm (multiprocessing), and a TCP rendezvous at the sandbox's own hostname, which is how
# `torchrun --standalone` advertises its c10d store (with an unresolvable hostname lesson 10's
# torchrun cell retried for 900 s and grading hung).
PROCESS_GROUP_PROBE = """
import multiprocessing, socket
multiprocessing.Lock()
host = socket.gethostname()
server = socket.create_server(("", 0), family=socket.AF_INET)
with socket.create_connection((host, server.getsockname()[1]), timeout=5):
    print("rendezvous at", host, socket.gethostbyname(host))
"""


@needs_bwrap
def test_sandbox_allows_local_process_groups(tmp_path):
    out = sandbox.run([sys.executable, "-c", PROCESS_GROUP_PROBE], tmp_path / "scratch", timeout=60)
    assert out.isolated and out.returncode == 0, f"probe failed in the sandbox:\n{out.output}"
    assert f"rendezvous at {sandbox.HOSTNAME} 127.0.0.1" in out.output, out.output


BUSY = """import os, sys
os.fork()              # two processes, each burning a core until the timeout
while True:
    pass
"""


@needs_bwrap
def test_a_busy_command_and_its_children_die_at_the_timeout(tmp_path):
    """What the class run's infinite loop does not show, since it sleeps to cost the suite no CPU:
    a command that burns a core, and a child it forked that burns another, are both killed when
    the timeout passes, and nothing of theirs is left running."""
    marker = "busy-" + secrets.token_hex(8)   # in both processes' command lines
    began = time.monotonic()
    out = sandbox.run([sys.executable, "-c", BUSY, marker], tmp_path / "scratch", timeout=2)
    took = time.monotonic() - began
    assert out.isolated and out.returncode is None, out
    assert 2 <= took < 15, took
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, marker)]
    assert not left, f"still running after the kill: {left}"


def _cmdline_has(proc: Path, marker: str) -> bool:
    try:
        return marker.encode() in (proc / "cmdline").read_bytes()
    except OSError:   # it ended while we looked
        return False
