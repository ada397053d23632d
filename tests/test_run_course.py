"""`make course` (tools/run_course.py) talks to its user: per lesson, as soon as it finishes, its
time, headline figures and executed notebook; on an error, the failing cell; no kernel TCP
warning; build/index.html (tools/course_site.py) linking each lesson's HTML export beside its figures."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import run_course  # noqa: E402


def _lesson(path: Path, *cells: str) -> None:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    params = nbformat.v4.new_code_cell('SCALE = "default"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, *[nbformat.v4.new_code_cell(c) for c in cells]]
    nbformat.write(nb, path)


def test_course_runner_reports_each_lesson_and_writes_an_index(tmp_path, monkeypatch, capfd):
    (tmp_path / "notebooks").mkdir()
    _lesson(tmp_path / "notebooks" / "01_fine.ipynb",
            "from course_utils.report import headline\nheadline(answer=42, scale=SCALE)",
            "from course_utils.scales import scale_reason\nprint('scale line:', scale_reason(SCALE))")
    _lesson(tmp_path / "notebooks" / "02_broken.ipynb", "x = 1", "y = x / 0  # the bad cell")
    monkeypatch.setattr(run_course, "ROOT", tmp_path)
    monkeypatch.setattr(run_course, "BUILD", tmp_path / "build")
    monkeypatch.delenv("COURSE_SCALE", raising=False)
    assert run_course.run("ci", [], jobs=1) == 1
    out, err = capfd.readouterr()
    # the kernel saw the runner's scale in $COURSE_SCALE, so the lesson's scale line credits it,
    # and the runner's own environment is as it was
    executed = nbformat.read(tmp_path / "build" / "01_fine.ipynb", as_version=4)
    assert "scale line: from $COURSE_SCALE" in "".join(o.get("text", "") for c in executed.cells
                                                       for o in c.get("outputs", []))
    assert "COURSE_SCALE" not in run_course.os.environ
    fine = out.index("01_fine done in")
    assert out.index("answer: 42") > fine and out.index("scale: ci") > fine
    assert "-> build/01_fine.ipynb" in out and out.index("answer: 42") < out.index("02_broken")
    assert "FAILED 02_broken" in out and \
        "cell 2 of notebooks/02_broken.ipynb (In [4]: y = x / 0  # the bad cell)" in out
    assert "ZeroDivisionError: division by zero" in out and "build/02_broken.ipynb" in out
    assert "Executing:" in err  # papermill's per-cell progress bar
    assert "without encryption" not in out + err
    index = (tmp_path / "build" / "index.html").read_text()   # the site's landing page
    assert '<a href="01_fine.html">01_fine</a>' in index and "<td>answer</td><td>42</td>" in index
    assert "ZeroDivisionError" in index and "cell 2 of notebooks/02_broken.ipynb" in index
    exported = (tmp_path / "build" / "01_fine.html").read_text()
    assert "answer  42" in exported and "<html" in exported  # the headline table, exported


def test_course_runner_runs_two_lessons_at_once_with_a_thread_each(tmp_path, monkeypatch, capfd):
    (tmp_path / "notebooks").mkdir()
    for name in ("01_one", "02_two"):
        _lesson(tmp_path / "notebooks" / f"{name}.ipynb",
                "import torch\nfrom course_utils.report import headline\n"
                "headline(threads=torch.get_num_threads())")
    monkeypatch.setattr(run_course, "ROOT", tmp_path)
    monkeypatch.setattr(run_course, "BUILD", tmp_path / "build")
    monkeypatch.setattr(run_course, "usable_cores", lambda: 2)
    assert run_course.run("ci", [], jobs=2) == 0
    out, err = capfd.readouterr()
    assert "2 at a time, 1 torch thread(s) each" in out
    assert out.count("threads: 1") == 2, "each kernel ran torch on one thread"
    assert "01_one done in" in out and "02_two done in" in out and "lessons, 2 at a time" in err
    index = (tmp_path / "build" / "index.html").read_text()
    assert index.index("01_one.html") < index.index("02_two.html"), "the index lists lessons in order"
    times = (tmp_path / "build" / "times-ci.json").read_text()
    assert '"01_one"' in times and '"02_two"' in times, "the next run schedules the longest first"


def test_times_of_one_lesson_at_a_time_never_mix_with_the_courses(monkeypatch, tmp_path):
    """On 2 cores `make course` runs two lessons at a time: those times are the ones recorded;
    a --jobs 1 run (each lesson with every core) writes its own file. On a GPU one at a time is
    the course's way."""
    monkeypatch.setattr(run_course, "BUILD", tmp_path)
    monkeypatch.setattr(run_course, "usable_cores", lambda: 2)
    assert run_course.times_file("default", 2) == tmp_path / "times-default.json"
    assert run_course.times_file("default", 1) == tmp_path / "alone-times-default.json"
    assert run_course.times_file("gpu", 1) == tmp_path / "times-gpu.json"
    run_course.record_times([{"name": "02_simclr", "seconds": 239.04}], "default", 1)
    assert not (tmp_path / "times-default.json").exists()
    assert '"02_simclr": 239.0' in (tmp_path / "alone-times-default.json").read_text()
    # a lesson that failed after 22 s keeps its last finished time (it would be scheduled last)
    run_course.record_times([{"name": "02_simclr", "seconds": 22.0, "error": "cell 14 ..."}], "default", 1)
    assert '"02_simclr": 239.0' in (tmp_path / "alone-times-default.json").read_text()


def test_a_cell_ending_in_headline_shows_the_figures_once(capsys):
    """headline returns nothing: Jupyter would otherwise echo its dict under the printed table."""
    from course_utils.report import headline
    assert headline(answer=42) is None
    assert capsys.readouterr().out.count("42") == 1


@pytest.mark.parametrize("name, value, shown", [
    ("activation_bytes_per_image", 83200, "83.2 kB"), ("moco_queue_mb", 34.6, "34.6 MB"),
    ("gpt_fsdp64_resident_gb", 0.1377, "137.7 MB"), ("ledger_flops_16_images", 303587328, "303.6 MFLOP"),
    ("full_recompute_flops_paid", 1.225, "1.225x"), ("in_batch_over_queue_bytes", 604.8, "604.8x"),
    ("probe_simclr", 0.568, "56.8%"), ("probe_gain", 0.368, "+36.8 points"),
    ("colour_probe_gap", -0.055, "-5.5 points"), ("probe_random_init_seed_spread", 0.024, "2.4 points"),
    ("accumulation_update_share", 0.0314, "3.1%"), ("pipeline_peak_alive_1f1b", [2, 1], "2, 1"),
    ("dcp_exact", True, "yes"), ("wire_bytes", 1094912.0, "1.095 MB"), ("gain_points_SimCLR_at_1_gflops", 1.2, "+1.2 points"),
    ("cpu_seconds", 6.719, "6.719 s"), ("shapes_train_images", 10000, "10,000"), ("device", "cpu", "cpu")])
def test_headline_figures_are_shown_with_their_units(name, value, shown):
    from course_utils.report import readable
    assert readable(name, value) == shown


def test_a_fresh_clone_schedules_by_the_committed_times():
    """Without build/times-SCALE.json (a fresh clone) the two workers still start the longest
    lessons first: the order falls back on docs/lesson_times.json, the README's measured times."""
    committed = run_course.committed_times("default")
    lessons = {p.stem for p in (Path(run_course.ROOT) / "notebooks" / "src").glob("[0-9][0-9]_*.py")}
    assert set(committed) == lessons, set(committed) ^ lessons
    assert run_course.committed_times("no such scale") == {}
