"""Training-memory predictor vs measurement, and what recomputation costs.

    python benchmarks/bench_memory.py [--quick]   -> benchmarks/results/memory.json

- predictor: measured/predicted for stored activations, parameters and optimizer state
  (ledger on CPU; CUDA peak from the allocator when a GPU is present) over TinyGPT
  configurations x recomputation modes and two of the kit's models.
- recomputation: stored-activation ratio (memory kept) vs FLOP and wall-time ratios (paid),
  each relative to no recomputation.
- bf16 autocast: per-sample activation bytes bf16 / fp32; optimizer bytes bf16 / fp32.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils import memory as M  # noqa: E402
from course_utils.ledger import measure  # noqa: E402
from course_utils.experiments.training_memory import measure_tinygpt, recompute_tradeoff
from course_utils.models import MLP, SmallResNet  # noqa: E402
from course_utils.optim import make_optimizer  # noqa: E402

TINYGPT = {  # name: (layers, hidden, heads, vocab, seq, batch)
    "L1 h32 s16 b2": (1, 32, 4, 50, 16, 2),
    "L2 h64 s32 b3": (2, 64, 4, 97, 32, 3),
    "L3 h48 s24 b4": (3, 48, 6, 64, 24, 4),
    "L4 h128 s64 b8": (4, 128, 8, 256, 64, 8),
}


def _kit_model_rows(device):
    rows = []
    for name, model, shape in [("MLP 3x128 b32", MLP(64, 128, 10, layers=3), (32, 64)),
                               ("SmallResNet w8 b8", SmallResNet(8, num_classes=10), (8, 3, 16, 16))]:
        model = model.to(device)
        opt = make_optimizer("adam", model.parameters())
        x, y = torch.rand(shape, device=device), torch.randint(10, (shape[0],), device=device)

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        step()
        rec = measure(step, model=model, optimizer=opt)
        pred = M.model_memory(model, shape, optimizer="adam")
        rows.append({"config": name, "recompute": "none",
                     "activations": rec.activation_bytes / pred["activations"],
                     "params": rec.param_bytes / pred["params"],
                     "optimizer": rec.optimizer_bytes / pred["optimizer"]})
    return rows


def run(quick: bool) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    configs = dict(list(TINYGPT.items())[: 3 if quick else 4])
    predictor = []
    for name, cfg in configs.items():
        for mode in M.RECOMPUTE_MODES:
            rec, _ = measure_tinygpt(*cfg, recompute=mode, steps=2, device=device)
            pred = M.transformer_memory(*cfg, recompute=mode)
            row = {"config": name, "recompute": mode,
                   "activations": rec.activation_bytes / pred["activations"],
                   "params": rec.param_bytes / pred["params"],
                   "optimizer": rec.optimizer_bytes / pred["optimizer"]}
            if rec.peak_bytes is not None:  # CUDA: allocator peak over predicted activations+grads
                row["cuda_peak_over_activations_plus_grads"] = rec.peak_bytes / (
                    pred["activations"] + pred["grads"])
            predictor.append(row)
    predictor += _kit_model_rows(device)

    big = (4, 128, 8, 256, 64, 4) if quick else (6, 192, 8, 256, 128, 8)
    recompute = recompute_tradeoff(*big, device=device, repeats=2 if quick else 5)

    def slope(autocast):
        a = measure_tinygpt(2, 64, 4, 97, 32, 4, autocast=autocast, steps=2, device=device)[0]
        b = measure_tinygpt(2, 64, 4, 97, 32, 8, autocast=autocast, steps=2, device=device)[0]
        return b.activation_bytes - a.activation_bytes, a.optimizer_bytes
    (fp32_slope, fp32_opt), (bf16_slope, bf16_opt) = slope(False), slope(True)

    worst = max(abs(r["activations"] - 1) for r in predictor)
    return {
        "device": device,
        "predictor": predictor,
        "predictor_worst_activation_error": worst,
        "recompute_config": dict(zip(("layers", "hidden", "heads", "vocab", "seq", "batch"), big)),
        "recompute": [{k: r[k] for k in ("mode", "memory_ratio", "flops_ratio", "time_ratio",
                                         "activation_bytes", "seconds")} for r in recompute],
        "bf16_autocast": {"per_sample_activation_ratio": bf16_slope / fp32_slope,
                          "optimizer_ratio": bf16_opt / fp32_opt},
    }


def main():
    quick = "--quick" in sys.argv
    results = run(quick)
    out = ROOT / "benchmarks" / "results" / "memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"device {results['device']}; measured/predicted:")
    for r in results["predictor"]:
        print(f"  {r['config']:<20} {r['recompute']:<9} activations {r['activations']:.4f}  "
              f"params {r['params']:.3f}  optimizer {r['optimizer']:.3f}")
    print("recomputation (relative to none):")
    for r in results["recompute"]:
        print(f"  {r['mode']:<9} memory kept {r['memory_ratio']:.3f}  FLOPs {r['flops_ratio']:.3f}  "
              f"time {r['time_ratio']:.3f}")
    bf = results["bf16_autocast"]
    print(f"bf16 autocast: per-sample activations x{bf['per_sample_activation_ratio']:.3f}, "
          f"optimizer state x{bf['optimizer_ratio']:.3f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
