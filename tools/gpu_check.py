"""Everything in the kit that only a GPU can check, in one command (under 10 minutes on one GPU,
no network), with a JSON report.

    python tools/gpu_check.py                 # on a CUDA machine: all sections
    python tools/gpu_check.py --only script   # some sections: workers,script,memory,lessons,benchmark
    python tools/gpu_check.py --workers sharding   # only the workers whose name contains this
    python tools/gpu_check.py --dry-run       # anywhere: list what would run, write the plan
    python tools/gpu_check.py --smoke         # on a CPU: the same code paths at toy size (gloo)
    python tools/gpu_check.py --only lessons --lesson-scale ci   # every lesson's GPU path, ci-sized
    python tools/gpu_check.py --smoke --lessons 00 --workers hello_all_reduce   # what `make test` runs

Sections:
- ``workers``:   every distributed worker in ``course_utils.experiments`` (found by signature:
                 module-level ``fn(rank, world_size, ...)``), launched with NCCL at world size =
                 the number of GPUs (gloo, 2 ranks, under --smoke). With one GPU the workers that
                 need two ranks (pipeline and ring point-to-point) are reported skipped: NCCL
                 refuses two ranks on one GPU, so their sends run only under gloo in ``make test``.
- ``script``:    ``torchrun -m course_utils.distributed.train`` on the GPU (NCCL): uninterrupted,
                 killed and restarted (``--max-restarts 1``), and FSDP2; the hashes are compared.
- ``memory``:    a TinyGPT training step's kept-for-backward bytes and
                 ``torch.cuda.max_memory_allocated`` against lesson 06's predictions: fp32 within
                 5% of ``transformer_memory`` and a peak at least the stored bytes; bf16 autocast
                 exact, per sample (``tinygpt_activation_bytes(..., autocast="cuda")`` on the slope
                 between two batches, where autocast's weight copies cancel).
- ``lessons``:   every lesson at gpu scale (papermill), those not yet passed on a GPU first,
                 or with ``--lesson-scale ci`` at the ci preset on the GPU (``$COURSE_DEVICE``):
                 every lesson's device code path, step-capped, in a few minutes;
                 with their headline figures, seconds, CUDA peak
                 memory and tools/gpu_budget.py's predicted T4 seconds. Datasets the machine
                 cannot download (CIFAR-10, STL-10) are replaced by the embedded shapes at the same
                 size, and the report says so (``stand_ins``). Every lesson's device placement is
                 also checked on the CPU by ``make test`` (COURSE_CHECK_PLACEMENT=1,
                 course_utils.distributed.device_check).
- ``benchmark``: the gpu preset (benchmarks/gpu_simclr_cifar10.py) for a few epochs with the
                 embedded "shapes" data standing in for CIFAR-10 (the machine cannot download).

Exit code: 0 when no check failed and none was left out for want of time, 1 otherwise, 2 when
there is no GPU (without --dry-run/--smoke). A check that is skipped is reported as skipped, with
why, never as passed: the report's ``skipped`` lists every one, and ``complete`` is true only
when nothing was skipped. Sections stop starting new work once
the time budget (--budget) is spent; what that leaves out is "skipped: time budget spent", which
is not a pass (the report's ``complete`` says whether everything ran). The report is written
before the first section and rewritten after every section and every lesson, so a run killed at
a time limit leaves what it finished.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from course_utils.runtime import DEVICE_VAR  # noqa: E402 - the one name of $COURSE_DEVICE

SECTIONS = ("workers", "script", "memory", "lessons", "benchmark")
# what has not yet passed on a GPU first (benchmarks/gpu_runs/: 02 failed on a device bug, fixed
# since; 05 and 04 were stopped by time; 03 and 13 never ran), 04 last of those (its gpu preset is
# the longest on an H200), then what passed there
LESSONS = ("02", "03", "13", "05", "04", "06", "07", "09", "10", "12", "00", "01", "08", "11")
NOT_SELECTED = "not selected (--lessons)"
BUDGET_SKIP = "time budget spent"
# (layers, hidden, heads, vocab, seq, batch): TinyGPT shapes for the memory check
MEMORY_CASES = {"gpu": [(4, 256, 4, 1024, 256, 8), (8, 512, 8, 4096, 512, 8)],
                "smoke": [(2, 32, 2, 64, 16, 4)]}


# --------------------------------------------------------------------------- discovery
def discover_workers() -> list[dict]:
    """Every module-level function of course_utils.experiments.* whose first two parameters are
    (rank, world_size): what ``launch`` runs. Extra required parameters named ``path`` get one
    folder per module, and a worker whose name says "save" runs before one that says "load"
    (``dcp_save`` then ``dcp_load``); workers needing anything else are listed as skipped, and so
    are those that declare ``fn.min_world_size > 1`` (a two-stage pipeline on one rank)."""
    import course_utils.experiments as pkg
    found = []
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or name.startswith("_"):
                continue
            params = list(inspect.signature(fn).parameters.values())
            if [p.name for p in params[:2]] != ["rank", "world_size"]:
                continue
            required = [p.name for p in params[2:] if p.default is inspect.Parameter.empty
                        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            found.append({"worker": f"{module.__name__}:{name}", "needs": required,
                          "min_world_size": getattr(fn, "min_world_size", 1),
                          "runnable": all(r == "path" for r in required)})
    order = {"save": 0, "load": 2}
    return sorted(found, key=lambda w: (w["worker"].split(":")[0],
                                        next((v for k, v in order.items() if k in w["worker"].split(":")[1]), 1),
                                        w["worker"]))


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# --------------------------------------------------------------------------- sections
def check_workers(backend: str, deadline: float, match: str = "", world_size: int = 1) -> list[dict]:
    from course_utils.distributed import launch
    rows = []
    # the workers' checkpoints: one folder per module, shared by its workers, all removed after
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as root:
        for w in discover_workers():
            if match not in w["worker"]:
                continue
            row = dict(w, world_size=world_size)
            if not w["runnable"]:
                row.update(status="skipped", why=f"needs arguments {w['needs']}")
            elif w["min_world_size"] > world_size:
                row.update(status="skipped", why=f"needs {w['min_world_size']} ranks, one GPU each "
                           f"(NCCL refuses two ranks on one GPU); this machine gives {world_size}")
            elif time.monotonic() > deadline:
                row.update(status="skipped", why=BUDGET_SKIP)
            else:
                folder = Path(root) / w["worker"].split(":")[0]
                folder.mkdir(exist_ok=True)
                args = [str(folder) for _ in w["needs"]]
                start = time.perf_counter()
                try:
                    result = launch(_resolve(w["worker"]), world_size, *args, backend=backend,
                                    timeout=180)
                    row.update(status="ok", summary=_summarise(result[0]))
                except Exception as err:  # noqa: BLE001 - record and go on
                    row.update(status="failed", error=_tail(err))
                row["seconds"] = round(time.perf_counter() - start, 2)
            rows.append(row)
            print(f"  worker {row['worker']}: {row['status']}", flush=True)
    return rows


def _start_torchrun(nproc: int, script_args: list[str], extra=()) -> tuple:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(nproc), *extra, "-m", "course_utils.distributed.train", *script_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return proc, "torchrun " + " ".join(cmd[3:]), time.perf_counter()


def _finish_torchrun(started, timeout=300) -> dict:
    from course_utils.distributed.train import HASH_PREFIX
    proc, command, start = started
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"command": command, "status": "failed", "error": f"timeout {timeout} s"}
    lines = out.strip().splitlines()
    last = lines[-1] if lines else ""
    ok = proc.returncode == 0 and last.startswith(HASH_PREFIX)
    return {"command": command, "status": "ok" if ok else "failed",
            "seconds": round(time.perf_counter() - start, 2), "stdout": lines[-5:],
            "sha256": last[len(HASH_PREFIX):] if ok else None, **({} if ok else {"stderr": err[-3000:]})}


def check_script(backend: str, nproc: int, steps: int) -> dict:
    """Three runs at once: uninterrupted, rank 0 killed and the group restarted, FSDP2."""
    base = ["--steps", str(steps), "--backend", backend]
    every, crash = max(steps // 4, 1), max(steps - steps // 4 + 1, 2)
    with tempfile.TemporaryDirectory(prefix="gpu-check-train-") as tmp:
        started = {
            "uninterrupted": _start_torchrun(nproc, base),
            "killed_and_restarted": _start_torchrun(
                nproc, [*base, "--checkpoint-dir", f"{tmp}/a", "--checkpoint-every", str(every),
                        "--crash-at-step", str(crash), "--crash-rank", "0"], extra=["--max-restarts", "1"]),
            "fsdp": _start_torchrun(nproc, [*base, "--strategy", "fsdp"]),
        }
        runs = {name: _finish_torchrun(s) for name, s in started.items()}
    hashes = {k: v.get("sha256") for k, v in runs.items()}
    resumed = any(line.startswith("resumed from step") for line in runs["killed_and_restarted"].get("stdout", []))
    equal = hashes["uninterrupted"] is not None and hashes["uninterrupted"] == hashes["killed_and_restarted"]
    print(f"  script: resume bitwise equal: {equal}", flush=True)
    return {"runs": runs, "resumed": resumed, "resume_bitwise_equal": equal,
            "status": "ok" if equal and resumed and runs["fsdp"]["status"] == "ok" else "failed"}


def check_memory(device: str, cases) -> list[dict]:
    import torch

    from course_utils.experiments.training_memory import measure_tinygpt
    from course_utils.memory import tinygpt_activation_bytes, transformer_memory
    rows = []
    for layers, hidden, heads, vocab, seq, batch in cases:
        for recompute in ("none", "full"):
            for autocast in (False, True):
                row = {"shape": dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq,
                                     batch=batch), "recompute": recompute, "bf16_autocast": autocast}
                try:
                    if device == "cuda":
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                    record, model = measure_tinygpt(layers, hidden, heads, vocab, seq, batch,
                                                    recompute=recompute, autocast=autocast,
                                                    device=device, steps=2)
                    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
                    predicted = transformer_memory(layers, hidden, heads, vocab, seq, batch,
                                                   precision="bf16-mixed" if autocast else "fp32",
                                                   recompute=recompute)
                    resident = predicted["params"] + predicted["grads"] + predicted["optimizer"]
                    stored = resident + predicted["activations"]
                    row.update(predicted=predicted, measured_activation_bytes=record.activation_bytes,
                               activation_ratio=record.activation_bytes / predicted["activations"],
                               max_memory_allocated=peak, ledger_peak_bytes=record.peak_bytes,
                               peak_over_predicted_total=None if peak is None else peak / predicted["total"],
                               peak_over_predicted_stored=None if peak is None else peak / stored)
                    # what lesson 06 claims: the peak holds at least the stored bytes it predicts
                    # (fp32); under autocast, its exact per-sample rule, on a slope between two
                    # batches so that autocast's weight copies (per step, not per sample) cancel
                    if autocast:
                        half = batch // 2  # lesson 06's slope; batch 1 keeps a few bytes of its own
                        smaller, _ = measure_tinygpt(layers, hidden, heads, vocab, seq, half,
                                                     recompute=recompute, autocast=True,
                                                     device=device, steps=2)
                        slope = record.activation_bytes - smaller.activation_bytes
                        expected = (tinygpt_activation_bytes(layers, hidden, heads, vocab, seq, batch,
                                                             recompute=recompute, autocast=device)
                                    - tinygpt_activation_bytes(layers, hidden, heads, vocab, seq, half,
                                                               recompute=recompute, autocast=device))
                        row.update(slope_batches=[half, batch], measured_slope=slope,
                                   predicted_slope=expected)
                        row["status"] = "ok" if slope == expected else "failed"
                    else:
                        close = 0.95 <= row["activation_ratio"] <= 1.05
                        holds = peak is None or peak >= stored
                        row["status"] = "ok" if close and holds else "failed"
                    del model
                except Exception as err:  # noqa: BLE001
                    row.update(status="failed", error=_tail(err))
                rows.append(row)
                print(f"  memory {row['shape']} {recompute} autocast={autocast}: {row['status']}", flush=True)
    return rows


SMOKE_CELL_SECONDS = 120   # a ci-scale cell of the smoke run takes seconds; see check_lessons


def check_lessons(scale: str, out_dir: Path, deadline: float, lessons=LESSONS,
                  progress=lambda rows: None, cell_seconds: float | None = None) -> list[dict]:
    """Run each lesson with papermill until ``deadline``. A cell's limit is what is left of the
    budget (stopping there is a skip for time, not a failure), or ``cell_seconds`` when that is
    smaller: a cell that runs past it with budget to spare is run again once, the whole lesson in
    a fresh kernel, and the row says so. That is tests/kernel_run.py's answer to a kernel message
    lost between client and kernel (seen once in the smoke run): a ci-scale cell that takes
    minutes is stalled, not slow. A second timeout fails the lesson."""
    import papermill as pm
    from kernel_client import CLIENT_OPTIONS
    rows = [{"lesson": p, "scale": scale, "status": "skipped", "why": NOT_SELECTED}
            for p in LESSONS if p not in lessons]
    for prefix in lessons:
        nb = next((ROOT / "notebooks").glob(f"{prefix}_*.ipynb"))
        row = {"lesson": nb.stem, "scale": scale,
               "device": os.environ.get(DEVICE_VAR) or ("cuda" if scale == "gpu" else "cpu")}
        if time.monotonic() > deadline:
            row.update(status="skipped", why=BUDGET_SKIP)
            rows.append(row)
            continue
        headline_file = out_dir / "headlines" / f"{nb.stem}.json"
        headline_file.parent.mkdir(parents=True, exist_ok=True)
        headline_file.unlink(missing_ok=True)
        os.environ["COURSE_HEADLINE_FILE"] = str(headline_file)
        peak_file = out_dir / "peaks" / f"{nb.stem}.json"
        source = _instrumented_copy(nb, peak_file, out_dir / "inputs")
        start = time.perf_counter()
        for attempt in ("first", "again"):
            timeout = max(int(deadline - time.monotonic()), 30)
            if cell_seconds is not None:
                timeout = min(timeout, int(cell_seconds))
            try:
                pm.execute_notebook(str(source), str(out_dir / nb.name), parameters={"SCALE": scale},
                                    cwd=str(nb.parent), kernel_name="python3", progress_bar=False,
                                    execution_timeout=timeout,
                                    **CLIENT_OPTIONS)
                row["status"] = "ok"
            except Exception as err:  # noqa: BLE001
                if _cell_timed_out(err) and time.monotonic() >= deadline - 5:
                    # the cell's limit was what was left of the budget: unfinished, not failed
                    row.update(status="skipped", why=f"{BUDGET_SKIP} while it ran "
                               f"({_cells_done(out_dir / nb.name)}; a cell's limit was {timeout} s)")
                elif _cell_timed_out(err) and attempt == "first":
                    row["retried"] = (f"a cell ran past {timeout} s with budget to spare "
                                      f"({_cells_done(out_dir / nb.name)}): run again once in a fresh kernel")
                    print(f"  lesson {nb.stem}: {row['retried']}", flush=True)
                    continue
                else:
                    row.update(status="failed", error=_tail(err))
            break
        row["seconds"] = round(time.perf_counter() - start, 1)
        if peak_file.exists():
            written = json.loads(peak_file.read_text())
            row["max_memory_allocated_bytes"] = written["max_memory_allocated"]
            row["stand_ins"] = written["stand_ins"]
        if scale == "gpu" and row["status"] == "ok":
            row.update(_predicted(nb.stem, row["seconds"]))
        if headline_file.exists():
            row["headline"] = json.loads(headline_file.read_text())
        rows.append(row)
        print(f"  lesson {nb.stem}: {row['status']} ({row['seconds']} s)", flush=True)
        progress(rows)
    return rows


def check_benchmark(device_name: str, epochs: int, minutes: float, smoke: bool) -> dict:
    import torch
    spec = importlib.util.spec_from_file_location("gpu_simclr_cifar10", ROOT / "benchmarks" / "gpu_simclr_cifar10.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = dict(bench.SMOKE if smoke else bench.FULL, dataset="shapes", epochs=epochs, minutes=minutes,
               eval_every_epochs=max(epochs, 1))
    start = time.perf_counter()
    try:
        result = bench.run(cfg, torch.device(device_name))
        out = {"status": "ok", "stand_in": "shapes (embedded) for cifar10",
               **{k: v for k, v in result.items() if k not in ("config",)}, "config": cfg}
    except Exception as err:  # noqa: BLE001
        out = {"status": "failed", "error": _tail(err), "config": cfg}
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(f"  benchmark: {out['status']}", flush=True)
    return out


STAND_IN_CELL = """# added by tools/gpu_check.py: this machine cannot download, so a dataset that is not on
# disk is replaced by the embedded shapes at the same size (as many images as shapes has)
import course_utils.data as _data
_load_dataset, _stand_ins = _data.load_dataset, []
def _load_or_stand_in(name, split="train", **kwargs):
    try:
        return _load_dataset(name, split, **kwargs)
    except _data.DatasetUnavailableError:
        limit = kwargs.get("limit")
        kwargs.update(download=False, limit=None if limit is None else min(limit, len(_load_dataset("shapes", split))))
        _stand_ins.append(f"{name}/{split} -> shapes")
        return _load_dataset("shapes", split, **kwargs)
_data.load_dataset = _load_or_stand_in
"""
PEAK_CELL = """# added by tools/gpu_check.py: the lesson's CUDA peak (None on a CPU) and its stand-ins
import json as _json, torch as _torch
with open({path!r}, "w") as _f:
    _json.dump({{"max_memory_allocated": _torch.cuda.max_memory_allocated()
               if _torch.cuda.is_available() and _torch.cuda.is_initialized() else None,
               "stand_ins": _stand_ins}}, _f)
"""


def _cell_timed_out(err: BaseException) -> bool:
    """Whether papermill stopped on a cell's time limit (nbclient's CellTimeoutError, which
    papermill re-raises as is), told by name so this runs where nbclient is not imported."""
    return any(type(e).__name__ == "CellTimeoutError" for e in (err, err.__cause__, err.__context__))


def _cells_done(executed: Path) -> str:
    """How far a stopped lesson got, read from papermill's partly executed copy."""
    import nbformat
    try:
        cells = [c for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"]
    except Exception:  # noqa: BLE001 - papermill may not have written it yet
        return "cells run: unknown"
    done = sum(1 for c in cells if c.get("execution_count") is not None)
    return f"{done} of {len(cells)} code cells run"


def _instrumented_copy(nb: Path, peak_file: Path, folder: Path) -> Path:
    """A copy of the lesson with a cell after its parameters that stands in for datasets it
    cannot download, and one last cell that writes its CUDA peak to ``peak_file`` (the lesson
    runs in a kernel of its own, whose memory statistics this process cannot read)."""
    import nbformat
    notebook = nbformat.read(nb, as_version=4)
    peak_file.parent.mkdir(parents=True, exist_ok=True)
    peak_file.unlink(missing_ok=True)
    at = next(i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", []))
    notebook.cells.insert(at + 1, nbformat.v4.new_code_cell(STAND_IN_CELL))
    notebook.cells.append(nbformat.v4.new_code_cell(PEAK_CELL.format(path=str(peak_file))))
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / nb.name
    nbformat.write(notebook, copy)
    return copy


def _predicted(lesson: str, seconds: float) -> dict:
    """tools/gpu_budget.py's prediction for a T4 beside the time measured here (the lesson's
    FLOPs too, so that this GPU's achieved rate can be read off)."""
    try:
        import gpu_budget
        p = gpu_budget.predict(lesson, gpu_budget.measured_times())
    except Exception as err:  # noqa: BLE001 - a report, not a verdict
        return {"predicted": f"not available: {_tail(err, 300)}"}
    return {"predicted_t4_seconds": p["gpu_seconds"], "predicted_basis": p["basis"],
            "gpu_flops": p["gpu_flops"], "measured_over_predicted_t4": round(seconds / p["gpu_seconds"], 3)}


# --------------------------------------------------------------------------- helpers
def _tail(err: BaseException, n: int = 2500) -> str:
    return "".join(traceback.format_exception(err))[-n:]


def _summarise(value, depth: int = 0):
    """A JSON-able sketch of a worker's result: numbers and strings kept, tensors by shape."""
    import torch
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else f"tensor{tuple(value.shape)}"
    if depth > 3:
        return type(value).__name__
    if isinstance(value, dict):
        return {str(k): _summarise(v, depth + 1) for k, v in list(value.items())[:30]}
    if isinstance(value, (list, tuple)):
        return [_summarise(v, depth + 1) for v in value[:10]]
    return type(value).__name__


def plan(args) -> dict:
    workers = discover_workers()
    return {"workers": workers,
            "script": "torchrun --standalone --nproc_per_node N -m course_utils.distributed.train: "
                      "uninterrupted, killed and restarted (--max-restarts 1), --strategy fsdp",
            "memory": MEMORY_CASES["smoke" if args.smoke else "gpu"],
            "lessons": [f"{p} at scale {lesson_scale(args)}"
                        for p in args.lessons.split(",") if p.strip()],
            "benchmark": "benchmarks/gpu_simclr_cifar10.py run() with dataset='shapes'"}


def lesson_scale(args) -> str:
    """The preset the lessons section runs: ci under --smoke (on the CPU), else --lesson-scale."""
    return "ci" if args.smoke else args.lesson_scale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--dry-run", action="store_true", help="list the checks and write the plan; run nothing")
    p.add_argument("--smoke", action="store_true", help="run on the CPU at toy size (gloo, ci scale)")
    p.add_argument("--workers", default="", help="only workers whose module:name contains this")
    p.add_argument("--lessons", default=",".join(LESSONS),
                   help=f"comma-separated lesson prefixes, in the order to run (default {','.join(LESSONS)})")
    p.add_argument("--lesson-scale", choices=("gpu", "ci"), default="gpu",
                   help="the lessons' preset: gpu (default), or ci run on the GPU ($COURSE_DEVICE="
                        "=cuda): every lesson's GPU code path in minutes, step-capped by the ci preset")
    p.add_argument("--budget", type=float, default=540, help="seconds before sections stop starting work")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "gpu_check.json")
    args = p.parse_args(argv)
    # absolute: lessons run with the notebooks folder as their working directory, and the cells
    # gpu_check adds to them write into this report's folder (a relative --out once lost a
    # lesson's peak-memory cell on the first GPU run)
    args.out = args.out.resolve()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    lessons = [x.strip() for x in args.lessons.split(",") if x.strip()]
    if set(lessons) - set(LESSONS):
        p.error(f"--lessons: {sorted(set(lessons) - set(LESSONS))} is not a lesson; choose from "
                f"{', '.join(LESSONS)}")

    import torch
    report = {"started": datetime.datetime.now().isoformat(timespec="seconds"),
              "torch": torch.__version__, "sections": sections,
              "mode": "dry-run" if args.dry_run else "smoke" if args.smoke else "gpu"}
    if args.dry_run:
        report["plan"] = plan(args)
        return _write(report, args.out, ok=True)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False). "
              "Run it on the GPU machine; here, `--dry-run` lists the checks and `--smoke` runs "
              "their code paths on the CPU at toy size.", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    backend = "gloo" if args.smoke else "nccl"
    report["device"] = "cpu" if args.smoke else torch.cuda.get_device_name(0)
    deadline = time.monotonic() + args.budget
    out_dir = args.out.parent / "gpu_check"
    out_dir.mkdir(parents=True, exist_ok=True)
    results, ok = {}, True
    start = time.perf_counter()

    def progress() -> None:  # a run killed at its time limit still leaves what it finished
        report.update(results=results, seconds=round(time.perf_counter() - start, 1),
                      finished=False)
        _write(report, args.out, ok=ok, quiet=True)

    report["plan"] = plan(args)
    progress()  # on disk before anything runs: a kill at any point leaves a report
    world_size = 2 if args.smoke else torch.cuda.device_count()

    if "workers" in sections:
        results["workers"] = check_workers(backend, deadline, args.workers, world_size)
        ok &= all(r["status"] != "failed" for r in results["workers"])  # and _write: time skips
        progress()
    if "script" in sections:
        results["script"] = check_script(backend, 1, 12 if args.smoke else 40)
        ok &= results["script"]["status"] == "ok"
        progress()
    if "memory" in sections:
        results["memory"] = check_memory(device, MEMORY_CASES["smoke" if args.smoke else "gpu"])
        ok &= all(r["status"] != "failed" for r in results["memory"])
        progress()
    if "lessons" in sections:
        def lesson_progress(rows) -> None:
            results["lessons"] = rows
            progress()
        if lesson_scale(args) == "ci" and not args.smoke:
            os.environ[DEVICE_VAR] = "cuda"   # the lessons' kernels inherit it
        results["lessons"] = check_lessons(lesson_scale(args), out_dir, deadline, lessons,
                                           lesson_progress,
                                           cell_seconds=SMOKE_CELL_SECONDS if args.smoke else None)
        ok &= all(r["status"] != "failed" for r in results["lessons"])
        progress()
    if "benchmark" in sections:
        minutes = min(1.0 if args.smoke else 2.0, (deadline - time.monotonic()) / 60)
        if minutes <= 0.1:
            results["benchmark"] = {"status": "skipped", "why": BUDGET_SKIP}
        else:  # within what is left of the budget: the benchmark stops itself at `minutes`
            results["benchmark"] = check_benchmark(device, 1 if args.smoke else 3, minutes,
                                                   args.smoke)
        ok &= results["benchmark"]["status"] == "ok"
        progress()
    report.update(results=results, seconds=round(time.perf_counter() - start, 1),
                  finished=True)
    return _write(report, args.out, ok=ok)


def _rows(report: dict):
    """(section, name, row) for every check in the report."""
    for section, value in report.get("results", {}).items():
        for row in value if isinstance(value, list) else [value]:
            if isinstance(row, dict):
                yield section, f"{section}:{row.get('worker') or row.get('lesson') or section}", row


def _write(report: dict, out: Path, ok: bool, quiet: bool = False) -> int:
    rows = list(_rows(report))
    skipped = {name: row.get("why", "") for _, name, row in rows if row.get("status") == "skipped"}
    for_time = [name for name, why in skipped.items() if why.startswith(BUDGET_SKIP)]
    report["counts"] = {status: sum(row.get("status") == status for _, _, row in rows)
                        for status in ("ok", "failed", "skipped", "reported")}
    report["skipped"] = skipped            # every skip, with why: a skip is never a pass
    report["skipped_for_time"] = for_time
    report["complete"] = not skipped and report.get("finished", True)
    report["ok"] = bool(ok) and not for_time
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, out)
    if not quiet:
        counts = report["counts"]
        verdict = ("no check failed" if report["ok"] else
                   f"INCOMPLETE: {len(for_time)} check(s) did not run for want of time" if ok else
                   "SOME CHECKS FAILED")
        print(f"gpu_check: {verdict}: {counts['ok']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped (not passed; the report's 'skipped' says why), "
              f"{counts['reported']} reported without a verdict; report in {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
