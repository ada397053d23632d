"""Every worker keeps its tensors, models and batches on ``worker_device()`` (issue 12, item 1).

Under gloo everything is a CPU tensor, so a tensor that never left the host only fails on a
machine with GPUs, under NCCL. ``placement_checked`` simulates the host/device split on the CPU
(factory-made tensors without ``device=`` are marked and the mark propagates), and fails when a
marked tensor reaches a collective, DDP or a PipelineStage.
"""
import pytest
import torch

from course_utils.distributed import WorkerError, launch, launcher, torchrun_entry
from course_utils.distributed.device_check import placement_checked

WORKERS = ["course_utils.experiments.data_parallel:hello_all_reduce",
           "course_utils.experiments.data_parallel:suite",
           "course_utils.experiments.sharding:suite",
           "course_utils.experiments.pipeline_tensor_parallel:suite"]


@pytest.mark.parametrize("worker", WORKERS)
def test_every_worker_keeps_its_tensors_on_the_worker_device(worker):
    launch(placement_checked, 2, worker, timeout=120)


def test_the_check_catches_a_host_tensor_in_a_collective():
    # The world where the check is blind: this would pass, and NCCL would raise on GPUs.
    with pytest.raises(WorkerError, match="dist.all_reduce got a tensor of shape \\(1,\\) on the host"):
        launch(placement_checked, 2, "course_utils.distributed.device_check:host_tensor_example")


def test_torchrun_backend_is_decided_per_node_not_per_local_rank(monkeypatch):
    # 4 ranks on a node with 2 GPUs: every rank must choose gloo (local rank 0 has a GPU, rank 3 not).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for local_rank in range(4):
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        assert torchrun_entry.node_backend() == "gloo"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert torchrun_entry.node_backend() == "nccl" == launcher.default_backend(2)
