"""Start N real torch.distributed processes from a notebook (or a test) and collect their results.

    results = launch(fn, world_size, *args)      # -> [fn(0, world_size, *args), fn(1, ...), ...]

Each rank is a fresh process (forkserver where the OS has it, else spawn; never a fork of the
notebook itself, so safe with CUDA) with an initialised default process group: gloo on CPU, NCCL
when every rank can have its own GPU, unless ``backend=`` says otherwise. What the launcher guarantees, because a hung
collective would otherwise freeze a Jupyter kernel forever:

- the whole run is bounded by ``timeout`` seconds (start-up included);
- if any rank raises, the others are stopped and its traceback is re-raised here;
- if a rank dies without a word (killed, segfault, out of memory) the others are stopped and the
  error names the rank and its exit signal;
- on timeout, each stuck rank's Python stack is captured (``faulthandler``) and shown.

Results come back through a pipe as ``torch.save`` bytes, so they must be plain CPU values:
tensors, numbers, strings, lists and dicts (CUDA tensors are moved to the CPU for you).
"""
from __future__ import annotations

import datetime
import importlib
import io
import os
import pickle
import queue as queue_module
import re
import shutil
import signal
import socket
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_utils import checks
from course_utils.distributed import device_check
from course_utils.distributed.devices import default_backend, worker_device  # noqa: F401 (re-exported)

BACKENDS = (None, "gloo", "nccl")


class WorkerError(RuntimeError):
    """A rank raised (its remote traceback is in the message) or died (its exit code is)."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


def free_port() -> int:
    """Ask the OS for a TCP port nobody listens on (the rendezvous of rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_cpu(obj):
    """Detach tensors and move them to the CPU, through lists, tuples and dicts."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def check_importable(fn) -> None:
    """Spawned processes re-import ``fn`` by module and name; fail early and clearly if they cannot."""
    if not callable(fn):
        raise TypeError(f"launch needs a function, got {type(fn).__name__}: pass a worker such as "
                        "course_utils.experiments.data_parallel.ddp_equivalence")
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    hint = ("spawned processes re-import the worker by name, so it must be a module-level function "
            "in an importable module (e.g. in course_utils/experiments/), not one defined in a "
            "notebook, the __main__ script, a lambda or a nested function")
    if module in (None, "__main__", "__mp_main__") or "<" in qualname:
        raise TypeError(f"launch cannot send {qualname or fn!r} (module {module!r}) to other "
                        f"processes: {hint}")
    try:
        target = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise TypeError(f"launch cannot re-import {module}.{qualname} ({err}): {hint}") from err
    if target is not fn:
        raise TypeError(f"{module}.{qualname} does not name the function you passed: {hint}")


def _install_stack_dump(path: str) -> None:
    """On SIGUSR1, write every thread's Python stack to ``path`` (read by the parent on timeout)."""
    if hasattr(signal, "SIGUSR1"):
        import faulthandler
        handle = open(path, "w")  # kept open for the life of the process on purpose
        faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True)


def _run_rank(rank, world_size, fn, args, backend, port, timeout, stack_path, results,
              check_placement=False):
    """Body of one spawned rank: join the group, run fn, send back ('ok'|'error', rank, payload)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)  # N ranks on N cores: one thread each, or they thrash
    _install_stack_dump(stack_path)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
        if check_placement:  # the parent asked for device bugs to raise here (device_check)
            device_check.watch_placement()
        value = to_cpu(fn(rank, world_size, *args))
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put(("ok", rank, time.time(), buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - everything must reach the parent, even SystemExit
        results.put(("error", rank, time.time(), traceback.format_exc()))
        return  # skip destroy_process_group: peers may be gone, and it could block
    dist.destroy_process_group()


def _stop(processes) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout=3)
        if p.is_alive():
            p.kill()
            p.join(timeout=3)


def _stacks(processes, stack_dir: Path) -> str:
    """Ask live ranks for their Python stacks (SIGUSR1 -> faulthandler) and read them back."""
    if not hasattr(signal, "SIGUSR1"):
        return ""
    alive = [(r, p) for r, p in enumerate(processes) if p.is_alive()]
    for _, p in alive:
        os.kill(p.pid, signal.SIGUSR1)
    time.sleep(0.5)
    parts = []
    for r, _ in alive:
        text = (stack_dir / f"rank{r}.stack").read_text().strip()
        if text:
            parts.append(f"--- rank {r} was here ---\n{text}")
    return "\n".join(parts)


PEER_FAILURE = re.compile(r"Connection (reset|closed)|Broken pipe|timed out|Timeout|DistBackendError|"
                          r"NCCL communicator|peer", re.IGNORECASE)


def _is_peer_failure(message: str) -> bool:
    """Did this rank fail only because a peer went away (its last traceback line says so)?"""
    return bool(PEER_FAILURE.search(message.strip().splitlines()[-1]))


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# Imported once by the fork server, so no rank pays for them again (DDP's constructor alone pulls
# in torch._dynamo: seconds per rank on a small CPU). Missing modules are skipped silently.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "torch.distributed.optim",
           "torch.distributed.fsdp", "torch.distributed.checkpoint", "torch.distributed.pipelining",
           "torch.distributed.tensor", __name__]


def _context():
    """A fresh-interpreter start method: forkserver (torch imported once, then each rank forks from
    that clean server in well under a second) where the OS has it, else spawn. Neither forks the
    notebook's own process, so both are safe with CUDA, and both re-import ``fn`` by name."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


def launch(fn, world_size: int, *args, backend: str | None = None, timeout: float = 120):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the per-rank results.

    fn:         a module-level function importable by name (spawn re-imports it in each rank).
    world_size: number of ranks (processes), >= 1.
    backend:    "gloo" (CPU), "nccl" (one GPU per rank) or None for NCCL-if-possible-else-gloo.
    timeout:    seconds for the whole run; then every rank is stopped and TimeoutError raised.
    Raises WorkerError with the first failing rank's traceback (or exit signal) if a rank fails.
    """
    check_importable(fn)
    checks.positive_int(world_size, "world_size", hint="the number of ranks (processes)")
    checks.choice(backend, "backend", BACKENDS)
    checks.positive_float(timeout, "timeout", hint="seconds for the whole run")
    backend = backend or default_backend(world_size)
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs one GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPUs; pass backend='gloo' or fewer ranks")
    try:
        pickle.dumps(args)
    except Exception as err:
        raise TypeError(f"launch arguments must be picklable to reach the ranks ({err}); pass plain "
                        "numbers, strings, lists, dicts or CPU tensors") from err

    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    stack_dir = Path(tempfile.mkdtemp(prefix="launch-"))
    saved_env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # read by the children's torch
    processes = []
    try:
        for rank in range(world_size):
            p = ctx.Process(target=_run_rank, daemon=True, name=f"rank{rank}",
                            args=(rank, world_size, fn, args, backend, port, timeout,
                                  str(stack_dir / f"rank{rank}.stack"), results,
                                  device_check.requested()))
            p.start()
            processes.append(p)
    finally:
        for k, v in saved_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    try:
        return _collect(processes, results, world_size, time.monotonic() + timeout, timeout,
                        stack_dir)
    finally:
        _stop(processes)
        shutil.rmtree(stack_dir, ignore_errors=True)  # read by _collect; a launch leaves nothing


def _collect(processes, results, world_size, deadline, timeout, stack_dir):
    done: dict[int, object] = {}
    errors: list[tuple[float, int, str]] = []  # (wall time, rank, message)
    while len(done) < world_size and not errors:
        try:
            status, rank, when, payload = results.get(timeout=0.1)
        except queue_module.Empty:
            status = None
        if status == "ok":
            done[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        elif status == "error":
            errors.append((when, rank, f"rank {rank} raised:\n{payload}"))
        else:
            for rank, p in enumerate(processes):
                if rank not in done and p.exitcode not in (None, 0):
                    time.sleep(0.5)  # its traceback may still be in the pipe
                    if results.empty():
                        errors.append((time.time(), rank, f"rank {rank} died ({_signal_name(p.exitcode)}) "
                                       "before returning a result"))
                    break
            if time.monotonic() > deadline and not errors:
                stacks = _stacks(processes, stack_dir)
                missing = [r for r in range(world_size) if r not in done]
                raise TimeoutError(f"launch: ranks {missing} did not finish within {timeout} s, so "
                                   f"every rank was stopped (pass a larger timeout= if the work is "
                                   f"just slow).\n{stacks}")
    if errors:
        # Peers of a failed rank fail soon after (broken connections); collect for a moment, then
        # blame the root cause: a rank that raised for its own reasons or died, not its victims.
        grace = time.monotonic() + 1.0
        while time.monotonic() < grace:
            try:
                status, rank, when, payload = results.get(timeout=0.1)
                if status == "error":
                    errors.append((when, rank, f"rank {rank} raised:\n{payload}"))
            except queue_module.Empty:
                pass
        blamed = {rank for _, rank, _ in errors}
        for rank, p in enumerate(processes):
            if rank not in done and rank not in blamed and p.exitcode not in (None, 0):
                errors.append((time.time(), rank, f"rank {rank} died ({_signal_name(p.exitcode)}) "
                               "before returning a result"))
        errors.sort(key=lambda e: (_is_peer_failure(e[2]), e[0]))
        _, rank, message = errors[0]
        also = [f"rank {r}: {m.strip().splitlines()[-1]}" for _, r, m in errors[1:]]
        if also:
            message += "\nThen the other ranks failed too:\n  " + "\n  ".join(also)
        raise WorkerError(rank, message)
    return [done[r] for r in range(world_size)]
