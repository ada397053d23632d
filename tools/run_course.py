"""`make course`: execute every lesson notebook with papermill into build/, print headline figures.

Each notebook records its headline figures with ``course_utils.report.headline`` into the file
named by $COURSE_HEADLINE_FILE, which this runner sets per notebook.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import papermill as pm

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


def run(scale: str, only: list[str]) -> int:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(nb.stem.startswith(o) for o in only)]
        if not notebooks:
            sys.exit(f"no notebook matches {only}; names start with 00, 01, ...")
    BUILD.mkdir(exist_ok=True)
    failures, summary = [], []
    for nb in notebooks:
        out = BUILD / nb.name
        headline_file = BUILD / "headlines" / f"{nb.stem}.json"
        headline_file.unlink(missing_ok=True)
        os.environ["COURSE_HEADLINE_FILE"] = str(headline_file)
        print(f"=== {nb.stem} (SCALE={scale}) -> {out.relative_to(ROOT)}", flush=True)
        start = time.time()
        try:
            pm.execute_notebook(str(nb), str(out), parameters={"SCALE": scale},
                                cwd=str(nb.parent), kernel_name="python3", progress_bar=False)
        except Exception as err:  # keep going: report every broken lesson, then fail
            failures.append(nb.stem)
            print(f"FAILED {nb.stem}: {type(err).__name__}: {str(err)[-2000:]}", flush=True)
            continue
        figures = json.loads(headline_file.read_text()) if headline_file.exists() else {}
        summary.append((nb.stem, time.time() - start, figures))
    print("\n=== headline figures")
    for name, seconds, figures in summary:
        print(f"{name}  ({seconds:.0f} s)")
        for k, v in figures.items():
            print(f"    {k}: {v:.4g}" if isinstance(v, float) else f"    {k}: {v}")
    if failures:
        print(f"\n{len(failures)} notebook(s) failed: {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", default="default", choices=["ci", "default", "gpu"])
    p.add_argument("only", nargs="*", help="notebook prefixes to run, e.g. 01 04 (default: all)")
    args = p.parse_args()
    sys.exit(run(args.scale, args.only))
