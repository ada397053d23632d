"""Run any ``launch`` worker under torchrun instead (several GPUs, several nodes, a cluster).

    torchrun --nproc_per_node 2 -m course_utils.distributed.torchrun_entry \\
        course_utils.experiments.data_parallel:ddp_equivalence --cfg '{"steps": 3}' --out results/

torchrun starts the processes and sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / LOCAL_RANK;
this entry joins the process group from those (``env://``), calls ``fn(rank, world_size, cfg)``
(or ``fn(rank, world_size)`` without ``--cfg``), prints rank 0's result and, with ``--out``, saves
every rank's result as ``rank{r}.pt``. Backend: ``--backend``, or NCCL when every local rank of
this node has its own GPU (LOCAL_WORLD_SIZE <= GPUs), else gloo; the ranks then check that they
all chose the same one, since a group whose ranks disagree cannot even form.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import pprint
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.distributed.devices import default_backend
from course_utils.distributed.launcher import to_cpu


def resolve(spec: str):
    """'package.module:function' -> the function."""
    module, sep, name = spec.partition(":")
    if not sep or not name:
        raise ValueError(f"worker must be written module:function, got {spec!r} "
                         "(e.g. course_utils.experiments.data_parallel:hello_all_reduce)")
    return getattr(importlib.import_module(module), name)


def node_backend() -> str:
    """One answer for every rank of this node: NCCL only if *each* local rank gets its own GPU.

    (Deciding per local rank, "do I have a GPU?", would let rank 0 pick NCCL and rank 3 gloo on a
    node with 2 GPUs and 4 ranks.)"""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    return default_backend(local_world)


def check_same_backend(backend: str) -> None:
    """Fail clearly (not with a hang) if nodes chose different backends: gather every rank's choice
    through a side channel (the rendezvous store) and compare."""
    store = dist.distributed_c10d._get_default_store()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    store.set(f"course_backend/{rank}", backend)
    chosen = {store.get(f"course_backend/{r}").decode() for r in range(world_size)}
    if len(chosen) > 1:
        raise RuntimeError(f"ranks chose different backends {sorted(chosen)}: pass --backend "
                           "explicitly (nodes differ in their GPUs)")


def main(argv: list[str] | None = None) -> object:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("worker", help="module:function taking (rank, world_size[, cfg])")
    parser.add_argument("--cfg", default=None, help="JSON dict passed as the worker's cfg")
    parser.add_argument("--out", default=None, help="folder for rank{r}.pt result files")
    parser.add_argument("--timeout", type=float, default=600, help="collective timeout, seconds")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: nccl when every local rank has a GPU, else gloo")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run me under torchrun (RANK/WORLD_SIZE unset), or use "
                         "course_utils.distributed.launch from Python")
    fn = resolve(args.worker)
    backend = args.backend or node_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    check_same_backend(backend)
    extra = (json.loads(args.cfg),) if args.cfg else ()
    result = to_cpu(fn(rank, world_size, *extra))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        torch.save(result, Path(args.out) / f"rank{rank}.pt")
    if rank == 0:
        pprint.pprint(result)
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
