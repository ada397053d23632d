"""tools/gpu_check.py on a machine without a GPU: a clear refusal, a plan, skips that are never
passes, a smoke run of every section (in the background lane) and a run killed mid-way."""
import json
import time
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import background

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402
from kernel_client import SlicedPollKernelManager  # noqa: E402


def test_workers_are_discovered_not_listed_by_hand():
    workers = {w["worker"]: w for w in gpu_check.discover_workers()}
    assert "course_utils.experiments.sharding:checkpoint_roundtrip" in workers
    assert workers["course_utils.experiments.sharding:dcp_save"]["needs"] == ["path"]
    assert all(w["worker"].startswith("course_utils.experiments.") for w in workers.values())
    assert len(workers) >= 10


def test_dry_run_writes_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == "dry-run" and report["ok"] is True
    assert set(report["plan"]) == set(gpu_check.SECTIONS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out",
                           str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "--dry-run" in proc.stderr


def test_smoke_runs_a_worker_on_two_cpu_ranks(tmp_path):
    # the script section's torchrun runs are what tests/test_distributed_train.py checks
    out = tmp_path / "smoke.json"
    assert gpu_check.main(["--smoke", "--only", "workers", "--workers", "hello_all_reduce",
                           "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]["workers"]
    assert [(r["worker"].split(":")[1], r["status"]) for r in rows] == [("hello_all_reduce", "ok")]


def test_unknown_section_is_refused():
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "wrokers", "--dry-run"])


def test_a_check_left_out_for_time_is_not_a_pass(tmp_path):
    """Budget spent before the first worker: every worker is 'skipped: time budget spent', the
    run is incomplete and exits 1; the report on disk says so."""
    out = tmp_path / "r.json"
    assert gpu_check.main(["--smoke", "--only", "workers,benchmark", "--workers", "hello_all_reduce",
                           "--budget", "0", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["ok"] is False and report["complete"] is False and report["finished"] is True
    skipped = report["skipped_for_time"]
    assert len(skipped) == 2 and skipped[0].startswith("workers:") and \
        skipped[0].endswith(":hello_all_reduce") and skipped[1] == "benchmark:benchmark", skipped
    assert report["results"]["benchmark"]["status"] == "skipped"


def test_every_lesson_is_checked_what_has_not_passed_on_a_gpu_first():
    """The recorded GPU runs (benchmarks/gpu_runs/) say which lessons passed at gpu scale; with a
    budget of minutes, every other lesson must come before them (the world where this fails: a
    lesson that crashed on the GPU waits behind ones already known to pass)."""
    assert len(set(gpu_check.LESSONS)) == len(gpu_check.LESSONS) == 14
    passed = set()
    for run in (ROOT / "benchmarks" / "gpu_runs").glob("*_run*.json"):
        for row in json.loads(run.read_text())["results"].get("lessons", []):
            if row["status"] == "ok":
                passed.add(row["lesson"].split("_")[0])
    assert passed, "no recorded GPU run has a passing lesson"
    order = list(gpu_check.LESSONS)
    assert all(order.index(p) > order.index(q) for p in passed for q in order if q not in passed), order


SMOKE = ["--smoke", "--lessons", "00", "--workers", "hello_all_reduce"]


def start_in_background(tmp: Path):
    """The smoke run `make test` makes of the check, in the background lane (tests/background.py):
    every section at toy size on the CPU (gloo, 2 ranks), one lesson (00 at ci, among the quickest; nbval runs all 14
    under the placement check)."""
    def smoke() -> dict:
        out = tmp / "smoke.json"
        proc = background.popen([sys.executable, str(ROOT / "tools" / "gpu_check.py"), *SMOKE,
                                 "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        stdout, stderr = proc.communicate(timeout=400)
        return dict(returncode=proc.returncode, stdout=stdout, stderr=stderr,
                    report=json.loads(out.read_text()) if out.exists() else None)
    return smoke


@pytest.fixture(scope="module")
def smoke(request) -> dict:
    return background.result(request, start_in_background, "gpu_check")


def test_smoke_walks_every_section_and_never_reports_a_skip_as_a_pass(smoke):
    assert smoke["returncode"] == 0, smoke["stdout"][-2000:] + smoke["stderr"][-3000:]
    report = smoke["report"]
    assert set(report["results"]) == set(gpu_check.SECTIONS) and report["finished"] is True
    rows = {name: row for _, name, row in gpu_check._rows(report)}
    assert rows["workers:course_utils.experiments.data_parallel:hello_all_reduce"]["world_size"] == 2
    lesson = rows["lessons:00_tour"]
    assert lesson["status"] == "ok" and lesson["seconds"] > 0
    # the appended cell ran in the lesson's kernel and wrote its CUDA peak: none on a CPU
    assert "max_memory_allocated_bytes" in lesson and lesson["max_memory_allocated_bytes"] is None
    # 00 asks for CIFAR-10, which the check replaces by the embedded shapes where it is not on disk
    from course_utils.data import load_dataset
    assert lesson["stand_ins"] == ([] if _cifar_on_disk(load_dataset) else ["cifar10/train -> shapes"])
    assert rows["script:script"]["status"] == "ok" and rows["benchmark:benchmark"]["status"] == "ok"
    # the lessons not selected are skipped, with why, and counted as such
    skipped = report["skipped"]
    assert {f"lessons:{p}" for p in gpu_check.LESSONS if p != "00"} <= set(skipped)
    assert skipped["lessons:02"] == gpu_check.NOT_SELECTED
    assert all(why for why in skipped.values())
    assert report["counts"]["skipped"] == len(skipped) and report["complete"] is False
    assert f"{len(skipped)} skipped (not passed" in smoke["stdout"]


def test_a_run_killed_mid_way_leaves_what_it_finished(tmp_path):
    """The report is on disk before the first section and after each one: kill the check once the
    workers section is written, during the memory section, and read what it left."""
    import signal
    import time
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--smoke",
                             "--only", "workers,memory,benchmark", "--workers", "hello_all_reduce",
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        report = None
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists():
                report = json.loads(out.read_text())
                if "workers" in report.get("results", {}):
                    break
            time.sleep(0.2)
        assert proc.poll() is None, "the check finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads(out.read_text())
    assert report["finished"] is False and report["complete"] is False
    assert [r["status"] for r in report["results"]["workers"]] == ["ok"]
    assert "benchmark" not in report["results"]


def test_a_dataset_that_cannot_be_downloaded_is_stood_in_for_and_named():
    """The cell gpu_check puts after a lesson's parameters: CIFAR-10 is not on this machine (nor
    on the offline GPU one), so the lesson gets the embedded shapes at its size, and says so."""
    import course_utils.data as data
    original = data.load_dataset
    namespace = {}
    try:
        exec(gpu_check.STAND_IN_CELL, namespace)
        if "cifar10" in data.available_datasets() and _cifar_on_disk(original):
            pytest.skip("CIFAR-10 is on disk here: nothing to stand in for")
        test = data.load_dataset("cifar10", "test", image_size=32, download=False, limit=10000)
    finally:
        data.load_dataset = original
    assert test.name == "shapes" and test.images.shape[1:] == (3, 32, 32)
    assert test.images.shape[0] == len(original("shapes", "test"))   # the limit, clamped
    assert namespace["_stand_ins"] == ["cifar10/test -> shapes"]


def _cifar_on_disk(load) -> bool:
    from course_utils.data import DatasetUnavailableError
    try:
        load("cifar10", "test", limit=1)
        return True
    except DatasetUnavailableError:
        return False


def test_a_lesson_stopped_by_the_budget_is_unfinished_not_failed(tmp_path, monkeypatch):
    """A lesson whose cell hits the limit set by what was left of the budget is reported as
    skipped for time, with how far it got (it did not fail: the world where it is 'failed' sent
    run 3's lesson 05 to the failures); a cell that times out with budget to spare still fails."""
    import papermill

    class CellTimeoutError(TimeoutError):
        pass

    def stopped(*args, **kwargs):
        time.sleep(1.2)   # the cell ran until the budget's end
        raise CellTimeoutError("A cell timed out while it was being executed")

    monkeypatch.setattr(papermill, "execute_notebook", stopped)
    rows = gpu_check.check_lessons("ci", tmp_path, time.monotonic() + 1, ["00"])
    row = next(r for r in rows if r["lesson"].startswith("00_"))
    assert row["status"] == "skipped" and row["why"].startswith(gpu_check.BUDGET_SKIP), row
    assert "cells run" in row["why"] and "measured_over_predicted_t4" not in row
    report = {"results": {"lessons": rows}}
    gpu_check._write(report, tmp_path / "r.json", ok=True, quiet=True)
    assert report["ok"] is False and f"lessons:{row['lesson']}" in report["skipped_for_time"]

    rows = gpu_check.check_lessons("ci", tmp_path, time.monotonic() + 3600, ["00"])
    row = next(r for r in rows if r["lesson"].startswith("00_"))
    assert row["status"] == "failed" and "run again once" in row["retried"], row   # timed out twice

    # a stalled kernel (a cell past the smoke run's cell limit, with budget to spare) is run
    # again once in a fresh kernel; a second run that finishes is a pass that says it was retried
    calls = []

    def stalls_once(*args, **kwargs):
        calls.append(kwargs["execution_timeout"])
        assert kwargs["kernel_manager_class"] is SlicedPollKernelManager   # tools/kernel_client.py
        if len(calls) == 1:
            raise CellTimeoutError("A cell timed out while it was being executed")

    monkeypatch.setattr(papermill, "execute_notebook", stalls_once)
    rows = gpu_check.check_lessons("ci", tmp_path, time.monotonic() + 3600, ["00"], cell_seconds=120)
    row = next(r for r in rows if r["lesson"].startswith("00_"))
    assert row["status"] == "ok" and "run again once" in row["retried"] and calls == [120, 120], (row, calls)
