"""Hostile submissions (tests/fixtures/hostile/, one per attack, on the 98_sample fixture lesson)
graded together with an honest right and blank one by tools/grade.py: each attack ends as
`timeout`, `error` or the score its real answers earn, the honest ones are graded right, no
secret reaches the grades, and nothing outside the sandboxes' scratch folders changes."""
from __future__ import annotations

import csv
import hashlib
import os
import secrets
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tools"))
import assign  # noqa: E402
import grade  # noqa: E402
import sandbox  # noqa: E402
from notebooks import render  # noqa: E402

needs_bwrap = pytest.mark.skipif(
    sandbox.bwrap() is None,
    reason="bubblewrap (bwrap) missing or unusable: hostile submissions are only contained in "
           "its sandbox; `apt-get install bubblewrap` (.ci/run does)")

# what each hostile notebook may end as: its real answers are those of alice's first two questions
# (3 points; the hostile notebooks predate the sample's third, per-student question) or bob's (0)
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
    "alice_correct.ipynb": {("ok", 4)},
    "bob_blank.ipynb": {("ok", 0)},
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


@needs_bwrap
def test_hostile_submissions_are_contained(tmp_path, monkeypatch, capsys):
    lesson = tmp_path / "98_sample.ipynb"
    lesson.write_text(render(FIXTURES / "98_sample.py"))
    dist = assign.assign(lesson, tmp_path / "dist", run_tests=False, quiet=True)
    zip_path = dist / "98_sample-autograder.zip"

    listener = Listener()
    folder = tmp_path / "submissions"
    folder.mkdir()
    for p in [*(FIXTURES / "hostile").glob("*.ipynb"), *(FIXTURES / "submissions").glob("*.ipynb")]:
        shutil.copy(p, folder / p.name)
    net = folder / "network.ipynb"
    net.write_text(net.read_text().replace("__PORT__", str(listener.port)))
    assert set(EXPECTED) == {p.name for p in folder.iterdir()}

    # the instructor's secrets: a file in a (fake) home and an environment variable
    home = tmp_path / "home"
    home.mkdir()
    canary, token = secrets.token_hex(16), secrets.token_hex(16)
    (home / ".canary_secret").write_text(canary)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GRADER_SECRET_TOKEN", token)
    previous = tmp_path / "grades" / "00_previous"
    previous.mkdir(parents=True)
    (previous / "scores.csv").write_text("submission,status,total,possible\nx.ipynb,ok,3,3\n")

    watched = {home: True, folder: True, dist: True, previous: True, ROOT: False,
               Path(sys.prefix): False}
    before = {f: tree_digest(f, c) for f, c in watched.items()}
    out = tmp_path / "grades" / "98"
    grade.grade_folder(zip_path, folder, out, timeout=120, jobs=2)
    printed = capsys.readouterr()

    rows = {r["submission"]: r for r in csv.DictReader(open(out / "scores.csv"))}
    got = {name: (r["status"], float(r["total"])) for name, r in rows.items()}
    wrong = {n: g for n, g in got.items() if g not in EXPECTED[n]}
    assert not wrong, f"expected {EXPECTED}, got {got}"
    assert all(float(r["possible"]) == 4 for r in rows.values())

    assert not listener.accepted, f"a submission reached 127.0.0.1: {listener.accepted}"
    for f in watched:
        assert tree_digest(f, watched[f]) == before[f], f"{f} changed during grading"
    for where in [printed.out, printed.err] + [p.read_text(errors="replace")
                                                for p in out.rglob("*") if p.is_file()]:
        assert canary not in where and token not in where, "a secret reached the grades"
    # the stolen-secret notebook did run (its loot, printed, is in the executed notebook)
    assert "HOME" in (out / "results" / "steal_secrets" / "executed.ipynb").read_text()


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
