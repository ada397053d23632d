"""`make course`: execute every lesson notebook with papermill into build/, print headline figures.

Each notebook records its headline figures with ``course_utils.report.headline`` into the file
named by $COURSE_HEADLINE_FILE, which this runner sets per notebook. As each lesson finishes the
runner prints its time, its headline figures and where the executed notebook is (or, on an error,
the failing cell), and rebuilds the site (tools/course_site.py): build/index.html shows every executed
lesson's figures, one plot and time, and links its HTML page.

On a CPU machine two lessons run at once (``--jobs``), each kernel with half the cores as torch
threads: the lessons train small models whose steps do not scale to every core (a lesson 03 MoCo
step: 93 ms on one thread, 60 ms on two), so two one-thread kernels finish the course sooner than
one two-thread kernel. A lesson alone (``--jobs 1``, as a reader's own run) spreads its seeded
runs over the cores instead (``runtime.map_runs``: forked one-thread workers), so those runs'
figures are the same either way; what a lesson computes outside ``map_runs`` can move in the last
digits with its thread count (floating-point sums in another order), and every assert holds
either way. ``--jobs 1`` shows a per-cell progress bar.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import nbformat
import papermill as pm
from tqdm.auto import tqdm
from traitlets.config import Config

from course_utils.report import readable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import course_site  # noqa: E402
from kernel_client import CLIENT_OPTIONS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
# IPC transport (unix sockets) instead of TCP on localhost: the kernel then has no plain-text
# network traffic to warn about ("Kernel is running over TCP without encryption", ipykernel).
def kernel_config() -> Config:
    """IPC sockets named after this process, so two runners' kernels never share a socket file."""
    sockets = Path(tempfile.gettempdir()) / f"course-kernel-{os.getpid()}"
    return Config({"KernelManager": {"transport": "ipc", "ip": str(sockets)}})


def lessons(only: list[str]) -> list[Path]:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(nb.stem.startswith(o) for o in only)]
        if not notebooks:
            sys.exit(f"no notebook matches {only}; names start with 00, 01, ...")
    return notebooks


def execute(nb: Path, out: Path, scale: str, progress_bar: bool = True) -> dict:
    """Run one lesson; {"name", "seconds", "figures", "error", "threads"} (error: None or a
    sentence). Plots go inline whatever MPLBACKEND the caller has (``make test`` sets Agg), so the
    executed copy and the site carry them."""
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    headline_file = out.parent / "headlines" / f"{nb.stem}.json"   # out.parent: the build folder
    headline_file.parent.mkdir(parents=True, exist_ok=True)
    headline_file.unlink(missing_ok=True)
    os.environ["COURSE_HEADLINE_FILE"] = str(headline_file)
    start = time.time()
    error = None
    # the kernel inherits $COURSE_SCALE, so its parameters cell takes the runner's scale, and the
    # lesson's scale line says it came from there (not "chosen by the device"); papermill injects
    # the same value after that cell
    previous_scale = os.environ.get("COURSE_SCALE")
    os.environ["COURSE_SCALE"] = scale
    try:
        pm.execute_notebook(str(nb), str(out), parameters={"SCALE": scale}, cwd=str(nb.parent),
                            kernel_name="python3", progress_bar=progress_bar, config=kernel_config(),
                            **CLIENT_OPTIONS)
    except pm.PapermillExecutionError as err:
        first = next((l for l in err.source.splitlines() if l.strip()), "")
        error = (f"cell {lesson_cell_index(out, err.cell_index)} of notebooks/{nb.name} "
                 f"(In [{err.exec_count}]: {first.strip()[:80]})\n"
                 f"    {err.ename}: {err.evalue[:1500]}")
    except Exception as err:  # kernel died, timeout, ...: keep going, report every broken lesson
        error = f"{type(err).__name__}: {str(err)[-1500:]}"
    finally:
        if previous_scale is None:
            os.environ.pop("COURSE_SCALE", None)
        else:
            os.environ["COURSE_SCALE"] = previous_scale
    seconds = time.time() - start
    figures = json.loads(headline_file.read_text()) if headline_file.exists() else {}
    return {"name": nb.stem, "seconds": seconds, "figures": figures, "error": error,
            "threads": os.environ.get("OMP_NUM_THREADS", "all")}


def _execute_in_worker(nb: Path, out: Path, scale: str) -> dict:
    return execute(nb, out, scale, progress_bar=False)


def _limit_threads(threads: int) -> None:
    """Worker start-up: kernels it launches inherit the environment, and torch reads these."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_jobs(scale: str, count: int) -> int:
    """One lesson at a time on a GPU (the lessons would share one device), else two if there are
    two cores and two lessons."""
    return 1 if scale == "gpu" else max(1, min(2, usable_cores(), count))


def lesson_cell_index(executed: Path, index: int) -> int:
    """Index in the lesson of cell ``index`` of its executed copy, which papermill gave one more
    cell (the injected parameters) after the parameters cell."""
    try:
        cells = nbformat.read(executed, as_version=4).cells
    except (OSError, ValueError):
        return index
    return index - sum(1 for c in cells[:index] if "injected-parameters" in c.metadata.get("tags", []))


def report(result: dict, out: Path) -> None:
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    if result["error"]:
        print(f"FAILED {result['name']} after {result['seconds']:.0f} s at {result['error']}\n"
              f"    the executed notebook, with the error, is {where}", flush=True)
        return
    print(f"{result['name']} done in {result['seconds']:.0f} s -> {where}", flush=True)
    for k, v in result["figures"].items():
        print(f"    {k}: {readable(k, v)}", flush=True)


def committed_times(scale: str) -> dict:
    """The README's measured times for ``scale`` (docs/lesson_times.json), {} where there are none."""
    committed = course_site.read_json_dict(ROOT / "docs" / "lesson_times.json").get(scale, {})
    return committed if isinstance(committed, dict) else {}


def times_file(scale: str, jobs: int) -> Path:
    """Where a run's lesson times go: build/times-SCALE.json for the course as `make course` runs
    it (``default_jobs``: two lessons at a time on a 2-core machine, one on a GPU), which the next
    run orders by and ``tools/gpu_budget.py --record`` stores; build/alone-times-SCALE.json for any
    other number at a time (``--jobs 1`` on that machine gives each lesson every core), so that the
    two kinds of time never mix in one file."""
    as_the_course_runs = jobs == default_jobs(scale, 2)
    return BUILD / (f"times-{scale}.json" if as_the_course_runs else f"alone-times-{scale}.json")


def record_times(results: list[dict], scale: str, jobs: int) -> None:
    """Each lesson's latest time, in ``times_file(scale, jobs)``. A failed lesson keeps its last
    finished time: it stopped early, and its time would schedule it late in the next run."""
    path = times_file(scale, jobs)
    times = {**course_site.read_json_dict(path),
             **{r["name"]: round(r["seconds"], 1) for r in results if not r.get("error")}}
    path.write_text(json.dumps(times, indent=1, sort_keys=True))


def run(scale: str, only: list[str], jobs: int | None = None) -> int:
    notebooks = lessons(only)
    jobs = default_jobs(scale, len(notebooks)) if jobs is None else jobs
    if jobs < 1:
        sys.exit(f"--jobs must be at least 1, got {jobs}")
    BUILD.mkdir(exist_ok=True)
    results, start = [], time.time()

    def finished(result: dict) -> None:
        report(result, BUILD / f"{result['name']}.ipynb")
        results.append(result)
        results.sort(key=lambda r: r["name"])
        record_times(results, scale, jobs)
        try:   # the site is a view of the run: a failure to draw it must not stop the lessons
            course_site.build_site(BUILD, errors={r["name"]: r["error"] for r in results if r["error"]},
                                   export=[result["name"]])
        except Exception as err:  # noqa: BLE001
            print(f"(the site was not rebuilt: {type(err).__name__}: {err}; `make site` retries)", flush=True)

    if jobs == 1:
        for i, nb in enumerate(notebooks, 1):
            print(f"\n=== [{i}/{len(notebooks)}] {nb.stem} (SCALE={scale})", flush=True)
            finished(execute(nb, BUILD / nb.name, scale))
    else:
        threads = max(1, usable_cores() // jobs)
        print(f"=== {len(notebooks)} lessons at SCALE={scale}, {jobs} at a time, {threads} torch "
              f"thread(s) each (--jobs 1: one at a time, with a progress bar per cell)", flush=True)
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_limit_threads,
                                 initargs=(threads,)) as pool:
            # longest first by the last run's times (build/times-SCALE.json, else the committed
            # docs/lesson_times.json, so a fresh clone does not start its longest lesson last;
            # unknown ones keep the lesson order after them), so the two workers finish together
            times = {**committed_times(scale), **course_site.read_json_dict(BUILD / f"times-{scale}.json")}
            order = sorted(notebooks, key=lambda nb: -float(times.get(nb.stem, 0.0)))
            running = {pool.submit(_execute_in_worker, nb, BUILD / nb.name, scale): nb for nb in order}
            for future in tqdm(as_completed(running), total=len(running), unit="lesson",
                               desc=f"lessons, {jobs} at a time"):
                print(f"\n=== [{len(results) + 1}/{len(notebooks)}] ", end="", flush=True)
                finished(future.result())
    wall = time.time() - start
    print(f"\n=== {len(results)} lesson(s) in {wall:.0f} s wall-clock ({jobs} at a time; "
          f"{sum(r['seconds'] for r in results):.0f} s summed over lessons); "
          f"results page: {(BUILD / 'index.html').relative_to(ROOT)}")
    for r in results:
        status = "FAILED" if r["error"] else "ok"
        print(f"    {r['name']:<32} {r['seconds']:>5.0f} s  {status}")
    failures = [r["name"] for r in results if r["error"]]
    if failures:
        print(f"\n{len(failures)} notebook(s) failed: {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="default", choices=["ci", "default", "gpu"])
    p.add_argument("--jobs", type=int, default=None,
                   help="lessons run at once (default: 2 on a CPU machine with 2+ cores, 1 at gpu scale)")
    p.add_argument("--plan", action="store_true",
                   help="run nothing: print each lesson's measured ci/default time and its gpu time "
                        "predicted on a T4 (tools/gpu_budget.py)")
    p.add_argument("only", nargs="*", help="notebook prefixes to run, e.g. 01 04 (default: all)")
    args = p.parse_args()
    if args.plan:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import gpu_budget
        sys.exit(gpu_budget.main([]))
    sys.exit(run(args.scale, args.only, args.jobs))
