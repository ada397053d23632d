"""Grade a folder of submissions without Docker: ``otter run`` per notebook, each in its own
process with a time limit, scores to CSV.

    python tools/grade.py dist/06_memory/06_memory-autograder.zip submissions/06/ \\
        --out grades/06_memory --timeout 600

Writes, under ``--out``:
    scores.csv                  one row per submission: file, status, each question, total, possible
    feedback/<submission>.txt   what each test said (public and hidden), for the instructor
    results/<submission>/       otter's results.json and the executed notebook (executed.ipynb)

``otter grade`` needs Docker; ``otter run`` does not, but it runs the student's code as *you*, in
this environment: do it in a throwaway container or VM account (see docs/instructor.md). The
time limit kills the whole process group (otter and the kernel it started) when it runs out.
Submissions run at ``COURSE_SCALE=ci`` by default: exercise tests must not depend on the scale.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

STATUS_OK, STATUS_TIMEOUT, STATUS_ERROR = "ok", "timeout", "error"


def submissions(folder: Path) -> list[Path]:
    """Notebooks (or otter export zips) directly inside ``folder``, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions folder {folder} does not exist or is not a folder")
    found = sorted(p for p in folder.iterdir() if p.suffix in (".ipynb", ".zip") and p.is_file())
    if not found:
        raise ValueError(f"no .ipynb or .zip submissions in {folder}")
    return found


def run_one(submission: Path, autograder: Path, *, timeout: float, scale: str,
            keep: Path | None = None) -> dict:
    """Grade one submission in a child process (its own process group); return status, scores,
    feedback. With ``keep``, otter's results.json and the executed notebook are written there."""
    with tempfile.TemporaryDirectory(prefix="grade_") as tmp:
        out = Path(keep) if keep is not None else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one",
               str(Path(submission).resolve()), str(Path(autograder).resolve()), str(out.resolve())]
        env = dict(os.environ, COURSE_SCALE=scale, MPLBACKEND="Agg")
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and the kernel it started
            proc.communicate()
            return {"status": STATUS_TIMEOUT, "scores": {}, "raw": None,
                    "feedback": f"killed after the {timeout:g} s time limit"}
        results = out / "results.json"
        if proc.returncode != 0 or not results.exists():
            lines = [l for l in log.strip().splitlines() if l.strip()]
            reason = lines[-1] if lines else f"grading exited with {proc.returncode}"
            return {"status": STATUS_ERROR, "scores": {}, "raw": None,
                    "feedback": f"{reason}\n\n{log}"}
        raw = json.loads(results.read_text())
    return {"status": STATUS_OK, "scores": question_scores(raw), "raw": raw,
            "feedback": feedback_text(raw)}


def _grade_in_this_process(submission: str, autograder: str, out: str) -> None:
    """The child: exactly ``otter run`` (otter.run.main), plus the executed notebook."""
    import nbformat
    from jupyter_client.connect import ConnectionFileMixin
    from otter.run import main as otter_run

    # Talk to the kernel over unix sockets, not TCP ports: with TCP we saw grading hang for good,
    # now and then, on a busy machine where other kernels start at the same time (port races).
    ConnectionFileMixin.class_traits()["transport"].default_value = "ipc"
    results = otter_run(submission, autograder=autograder, output_dir=out, no_logo=True)
    if results.notebook is not None:
        nbformat.write(results.notebook, str(Path(out) / "executed.ipynb"))


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
                 scale: str = "ci") -> Path:
    """Grade every submission in ``folder``; return the path of scores.csv."""
    autograder, out = Path(autograder), Path(out)
    if not autograder.is_file() or autograder.suffix != ".zip":
        raise ValueError(f"autograder must be an otter autograder .zip (from tools/assign.py), "
                         f"got {autograder}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(parents=True, exist_ok=True)
    rows = []
    for sub in submissions(folder):
        keep = out / "results" / sub.stem
        r = run_one(sub, autograder, timeout=timeout, scale=scale, keep=keep)
        (out / "feedback" / f"{sub.stem}.txt").write_text(r["feedback"])
        total = sum(s for s, _ in r["scores"].values())
        print(f"{sub.name}: {r['status']}, {total:g} / {sum(m for _, m in r['scores'].values()):g}")
        rows.append((sub.name, r))
    write_csv(out / "scores.csv", rows)
    print(f"wrote {out / 'scores.csv'}")
    return out / "scores.csv"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:  # child mode, started by run_one
        _grade_in_this_process(*argv[1:4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("autograder", type=Path, help="dist/NN_name/NN_name-autograder.zip")
    ap.add_argument("folder", type=Path, help="folder of submitted .ipynb (or .zip) files")
    ap.add_argument("--out", type=Path, default=Path("grades"), help="output folder (grades/)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds allowed per submission (default 600)")
    ap.add_argument("--scale", default="ci", help="COURSE_SCALE to grade at (default ci)")
    args = ap.parse_args(argv)
    try:
        grade_folder(args.autograder, args.folder, args.out, timeout=args.timeout, scale=args.scale)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
