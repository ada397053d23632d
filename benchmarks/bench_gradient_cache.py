"""More candidates without more back-propagated images: how large a SimCLR batch fits a memory cap.

At a cap on kept-for-backward bytes (1 GiB) on lesson 02's backbone (SmallResNet width 16) at 32 px:
the largest batch N for

- naive:                    one graph over all 2N views and the plain NT-Xent (2N×2N logits kept)
- gradient caching:         chunks of ``CHUNK`` images back-propagated one at a time, plain loss
- gradient caching + tiled: the same with ``nt_xent_loss_tiled`` (the loss keeps O(N·d))

Kept-for-backward is measured by the ledger at several batch sizes per method and extrapolated with
the form each method predicts (naive: a + bN + cN²; caching: the larger of one chunk's encoder graph
and the loss's graph); the forms are checked against the measurements. Gradient caching also holds,
outside any graph, both views of all N images and the cached z and z.grad: that line is added to
its side of the cap (``held_across_chunks``). The largest batches are extrapolations of those forms
far beyond the measured sizes: they count these lines only, not the encoder's backward temporaries. Goals: gradient caching +
tiled fits >= 16x the naive batch; its time per image is within 1.6x of naive where both fit (it
pays one extra encoder forward), the median of five interleaved rounds of five steps each, with
the rounds' spread reported (core-seconds move with machine load, so one round proves little). Tiled loss alone at N = 8192, d = 128: kept-for-backward <= 5%
of the plain loss's.
"""
from __future__ import annotations

import numpy as np
import torch

from course_utils.augment import SimCLRAugment
from course_utils.ledger import measure, step_utilisation
from course_utils.experiments.training_memory import nt_xent_kept_bytes
from course_utils.models import ProjectionHead, SmallResNet
from course_utils.objectives import SimCLR, make_step
from course_utils.runtime import core_seconds

CAP_BYTES, IMAGE_SIZE, CHUNK, TILE, PROJ_DIM = 2**30, 32, 32, 256, 64
METHODS = {"naive": dict(chunks=None, tile=None), "gradient caching": dict(chunks=CHUNK, tile=None),
           "gradient caching + tiled": dict(chunks=CHUNK, tile=TILE)}


def _step(method: str, n: int):
    torch.manual_seed(0)
    backbone = SmallResNet(width=16)
    model = SimCLR(backbone, ProjectionHead(backbone.feature_dim, 128, PROJ_DIM), temperature=0.5,
                   tile=METHODS[method]["tile"])
    chunks = n // METHODS[method]["chunks"] if METHODS[method]["chunks"] else 1
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.rand(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    step = make_step(model, opt, augment=SimCLRAugment(IMAGE_SIZE),
                     generator=torch.Generator().manual_seed(0), chunks=chunks)
    return model, step, images


def kept_bytes(method: str, n: int) -> int:
    model, step, images = _step(method, n)
    return measure(lambda: step(images), model=model).activation_bytes


def _largest_under_cap(predict) -> int:
    grid = np.unique(np.round(np.geomspace(CHUNK, 2**24, 4000) / CHUNK) * CHUNK)
    fits = [int(n) for n in grid if predict(n) <= CAP_BYTES]
    return max(fits) if fits else 0


def largest_batch(method: str, sizes: list[int], loss_sizes: list[int]) -> dict:
    """Predict kept(N) in the method's form, check it against the step measured at ``sizes``, and
    solve kept(N) <= cap. Naive: a + bN + cN² fitted on the steps themselves (exact on three
    points). Caching: max(one chunk's graph, the loss's graph at N), the loss's part fitted on the
    loss alone at ``loss_sizes`` (where it, not the chunk, decides)."""
    kept = [kept_bytes(method, n) for n in sizes]
    if METHODS[method]["chunks"] is None:
        coef = np.polyfit(np.array(sizes[:3], float), np.array(kept[:3], float), 2)
        predict = lambda n: float(np.polyval(coef, n))                      # noqa: E731
        held = lambda n: 0.0                                                # noqa: E731
    else:
        chunk_graph = max(kept)
        loss = [nt_xent_kept_bytes(n, PROJ_DIM, tile=METHODS[method]["tile"]) for n in loss_sizes]
        coef = np.polyfit(np.array(loss_sizes, float), np.array(loss, float), 2)
        predict = lambda n: max(chunk_graph, float(np.polyval(coef, n)))   # noqa: E731
        held = held_across_chunks
    errors = [abs(predict(n) - k) / k for n, k in zip(sizes, kept)]
    return {"measured_kept_bytes": dict(zip(map(str, sizes), kept)), "fit": coef[::-1].tolist(),
            "prediction_rel_error": max(errors),
            "largest_batch_under_cap": _largest_under_cap(lambda n: predict(n) + held(n))}


def held_across_chunks(n: int) -> float:
    """What gradient caching holds outside any autograd graph from its first pass to its last:
    both views of all N images (fp32) and the cached embeddings z with their gradients z.grad.
    The naive step has no such line (its views are the inputs its graph keeps, already counted)."""
    return 2 * n * 3 * IMAGE_SIZE ** 2 * 4 + 2 * (2 * n * PROJ_DIM * 4)


def seconds_per_image(methods: tuple[str, ...], n: int, steps: int, rounds: int) -> dict:
    """Core-seconds per image of each method, timed in ``rounds`` interleaved rounds of ``steps``
    steps (method A, then B, then A again ...), so a change in machine load during the run falls on
    every method alike. Returns {"rounds": {method: [s/image per round]}, "median": {method: s},
    "ratio_per_round": [second method / first, per round], "utilisation": {method: FLOP/s and MFU
    of the median round}}."""
    built = {m: _step(m, n) for m in methods}
    for _, step, images in built.values():
        step(images)                                            # warm-up: allocator, thread pool
    per_round = {m: [] for m in methods}
    for _ in range(rounds):
        for m, (_, step, images) in built.items():
            start = core_seconds()
            for _ in range(steps):
                step(images)
            per_round[m].append((core_seconds() - start) / (steps * n))
    median = {m: float(np.median(v)) for m, v in per_round.items()}
    first, second = methods
    ratios = [b / a for a, b in zip(per_round[first], per_round[second])]
    utilisation = {m: step_utilisation(lambda step=step, images=images: step(images), median[m] * n)
                   for m, (_, step, images) in built.items()}
    return {"rounds": per_round, "median": median, "ratio_per_round": ratios,
            "utilisation": utilisation}


def tiled_loss_alone(n: int, d: int) -> dict:
    plain, tiled = nt_xent_kept_bytes(n, d), nt_xent_kept_bytes(n, d, tile=TILE)
    return {"n": n, "d": d, "plain_kept_bytes": plain, "tiled_kept_bytes": tiled, "ratio": tiled / plain}


def run(quick: bool = False) -> dict:
    sizes = [64, 128, 192] if quick else [64, 128, 256, 512]
    loss_sizes = [256, 512, 1024] if quick else [512, 1024, 2048, 4096]
    rows = {m: largest_batch(m, sizes, loss_sizes) for m in METHODS}
    naive_n = rows["naive"]["largest_batch_under_cap"]
    time_n, time_steps, time_rounds = (64, 1, 1) if quick else (256, 5, 5)
    timed = seconds_per_image(("naive", "gradient caching + tiled"), time_n,
                              steps=time_steps, rounds=time_rounds)
    timing, utilisation, ratios = timed["median"], timed["utilisation"], timed["ratio_per_round"]
    tiled = tiled_loss_alone(1024 if quick else 8192, 128)
    summary = {
        "cap_gib": CAP_BYTES / 2**30,
        **{f"largest_batch_{m.replace(' ', '_').replace('+', 'plus')}": r["largest_batch_under_cap"]
           for m, r in rows.items()},
        "caching_tiled_over_naive_batch": rows["gradient caching + tiled"]["largest_batch_under_cap"] / max(1, naive_n),
        "time_per_image_ratio_caching_tiled_over_naive": float(np.median(ratios)),
        "time_per_image_ratio_spread": [min(ratios), max(ratios)],
        "tiled_loss_kept_ratio": tiled["ratio"],
        **{f"step_mfu_{m.replace(' ', '_').replace('+', 'plus')}": u["mfu"] for m, u in utilisation.items()},
        "worst_prediction_rel_error": max(r["prediction_rel_error"] for r in rows.values()),
    }
    summary["goals_met"] = bool(summary["caching_tiled_over_naive_batch"] >= 16
                                and summary["time_per_image_ratio_caching_tiled_over_naive"] <= 1.6
                                and (quick or tiled["ratio"] <= 0.05))
    return {"config": dict(cap_bytes=CAP_BYTES, image_size=IMAGE_SIZE, backbone="SmallResNet(width=16)",
                           chunk_images=CHUNK, tile=TILE, step_sizes=sizes, loss_sizes=loss_sizes,
                           timing_batch=time_n, timing_steps_per_round=time_steps,
                           timing_rounds=time_rounds),
            "methods": rows, "seconds_per_image": timing, "seconds_per_image_rounds": timed["rounds"],
            "step_utilisation": utilisation,
            "tiled_loss_alone": tiled,
            "goals": {"caching_tiled_over_naive_batch": ">= 16", "time_per_image_ratio": "<= 1.6",
                      "tiled_loss_kept_ratio_at_8192": "<= 0.05"},
            "summary": summary}


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from run import run_one
    print(json.dumps(run_one(Path(__file__), quick="--quick" in sys.argv)["summary"], indent=1))
