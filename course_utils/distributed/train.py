"""One small, complete distributed training script: DDP or FSDP2, gloo on CPU or NCCL on GPUs,
distributed checkpoints, and a resume that gives the same final weights bit for bit.

    torchrun --nproc_per_node 2 -m course_utils.distributed.train --steps 40 \\
        --checkpoint-dir ckpt --checkpoint-every 10 [--strategy fsdp]
    torchrun --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        --rdzv-id RUN -m course_utils.distributed.train ...          (once on each node)
    torchrun --nproc_per_node 2 --max-restarts 1 -m course_utils.distributed.train \\
        --checkpoint-dir ckpt --checkpoint-every 10 --crash-at-step 25 --crash-rank 1

What it does, in the order a reader meets it below:

1. ``join_group``: torchrun sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; the script joins
   the group through that rendezvous store, prefixed by the attempt (see the note there), with
   NCCL when every rank on the node has a GPU, else gloo. Without torchrun it runs as one process.
2. ``make_data``: scikit-learn's 8×8 digits (shipped with the kit), split over the ranks by a
   ``DistributedSampler``; ``sampler.set_epoch(epoch)`` reshuffles every epoch, identically on
   every rank, so the ranks' shards never overlap.
3. ``build``: a small MLP with dropout, wrapped in ``DistributedDataParallel`` (gradients
   all-reduced) or sharded with FSDP2 ``fully_shard`` (parameters, gradients and AdamW state split
   over the ranks); AdamW and a cosine learning-rate schedule.
4. The loop: every step adds noise to the inputs and draws dropout masks from this rank's RNG.
5. ``save_checkpoint`` / ``load_checkpoint``: ``torch.distributed.checkpoint`` writes the model and
   optimizer (each rank its own shards), and every rank writes what is its own alone (its RNG, the
   schedule, the data position) to ``rank{r}.pt``. A checkpoint is written into a ``.partial``
   folder that rank 0 renames only once every rank has finished, so a crash mid-save leaves the
   previous checkpoint as the newest. ``--checkpoint-dir`` must be one folder every node can read
   and write (a shared file system) when the run spans several nodes.
6. ``--crash-at-step K --crash-rank R``: rank R kills itself (SIGKILL, no clean-up) just before
   step K, on the first attempt only; ``torchrun --max-restarts 1`` restarts the whole group, which
   resumes from the newest checkpoint and prints ``resumed from step N``.
7. The last line rank 0 prints is ``params sha256: <hex>`` of the final parameters: the same
   arguments give the same hex however the run was interrupted and resumed, and for the same
   world size on one node or several.
8. Resuming on another number of ranks, the global ``--batch`` kept: DCP reshards the model and
   optimizer, the schedule and data position are every rank's alike (the sampler's global batch
   i is the same examples at any world size: positions i·B to (i+1)·B of the epoch's
   permutation), and the run continues. What cannot follow is each rank's own RNG stream (the
   input noise, the dropout masks): the new ranks draw from new seeds, so the continuation is
   another random draw, not the uninterrupted run. With ``--noise 0 --dropout 0`` nothing random
   is left, and in ``--dtype float64`` the resumed run ends equal to the uninterrupted one up to
   summation order (tested within 1e-12). ``--stop-after K`` leaves cleanly after step K (a
   preemption; with ``--checkpoint-dir`` it saves first); ``--final-weights PATH`` writes the
   full final parameters (rank 0, ``torch.save``) for such comparisons.

Why its data and checkpoints are not the lessons' (``Batches``, ``checkpoint.CheckpointManager``):
this is the script a reader would run under torchrun, so it uses what torch gives every such
script, ``DistributedSampler`` (each rank's share of an epoch, reshuffled by ``set_epoch``) and
DCP folders written by every rank at once; the lessons' batch source and checkpoint manager are
single-process, one file per checkpoint. The optimizer is a row of the kit's one table
(``course_utils.optim``).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.distributed.fsdp import fully_shard

from course_utils import checkpoint as ck
from course_utils.checkpoint import rng_state, set_rng_state
from course_utils.data import load_dataset
from course_utils.optim import make_optimizer


HASH_PREFIX = "params sha256: "
RESUME_PREFIX = "resumed from step "


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun --nproc_per_node N -m course_utils.distributed.train",
                                description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps in the whole run")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                   help="DistributedDataParallel, or FSDP2 fully_shard (ZeRO-3)")
    p.add_argument("--batch", type=int, default=32, help="global batch (split over the ranks)")
    p.add_argument("--hidden", type=int, default=64, help="width of the MLP's hidden layers")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (cosine decay)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.05, help="std of the input noise (0: none)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout probability (0: none)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--stop-after", type=int, default=None,
                   help="leave cleanly after step K (saving first with --checkpoint-dir): a preemption")
    p.add_argument("--final-weights", default=None, help="rank 0 saves the full final parameters here")
    p.add_argument("--checkpoint-dir", default=None,
                   help="shared folder: resume from its newest checkpoint, write new ones there")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep")
    p.add_argument("--crash-at-step", type=int, default=None,
                   help="kill --crash-rank just before step K (first attempt only)")
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--timeout", type=float, default=120, help="seconds a collective may wait")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "hidden", "keep"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.checkpoint_every < 0:
        p.error("--checkpoint-every must be >= 0 (0 disables checkpoints)")
    if args.checkpoint_every and not args.checkpoint_dir:
        p.error("--checkpoint-every needs --checkpoint-dir (a folder every rank can write)")
    if args.crash_at_step is not None and not 1 <= args.crash_at_step <= args.steps:
        p.error(f"--crash-at-step must be in 1..{args.steps} (--steps), got {args.crash_at_step}")
    if args.stop_after is not None and not 1 <= args.stop_after <= args.steps:
        p.error(f"--stop-after must be in 1..{args.steps} (--steps), got {args.stop_after}")
    if not 0 <= args.dropout < 1 or args.noise < 0:
        p.error(f"--dropout must be in [0, 1) and --noise >= 0, got {args.dropout} and {args.noise}")
    return args


# --------------------------------------------------------------------------- 1. the process group
def join_group(backend: str, timeout: float):
    """(rank, world_size, device): join the group torchrun describes in the environment.

    torchrun's agent keeps one TCP store for the whole job, and a restarted group finds the keys
    its dead predecessor wrote there (pytorch issue 135712): a new rank can read a dead peer's
    address and hang. So every attempt gets its own key space: each rank counts its own starts in
    the store (every attempt restarts every rank, so all ranks count alike, also on nodes whose
    agent did not see the failure) and prefixes the group's store with that count.
    """
    if "RANK" not in os.environ:  # plain `python -m course_utils.distributed.train`: one process
        store, rank, world_size = dist.HashStore(), 0, 1
    else:
        store, rank, world_size = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=timeout)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "auto":  # the same answer on every rank of a node; checked across nodes below
        backend = "nccl" if torch.cuda.device_count() >= local_world else "gloo"
    if backend == "nccl":
        if torch.cuda.device_count() <= local_rank:
            raise SystemExit(f"--backend nccl needs a GPU per local rank: local rank {local_rank}, "
                             f"{torch.cuda.device_count()} GPUs; pass --backend gloo")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)  # N ranks share the cores: one thread each, or they thrash
        device = torch.device("cpu")
    attempt = store.add(f"course_train/starts/rank{rank}", 1)
    store = dist.PrefixStore(f"course_train/attempt{attempt}/", store)
    store.set(f"backend/{rank}", backend)
    backends = {store.get(f"backend/{r}").decode() for r in range(world_size)}
    if len(backends) > 1:
        raise SystemExit(f"ranks disagree on the backend ({sorted(backends)}): some nodes have fewer "
                         "GPUs than processes; pass --backend gloo (or nccl) explicitly")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    return rank, world_size, device


# --------------------------------------------------------------------------- 2. the data
def make_data(args, rank: int, world_size: int):
    """(sampler, loader): each rank's share of the digits, reshuffled per epoch by set_epoch."""
    if args.batch % world_size:
        raise SystemExit(f"--batch {args.batch} does not split over {world_size} ranks; "
                         f"pass a multiple of {world_size}")
    train = load_dataset("digits", "train")
    dataset = TensorDataset(train.images.flatten(1), train.labels)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    # The loader's own generator: otherwise each new epoch's iterator draws a seed from the global
    # RNG, and a resumed run (which starts its iterator mid-epoch) would be one draw out of step.
    loader = DataLoader(dataset, batch_size=args.batch // world_size, sampler=sampler,
                        drop_last=True, generator=torch.Generator().manual_seed(args.seed))
    if len(loader) == 0:
        raise SystemExit(f"--batch {args.batch} is larger than the data ({len(dataset)} images)")
    return sampler, loader


# --------------------------------------------------------------------------- 3. model, optimizer
def build(args, device, world_size: int):
    """(model, module to call, optimizer, schedule). Same initial weights on every rank."""
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
                          nn.Linear(args.hidden, 10)).to(device, getattr(torch, args.dtype))
    if args.strategy == "ddp":
        module = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (world_size,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        module = model
    optimizer = make_optimizer("adamw", model.parameters(), args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    return model, module, optimizer, schedule


# --------------------------------------------------------------------------- 5. checkpoints
STEP_DIR = re.compile(r"step_(\d{8})")


def newest_checkpoint(directory) -> Path | None:
    """The newest complete checkpoint folder (``.partial`` ones are unfinished saves)."""
    directory = Path(directory)
    found = sorted(p for p in directory.iterdir() if STEP_DIR.fullmatch(p.name)) if directory.is_dir() else []
    return found[-1] if found else None


def save_checkpoint(directory, step, position, model, optimizer, schedule, device, rank, keep, batch):
    """Every rank writes its shards (DCP) and its own state; rank 0 publishes the folder."""
    final = Path(directory) / f"step_{step:08d}"
    partial = final.with_name(final.name + ".partial")
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by an attempt killed mid-save
        partial.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
    ck.save(partial / f"rank{rank}.pt", {"rng": rng_state(device), "schedule": schedule.state_dict(),
                                          "position": dict(position), "world_size": dist.get_world_size(),
                                          "batch": batch})
    dist.barrier()  # every rank's files are on disk
    if rank == 0:
        os.replace(partial, final)
        done = sorted(p for p in Path(directory).iterdir() if STEP_DIR.fullmatch(p.name))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path, model, optimizer, schedule, device, rank, batch, seed) -> dict:
    """Load model, optimizer (resharded by DCP into this run's layout), schedule and this rank's
    RNG; return the data position to continue from. Written by another number of ranks: the
    same global batch is required, and this rank's RNG starts from a new seed (docstring, 8)."""
    saved = ck.load(Path(path) / "rank0.pt")   # schedule, position, world size: alike on every rank
    if saved.get("batch", batch) != batch:
        raise SystemExit(f"{path} was written with --batch {saved['batch']}, this run has --batch "
                         f"{batch}; resume with the same global batch (the data position counts its batches)")
    same_world = saved["world_size"] == dist.get_world_size()
    mine = ck.load(Path(path) / f"rank{rank}.pt") if same_world else saved
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    schedule.load_state_dict(mine["schedule"])
    if same_world:
        set_rng_state(mine["rng"], device)
    else:   # no rank of the old run is this rank: a new stream, seeded by the step it resumes at
        new_seed = seed * 1000 + rank + 7919 * (mine["position"]["step"] + 1)
        torch.manual_seed(new_seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(new_seed)
        if rank == 0:
            print(f"resharded: written by {saved['world_size']} ranks, resumed on "
                  f"{dist.get_world_size()}; each rank's noise and dropout draw from a new seed", flush=True)
    return mine["position"]


def full_parameters(model) -> dict:
    """name -> the whole parameter on the CPU, in order (FSDP2 shards gathered: a collective,
    so every rank calls it, once)."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu()
            for name, p in model.named_parameters()}


def params_sha256(params: dict) -> str:
    """sha256 of every parameter of ``full_parameters``, in order, as the bytes of its own dtype
    (an fp64 run is hashed at fp64: two ranks that differ in any bit differ here)."""
    digest = hashlib.sha256()
    for name, full in params.items():
        digest.update(name.encode())
        digest.update(full.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- the run
def train(args) -> str:
    """Join the group, train (resuming if a checkpoint exists), return the parameters' sha256."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS on GPUs
    torch.use_deterministic_algorithms(True)  # same arithmetic on every attempt
    rank, world_size, device = join_group(args.backend, args.timeout)
    sampler, loader = make_data(args, rank, world_size)
    model, module, optimizer, schedule = build(args, device, world_size)
    torch.manual_seed(args.seed * 1000 + rank)  # this rank's own RNG: noise and dropout masks
    if device.type == "cuda":
        torch.cuda.manual_seed(args.seed * 1000 + rank)
    position = {"step": 0, "epoch": 0, "batch_index": 0}

    found = [newest_checkpoint(args.checkpoint_dir) if rank == 0 and args.checkpoint_dir else None]
    dist.broadcast_object_list(found, src=0)  # every rank loads the folder rank 0 chose
    if found[0] is not None:
        position = load_checkpoint(found[0], model, optimizer, schedule, device, rank, args.batch,
                                   args.seed)
        if rank == 0:
            print(f"{RESUME_PREFIX}{position['step']}", flush=True)

    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    module.train()
    last = args.stop_after or args.steps
    while position["step"] < last:
        sampler.set_epoch(position["epoch"])  # this epoch's shuffle, the same on every rank
        for i, (x, y) in enumerate(loader):
            if i < position["batch_index"]:
                continue  # used before the checkpoint
            if (first_attempt and rank == args.crash_rank
                    and position["step"] + 1 == args.crash_at_step):
                print(f"rank {rank}: killing myself before step {args.crash_at_step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = x.to(device, getattr(torch, args.dtype)), y.to(device)
            if args.noise:
                x = x + args.noise * torch.randn_like(x)  # augmentation from this rank's RNG
            loss = F.cross_entropy(module(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces gradients; FSDP2 reduce-scatters them
            optimizer.step()
            schedule.step()
            position.update(step=position["step"] + 1, batch_index=i + 1)
            if args.checkpoint_every and position["step"] % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint_dir, position["step"], position, model, optimizer,
                                schedule, device, rank, args.keep, args.batch)
            if position["step"] >= last:
                break
        else:  # the epoch ran out: the next one starts from its first batch
            position.update(epoch=position["epoch"] + 1, batch_index=0)

    if args.stop_after and args.checkpoint_dir and position["step"] % (args.checkpoint_every or last + 1):
        save_checkpoint(args.checkpoint_dir, position["step"], position, model, optimizer,
                        schedule, device, rank, args.keep, args.batch)   # preempted: save first
    full = full_parameters(model)
    hexdigest = params_sha256(full)
    dist.barrier()
    if rank == 0:
        if args.final_weights:
            torch.save(full, args.final_weights)
        print(f"{HASH_PREFIX}{hexdigest}", flush=True)
    dist.destroy_process_group()
    return hexdigest


def main(argv=None) -> str:
    """Run the script in this process (what ``python -m`` does); returns the sha256 hex. Restores
    the process-wide settings it changes, so a test or a notebook can call it."""
    args = parse_args(argv)
    saved = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    try:
        return train(args)
    finally:
        if dist.is_initialized():  # train raised: leave no group behind
            dist.destroy_process_group()
        torch.use_deterministic_algorithms(saved[0])
        torch.set_num_threads(saved[1])


if __name__ == "__main__":
    main()
    # gloo's threads can abort the interpreter's own shutdown after destroy_process_group (a
    # known torch behaviour): everything is written and flushed, so leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
