"""tools/gpu_check.py on a machine without a GPU: a clear refusal, a plan, and a CPU smoke run of
the training-script section."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402


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


def test_smoke_runs_a_worker_at_world_size_one_on_cpu(tmp_path):
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


def test_lesson_10_runs_first_and_11_12_are_checked():
    assert gpu_check.LESSONS[0] == "10" and {"11", "12"} <= set(gpu_check.LESSONS)
