"""Distributed training on real torch.distributed (gloo on CPU ranks, NCCL on GPUs).

One launcher for every lesson, and the workers it runs (module-level, so spawn can import them):

- ``launcher``        ``launch(fn, world_size, *args, backend=None, timeout=120)``
- ``data_parallel``   DDP == one process on the concatenated batch; no_sync; SyncBatchNorm; MoCo queue
- ``gather``          all-gather whose backward routes gradients (SimCLR negatives from all ranks)
- ``comm_count``      bytes handed to collectives: a DDP comm hook and a collective counter
- ``sharding``        ZeRO-1 (ZeroRedundancyOptimizer), FSDP2 ``fully_shard``, distributed checkpoint
- ``pipeline``        schedule simulator (GPipe, 1F1B, interleaved, zero-bubble) + a real 2-stage pipeline
- ``tensor_parallel`` Megatron column-then-row MLP
- ``torchrun_entry``  the same workers under ``torchrun --nproc_per_node N``
"""
from course_utils.distributed.launcher import WorkerError, default_backend, launch, worker_device

__all__ = ["launch", "WorkerError", "default_backend", "worker_device"]
