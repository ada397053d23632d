"""Distributed training on real torch.distributed ranks: measured / predicted, as ratios.

    python benchmarks/bench_distributed.py [--quick]   -> benchmarks/results/distributed.json

- communication per step (DDP, torch ZeRO-1, FSDP2 with and without reshard-after-forward):
  bytes each rank sends under ring algorithms, computed from the counted collective payloads,
  over the formula (2(n-1)/n·Ψ, 3(n-1)/n·Ψ); and the bytes each rank process really wrote
  (Linux /proc/self/io, gloo) over the same formula.
- resident state per rank (params, grads, Adam state) measured / predicted per ZeRO stage.
- DDP vs one process on the concatenated batch: max parameter gap (fp32).
- pipeline bubble fractions: simulated / formula for GPipe, 1F1B, interleaved, zero-bubble.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.distributed import launch  # noqa: E402
from course_utils.distributed import pipeline as pp  # noqa: E402
from course_utils.distributed import sharding as sh  # noqa: E402
from course_utils.experiments import data_parallel as lesson07  # noqa: E402
from course_utils.experiments import sharding as lesson08  # noqa: E402

STAGE_OF = {"ddp": "ddp", "zero1": "zero1", "fsdp": "zero3", "fsdp_keep": "zero3"}
COMM_STAGE = {"ddp": "ddp", "fsdp": "zero3", "fsdp_keep": "zero2"}


def _comm_rows(per_rank, n):
    rows = []
    for strategy, r in per_rank[0].items():
        psi = r["param_bytes"]
        formula = (sh.predicted_comm_bytes(psi, n, COMM_STAGE[strategy]) if strategy in COMM_STAGE
                   else 3 * (n - 1) / n * psi)  # torch ZeRO-1: all-reduce + owners' broadcasts
        wire = r["comm"]["wire_bytes"]
        rows.append({"strategy": strategy, "ranks": n, "param_bytes": psi,
                     "ring_sent/formula": r["comm"]["ring_bytes_sent"] / formula,
                     "wire/formula": None if wire is None else wire / formula})
    return rows


def _state_rows(per_rank, n):
    rows = []
    for rank, result in enumerate(per_rank):
        for strategy, r in result.items():
            predicted = sh.predicted_state_bytes(r["n_params"], n, STAGE_OF[strategy])
            rows.append({"strategy": strategy, "rank": rank,
                         **{f"{k} measured/predicted": r["state"][k] / predicted[k] for k in predicted}})
    return rows


def _bubble_rows(quick):
    rows = []
    sizes = [(2, 4), (4, 8)] if quick else [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)]
    for p, m in sizes:
        for schedule, kwargs, formula in (
                ("gpipe", {}, pp.bubble_formula(p, m)),
                ("1f1b", {}, pp.bubble_formula(p, m)),
                ("interleaved", dict(forward=2, backward=4, chunks=2), pp.bubble_formula(p, m, 2)),
                ("zero_bubble", {}, pp.zero_bubble_formula(p, m))):
            t = pp.simulate(schedule, p, m, **kwargs)
            rows.append({"schedule": schedule, "p": p, "m": m,
                         "simulated/formula": t.bubble_fraction / formula})
    return rows


def run(quick: bool) -> dict:
    start = time.perf_counter()
    model = dict(width=64, depth=4, batch=8, steps=2) if quick else dict(width=512, depth=8, batch=32, steps=3)
    n = 2
    strategies = launch(lesson08.compare_strategies, n, model, timeout=600)
    equivalence = launch(lesson07.ddp_equivalence, n, dict(steps=3 if quick else 8), timeout=600)
    comm, state, bubbles = _comm_rows(strategies, n), _state_rows(strategies, n), _bubble_rows(quick)
    worst = lambda rows, key: max(abs(r[key] - 1) for r in rows if r[key] is not None)  # noqa: E731
    return {
        "quick": quick, "ranks": n, "model": model,
        "communication": comm, "state": state, "bubbles": bubbles,
        "ddp_max_param_gap_fp32": max(max(r[o]["max_abs_diff"]) for r in equivalence for o in lesson07.EQUIVALENCE_OPTIMIZERS),
        "summary": {
            "worst_abs(ring_sent/formula-1)": worst(comm, "ring_sent/formula"),
            "wire/formula": {r["strategy"]: r["wire/formula"] for r in comm},
            "worst_abs(state measured/predicted-1)": max(abs(v - 1) for r in state for k, v in r.items()
                                                          if k.endswith("predicted")),
            "worst_abs(bubble simulated/formula-1)": worst(bubbles, "simulated/formula"),
            "seconds": time.perf_counter() - start,
        },
    }


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv)
    out = ROOT / "benchmarks" / "results" / "distributed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for row in result["communication"]:
        print(f"{row['strategy']:>10}  ring sent / formula {row['ring_sent/formula']:.3f}   "
              f"wire / formula {row['wire/formula'] if row['wire/formula'] is None else round(row['wire/formula'], 3)}")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out.relative_to(ROOT)}")
