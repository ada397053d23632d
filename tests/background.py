"""Long runs that start when the suite does and finish beside it, one after another on one thread.

A test module that defines ``start_in_background(tmp: Path)`` gets it called once, in the main
thread after collection (tests/conftest.py), when any of its tests is selected. It does what must
happen in the main thread (otter assign changes the working directory) and returns a function
that does the long part: starting subprocesses and waiting for them (sandboxed kernels, torchrun,
pip). Those functions run one at a time, in the order of ``LANE``, on one background thread;
the module's fixture calls :func:`result`, which waits for its own and returns what it returned
(or raises what it raised). The tests that wait go last (conftest.py sorts them so).

Why: those runs spend their time starting processes and kernels while the rest of the suite uses
about one of the two cores; beside it they cost the suite little wall time. One lane, not one
thread each, so that the grading runs' time limits are not tested against five runs at once.

Under pytest-xdist (``make test`` runs ``-n 2 --dist loadfile``) there is no lane: each of these
modules runs its long part in its own fixture, on the worker its file went to, and the two workers
keep both cores busy. The lane's modules, then the files ``WEIGHT`` lists, go out first.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import pytest

# first started, first needed: the class grading run is the longest
LANE = ("test_grading_sandbox", "test_assignments", "test_distributed_train", "test_wheel",
        "test_gpu_check")

_RUNS = pytest.StashKey[dict]()
_PROCESSES: list[subprocess.Popen] = []
TIMES: dict[str, float] = {}  # module name -> seconds its run took (the suite's summary shows them)


# seconds a file takes at ci scale (its items' durations in a `make test --durations=0` run on 2
# idle cores, 2026-12-05), for xdist's order: the files that take longest start first, so that
# neither worker is left with a long one at the end; unlisted files take under 3 s
WEIGHT = {"test_planner": 49, "test_browser": 23, "test_grade_scorer": 23,
          "11_plan_the_real_run": 22, "test_fake_paper_scale": 19, "05_compute_budget": 18,
          "test_llama": 18, "10_checkpoint_resume": 17, "test_fake_world": 16,
          "07_data_parallel": 16, "test_benchmarks": 14, "03_moco": 11, "02_simclr": 11,
          "13_no_negatives": 10, "12_how_large_a_batch": 9, "test_run_course": 9, "08_sharding": 9,
          "09_pipeline_tensor_parallel": 8, "test_gpu_budget": 8, "test_distributed_launch": 8,
          "04_mae": 7, "test_student_editions": 7, "test_device_placement": 7,
          "06_training_memory": 6, "test_fake_ledger": 6, "01_resource_ledger": 5, "test_site": 5,
          "00_tour": 5, "test_simsiam": 4, "test_distributed_device": 4, "test_docs": 4,
          "test_distributed_pipeline": 4, "test_memory": 3}


def under_xdist() -> bool:
    """Whether this process is an xdist worker (``pytest -n N``)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def order(module_name: str) -> int:
    return LANE.index(module_name) if module_name in LANE else len(LANE)


def popen(*args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen, killed when the suite ends (an interrupted suite leaves nothing behind)."""
    proc = subprocess.Popen(*args, **kwargs)
    _PROCESSES.append(proc)
    return proc


def start(config, work: dict[str, Callable[[], object]]) -> None:
    """Run ``work`` (module name -> function) one at a time, in LANE order, on one thread."""
    futures = {name: Future() for name in work}
    config.stash[_RUNS] = futures

    def lane():
        for name in sorted(work, key=order):
            future = futures[name]
            began = time.monotonic()
            try:
                future.set_result(work[name]())
            except BaseException as err:  # the module's tests report it
                future.set_exception(err)
            TIMES[name] = time.monotonic() - began

    threading.Thread(target=lane, name="background-lane", daemon=True).start()
    config.add_cleanup(lambda: [p.kill() for p in _PROCESSES if p.poll() is None])


def result(request, start: Callable[[Path], Callable[[], object]], folder: str,
           timeout: float = 3600):
    """What the module's background function (``start``, its ``start_in_background``) returned,
    once it has; started here, in this thread, in a fresh ``folder``, when the suite did not start
    it (e.g. a run that deselected it at first)."""
    future = request.config.stash.get(_RUNS, {}).get(start.__module__)
    if future is None:
        return start(request.getfixturevalue("tmp_path_factory").mktemp(folder))()
    return future.result(timeout=timeout)
