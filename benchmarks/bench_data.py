"""Data and augmentation: how fast the embedded data is made and augmented, and how hard it is.

- shapes generation: seconds per 1000 images (uncached, `make_shapes`);
- SimCLR augmentation: milliseconds per view of a batch on this machine's CPU;
- colour shortcut: how often two views of one image are matched by colour statistics alone;
- difficulty: a linear probe on raw pixels vs. a small supervised encoder trained briefly, both
  on "shapes". Raw pixels stay near chance (12.5%): colour, position, rotation and texture are
  nuisances; shape must be learned.
"""
from __future__ import annotations

import time

import torch

from course_utils import augment
from course_utils.data import load_dataset, make_shapes
from course_utils.evaluate import linear_probe
from course_utils.models import SmallResNet
from course_utils.objectives import Supervised, make_step
from course_utils.train import fit


def _seconds(fn, repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def generation(quick: bool) -> dict:
    n = 1000 if quick else 5000
    seconds = _seconds(lambda: make_shapes(n, seed=123))
    return {"images": n, "seconds": round(seconds, 3), "seconds_per_1000": round(1000 * seconds / n, 3)}


def augmentation(quick: bool) -> dict:
    batch = 64 if quick else 256
    x = load_dataset("shapes", "test", limit=batch).images
    aug = augment.SimCLRAugment(32, blur=True)
    g = torch.Generator().manual_seed(0)
    seconds = _seconds(lambda: aug(x, g), repeats=3)
    return {"batch": batch, "ms_per_view": round(1000 * seconds, 1),
            "us_per_image": round(1e6 * seconds / batch, 1)}


def colour_shortcut(quick: bool) -> dict:
    """Can two views of one image be matched by colour alone? Features: per-channel mean and
    std of each view (6 numbers); score: how often view 2's nearest neighbour among all
    view-1 features is its own image (chance 1/batch). High without colour jitter = shortcut."""
    batch = 256 if quick else 1024
    x = load_dataset("shapes", "test", limit=batch).images
    result = {"batch": batch, "chance": 1 / batch}
    for name, aug in (("no_color", augment.SimCLRAugment(32, color=False)),
                      ("color", augment.SimCLRAugment(32, color=True))):
        g = torch.Generator().manual_seed(0)
        v1, v2 = aug.two_views(x, g)
        f1 = torch.cat([v1.mean((2, 3)), v1.std((2, 3))], 1)                 # B×6
        f2 = torch.cat([v2.mean((2, 3)), v2.std((2, 3))], 1)
        match = torch.cdist(f2, f1).argmin(1) == torch.arange(batch)
        result[f"match_rate_{name}"] = round(match.float().mean().item(), 4)
    return result


def difficulty(quick: bool) -> dict:
    """Raw-pixel linear probe vs. a briefly trained SmallResNet, on shapes at 16 px."""
    image, n_train = 16, (500 if quick else 4000)
    steps = 10 if quick else 600
    train = load_dataset("shapes", "train", image_size=image)
    test = load_dataset("shapes", "test", image_size=image)
    raw = linear_probe(train.images[:n_train].flatten(1), train.labels[:n_train],
                       test.images.flatten(1), test.labels)

    torch.manual_seed(0)
    model = SmallResNet(width=16, num_classes=len(train.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=5e-4)

    def crop_and_flip(x, g):
        x = augment.random_resized_crop(x, image, scale=(0.5, 1.0), generator=g)
        return augment.horizontal_flip(x, generator=g)

    step = make_step(Supervised(model), opt, augment=crop_and_flip, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    fit(step, train.batches(128), steps=steps, progress=False)
    train_seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        encoder = sum((model(x).argmax(1) == y).sum().item()
                      for x, y in test.batches(500, shuffle=False, drop_last=False)(0)) / len(test)
    return {"image_size": image, "chance": 1 / len(train.classes),
            "raw_pixel_linear_probe": round(raw, 4), "raw_probe_train_images": n_train,
            "supervised_resnet_w16_accuracy": round(encoder, 4), "supervised_steps": steps,
            "supervised_seconds": round(train_seconds, 1)}


def run(quick: bool = False) -> dict:
    gen, aug, hard = generation(quick), augmentation(quick), difficulty(quick)
    shortcut = colour_shortcut(quick)
    return {"generation": gen, "augmentation": aug, "difficulty": hard, "colour_shortcut": shortcut,
            "summary": {"shapes_seconds_per_1000": gen["seconds_per_1000"],
                        "simclr_view_ms": aug["ms_per_view"],
                        "raw_pixel_probe": hard["raw_pixel_linear_probe"],
                        "supervised_encoder": hard["supervised_resnet_w16_accuracy"],
                        "view_match_by_colour_no_jitter": shortcut["match_rate_no_color"],
                        "view_match_by_colour_with_jitter": shortcut["match_rate_color"]}}


if __name__ == "__main__":
    import argparse
    import json
    from pathlib import Path
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    result = run(quick=parser.parse_args().quick)
    out = Path(__file__).parent / "results" / "data.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
