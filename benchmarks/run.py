"""Run every benchmark in this folder; write benchmarks/results/<area>.json and a summary.

    python benchmarks/run.py            # all, full size
    python benchmarks/run.py --quick    # all, small: printed, never written to results/
    python benchmarks/run.py ledger     # only bench_ledger.py
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


@functools.lru_cache(maxsize=None)   # main reads a benchmark's RUN_ALONE, then run_one runs it: one import
def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_one(path: Path, quick: bool, keep=None, **options) -> dict:
    """Run one benchmark (``options``: its own ``run`` arguments, e.g. the SSL benchmark's seeds);
    ``keep``, if given, maps the new result to the one written (e.g. with the run it replaces)."""
    start = time.time()
    result = load(path).run(quick=quick, **options)
    result = {"benchmark": path.stem, "quick": quick, "seconds": round(time.time() - start, 2), **result}
    if keep is not None:
        result = keep(result)
    if not quick:  # results/ holds full runs only: their figures are the ones goals are judged on
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{path.stem.removeprefix('bench_')}.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("only", nargs="*")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    paths = sorted(HERE.glob("bench_*.py"))
    if args.only:
        paths = [q for q in paths if q.stem.removeprefix("bench_") in args.only]
    for path in paths:
        print(f"=== {path.stem}", flush=True)
        alone = getattr(load(path), "RUN_ALONE", None)
        if alone and not args.quick:   # its full run must keep the result it replaces
            print(f"skipped: {alone}", flush=True)
            continue
        result = run_one(path, args.quick)
        print(json.dumps(result.get("summary", result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
