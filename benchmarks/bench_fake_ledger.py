"""The fake ledger's own cost: CPU seconds and peak process memory to measure a paper-size step.

Goals (issue 13): a 7B GPT-like step (the planner's defaults: fused attention, FSDP2's bf16
mixed-precision policy, AdamW; FSDP2 over 64 fake ranks, seq 4096, one sequence per rank) in
<= 60 CPU-s with <= 2 GiB peak RSS; ResNet-50 SimCLR at batch 4096 (224 px) in <= 30 CPU-s.
Issue 28: a 65B-class step (LLaMA-65B's shape: 80 layers of width 8192, 64 heads; MLP 4h, so
64.7 B parameters) over 1,024 fake ranks within the same 60 CPU-s and 2 GiB. Then how the cost
grows with layers and with ranks.

In a full run each configuration runs in a fresh process (``--one``), so its peak RSS is its own,
imports included; time is that process's CPU time for building and measuring (imports excluded).
A quick run (``--quick``, the test suite's) measures its small configurations in one process.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course_utils.models.transformer import GPT_SHAPES

# the planner's 7B shape (GPT_SHAPES, without its layer count: the benchmark varies it)
GPT_7B = dict(hidden=GPT_SHAPES["GPT 7B"]["hidden"], heads=GPT_SHAPES["GPT 7B"]["heads"],
              vocab=32000, seq=4096, batch=1)
GPT_65B = dict(GPT_7B, hidden=GPT_SHAPES["GPT 65B"]["hidden"], heads=GPT_SHAPES["GPT 65B"]["heads"])
GOALS = {"gpt7b_fsdp64": {"cpu_seconds": 60, "peak_rss_gib": 2.0},
         "gpt65b_fsdp1024": {"cpu_seconds": 60, "peak_rss_gib": 2.0},
         "simclr_resnet50_b4096": {"cpu_seconds": 30}}


def measure_one(config: dict) -> dict:
    """Run one configuration here and report its ledger's headline, CPU time and peak RSS."""
    import torch

    from course_utils.ledger import fake_mode, fake_world
    from course_utils.experiments.planning import gpt_ledger, ssl_ledger
    torch.set_num_threads(1)
    start = time.process_time()
    if config["kind"] == "gpt":
        with fake_world(config["ranks"]) as mesh, fake_mode():
            shape = GPT_65B if config.get("shape") == "65b" else GPT_7B
            rec = gpt_ledger(layers=config["layers"], **shape, strategy="fsdp", mesh=mesh)
    else:
        with fake_mode():
            rec = ssl_ledger("simclr", config["batch"], image_size=config["image_size"])
    return {**config, "cpu_seconds": round(time.process_time() - start, 2),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3),
            "tflops": rec.flops / 1e12, "resident_gb": rec.resident_bytes / 1e9,
            "activation_gb": rec.activation_bytes / 1e9, "comm_gb": rec.comm_bytes / 1e9}


def in_fresh_process(configs: list[dict]) -> list[dict]:
    """Measure ``configs`` one after another in one new process (peak RSS is then the largest)."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, __file__, "--one", json.dumps(configs)], cwd=root,
                         capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict:
    deep = GPT_SHAPES["GPT 7B"]["layers"]
    layers = (1, 2) if quick else (deep // 8, deep // 4, deep // 2, deep)
    ranks = (8, 64) if quick else (8, 64, 512)
    headline = {"gpt7b_fsdp64": dict(kind="gpt", layers=2 if quick else deep, ranks=64),
                "gpt65b_fsdp1024": dict(kind="gpt", shape="65b", layers=2 if quick else GPT_SHAPES["GPT 65B"]["layers"],
                                        ranks=64 if quick else 1024),
                "simclr_resnet50_b4096": dict(kind="simclr", batch=256 if quick else 4096,
                                              image_size=64 if quick else 224)}
    configs = {**{f"layers {n}": dict(kind="gpt", layers=n, ranks=64) for n in layers},
               **{f"ranks {n}": dict(kind="gpt", layers=layers[-1] // 2 or 1, ranks=n) for n in ranks},
               **headline}
    # each distinct configuration runs once (the headline 7B step is also the deepest layers
    # point); a full run gives each its own process, two at a time, so that each reports its own
    # CPU time and peak RSS; a quick run (a smoke test of this file) measures all in one process
    distinct = sorted({json.dumps(c, sort_keys=True) for c in configs.values()})
    if quick:
        measured = dict(zip(distinct, in_fresh_process([json.loads(c) for c in distinct])))
    else:
        with ThreadPoolExecutor(max_workers=2) as pool:
            measured = dict(zip(distinct, pool.map(
                lambda c: in_fresh_process([json.loads(c)])[0], distinct)))
    got = {name: measured[json.dumps(c, sort_keys=True)] for name, c in configs.items()}
    results = {name: got[name] for name in headline}
    by_layers = [got[f"layers {n}"] for n in layers]
    by_ranks = [got[f"ranks {n}"] for n in ranks]
    met = {name: all(results[name][k] <= limit for k, limit in GOALS[name].items()) for name in GOALS}
    return {"headline": results, "growth_with_layers": by_layers, "growth_with_ranks": by_ranks,
            "summary": {**{f"{n} {k}": results[n][k] for n in results for k in ("cpu_seconds", "peak_rss_gib")},
                        "cpu_seconds_by_layers": {r["layers"]: r["cpu_seconds"] for r in by_layers},
                        "cpu_seconds_by_ranks": {r["ranks"]: r["cpu_seconds"] for r in by_ranks},
                        "goals": GOALS, "goals_met": met}}


if __name__ == "__main__":
    if "--one" in sys.argv:
        print(json.dumps([measure_one(c) for c in json.loads(sys.argv[sys.argv.index("--one") + 1])]))
        sys.exit(0)
    sys.path.insert(0, str(Path(__file__).parent))
    from run import run_one
    print(json.dumps(run_one(Path(__file__), quick="--quick" in sys.argv)["summary"], indent=1))
