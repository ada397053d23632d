"""The launcher: per-rank results, a failing or killed rank re-raised, timeouts, clear errors."""
import multiprocessing
import time

import pytest
import torch

from course_utils.distributed import WorkerError, launch, torchrun_entry
from course_utils.experiments import data_parallel as demo
import launch_workers


def test_returns_each_ranks_value_after_a_real_all_reduce():
    results = launch(demo.hello_all_reduce, 2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world_size"] == 2 for r in results)  # 1 + 2 on both ranks
    assert results[0]["pid"] != results[1]["pid"]                         # two real processes
    assert results[0]["backend"] == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")


def test_failing_rank_traceback_is_reraised_and_peers_stopped():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(demo.fail_on_rank, 2, 1, timeout=60)
    assert info.value.rank == 1                                  # the root cause, not its victim
    message = str(info.value)
    assert "ValueError: rank 1 found a NaN" in message and "experiments/data_parallel.py" in message  # remote traceback
    assert time.monotonic() - start < 30
    assert not multiprocessing.active_children()


def test_killed_rank_raises_within_timeout_with_that_ranks_error():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(launch_workers.die_on_rank, 2, 1, 2, timeout=30)
    assert info.value.rank == 1
    assert "rank 1 died (killed by SIGKILL)" in str(info.value)
    assert time.monotonic() - start < 30
    assert not multiprocessing.active_children()


def test_timeout_stops_every_rank_and_shows_where_they_hung():
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        launch(launch_workers.hang_on_rank, 2, 1, 600.0, timeout=4)
    elapsed = time.monotonic() - start
    assert 4 <= elapsed < 15
    assert "hang_on_rank" in str(info.value)                     # faulthandler stacks of the ranks
    assert not multiprocessing.active_children()


def _nested_worker(rank, world_size):
    return rank


def test_rejects_what_spawned_ranks_cannot_import():
    def local(rank, world_size):
        return rank
    for bad in (lambda r, w: r, local):
        with pytest.raises(TypeError, match="module-level function"):
            launch(bad, 2)
    with pytest.raises(TypeError, match="needs a function"):
        launch("demo.hello_all_reduce", 2)
    with pytest.raises(ValueError, match="world_size"):
        launch(demo.hello_all_reduce, 0)
    with pytest.raises(ValueError, match="backend"):
        launch(demo.hello_all_reduce, 2, backend="mpi-ish")
    with pytest.raises(ValueError, match="timeout"):
        launch(demo.hello_all_reduce, 2, timeout=-1)
    with pytest.raises(TypeError, match="picklable"):
        launch(demo.hello_all_reduce, 2, lambda: 0)


def test_torchrun_entry_joins_from_environment_and_saves_results(tmp_path, monkeypatch):
    # What torchrun sets; one rank, in this process, so the test needs no extra processes.
    from course_utils.distributed.launcher import free_port
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    result = torchrun_entry.main(["course_utils.experiments.data_parallel:hello_all_reduce",
                                  "--out", str(tmp_path)])
    assert result["sum"] == 1.0 and result["world_size"] == 1
    assert torch.load(tmp_path / "rank0.pt")["rank"] == 0
    with pytest.raises(ValueError, match="module:function"):
        torchrun_entry.resolve("no_colon_here")
