"""The experiments that stand on the ledger and the mechanisms: the launchable workers lessons
07-09 run (one module per lesson), lesson 06's measured TinyGPT steps and lesson 11's planner.

Each distributed worker is a module-level function ``fn(rank, world_size, ...)`` so that ``launch`` (and
torchrun, through ``course_utils.distributed.torchrun_entry``) can re-import it in every rank.

- ``toys``                      the shared toy models and batches (settings, make_mlp, make_stack,
                                global_batch, shard, ...)
- ``data_parallel``             lesson 07: the launcher at work; DDP == one large batch; no_sync;
                                bytes; BatchNorm, SimCLR negatives and the MoCo queue across ranks
- ``sharding``                  lesson 08: DDP, ZeRO-1, FSDP2 side by side; distributed checkpoint
- ``pipeline_tensor_parallel``  lesson 09: a real pipeline, a real tensor-parallel MLP, ring attention
- ``gradient_cache``            gradient caching across ranks (tests/test_gradient_cache.py; gpu_check
                                runs it under NCCL)
- ``training_memory``           lesson 06: measure_tinygpt, recompute_tradeoff (the measured side of
                                ``course_utils.memory``'s predictor), nt_xent_kept_bytes (lesson 02)
- ``planning``                  lesson 11: paper-scale runs planned on fake tensors (plan_run,
                                gpt_ledger, ssl_ledger, ledger_lines)

The mechanisms they exercise (and their predictions) are in ``course_utils.distributed``.
"""
