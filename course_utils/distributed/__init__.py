"""Distributed training on real torch.distributed (gloo on CPU ranks, NCCL on GPUs): the mechanisms.

- ``launcher``        ``launch(fn, world_size, *args, backend=None, timeout=120)``
- ``collectives``     differentiable collectives: all-gather / all-reduce with gradients, Megatron f, g
- ``data_parallel``   gradient averaging, cross-rank BatchNorm, SimCLR negatives from all ranks
- ``sharding``        ZeRO predictions; DDP, ZeRO-1 (ZeroRedundancyOptimizer), FSDP2 ``fully_shard``
- ``pipeline``        schedule simulator (GPipe, 1F1B, interleaved, zero-bubble) and stage slicing
- ``pipeline_orders`` hand-written orders run as written: 1F1B, ZB-H1, ZB-H2, DualPipe (DeepSeek-V3)
- ``pipeline_trace``  ``StageTrace``: what a real schedule ran and the activations it held
- ``pipeline_compat`` a torch 2.11 fix that lets ZB-V run under gloo (inert on later torch)
- ``context_parallel`` ring attention: a sequence split across ranks, online softmax, zig-zag split
- ``tensor_parallel`` Megatron column-then-row MLP
- ``torchrun_entry``  any worker under ``torchrun --nproc_per_node N`` (one backend per node)
- ``devices``         ``default_backend`` and ``worker_device``: which backend, which device a rank uses
- ``device_check``    host/device placement simulated on the CPU: ``placement_checked`` for a worker,
                      ``watch_placement`` for a lesson (``COURSE_CHECK_PLACEMENT=1``, set by make test)
- ``train``           the complete training script: ``torchrun --nproc_per_node N -m
                      course_utils.distributed.train`` (DDP or FSDP2, resumes, ``params sha256:``)

The workers the lessons launch are in ``course_utils.experiments`` (one module per lesson);
counting the bytes handed to collectives is the ledger's (``course_utils.ledger.comm_count``).
"""
from course_utils.distributed.launcher import WorkerError, default_backend, launch, worker_device

__all__ = ["launch", "WorkerError", "default_backend", "worker_device"]
