"""The gpu preset, measured: SimCLR with a CIFAR ResNet-18 on CIFAR-10, on one CUDA GPU.

Target (issue 3): kNN top-1 >= 80% within 15 minutes of training on one H100-class GPU. kNN is
the InstDisc/MoCo weighted vote (k=200, T=0.1) of all 50 000 training features against the
10 000 test images, on the frozen backbone (`course_utils.evaluate.knn_accuracy`).

What to expect (reference figures, not measured by this kit yet: CI has no GPU and no lent GPU
can download CIFAR-10). Public ResNet-18 CIFAR-10 SimCLR benchmarks with batch 512 and SGD
(lightly's benchmark table) report kNN ≈ 0.83 after 200 epochs and ≈ 0.89 after 800. An epoch is
50 000 images, 100 000 views with backward; at the ~10 000 images/s that bf16 + channels_last
should give on an H100, 15 minutes buys about 150 epochs, enough for ≈ 0.80 if the schedule is
set for that length (it is: the cosine schedule spans `--epochs`, and `--minutes` only guards).
The script prints what it measured; record it in the issue rather than trusting these numbers.

    python benchmarks/gpu_simclr_cifar10.py              # CUDA + data/cifar-10-batches-py
    python benchmarks/gpu_simclr_cifar10.py --download   # fetch CIFAR-10 first (needs internet)
    python benchmarks/gpu_simclr_cifar10.py --smoke      # CPU, embedded "shapes", a few steps

A full run writes benchmarks/results/gpu_simclr_cifar10.json; --smoke writes only with --out.
Everything it uses is the kit's own code: load_dataset, SimCLRAugment (batched, on the GPU),
SimCLR + nt_xent_loss, make_step, fit, extract_features, knn_accuracy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.augment import SimCLRAugment  # noqa: E402
from course_utils.data import load_dataset  # noqa: E402
from course_utils.evaluate import knn_probe  # noqa: E402
from course_utils.models import ProjectionHead, build_encoder  # noqa: E402
from course_utils.objectives import SimCLR, make_step  # noqa: E402
from course_utils.runtime import seed_everything  # noqa: E402
from course_utils.train import Callback, EvalEvery, fit  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "gpu_simclr_cifar10.json"
FULL = dict(dataset="cifar10", image_size=32, encoder="resnet18", batch=512, epochs=150, minutes=15.0,
            lr_per_128=0.06, warmup_epochs=2, weight_decay=5e-4, temperature=0.2, knn_k=200,
            train_limit=None, test_limit=None, eval_every_epochs=25)
SMOKE = dict(FULL, dataset="shapes", encoder="resnet", batch=32, epochs=2, minutes=2.0, knn_k=20,
             train_limit=128, test_limit=64, eval_every_epochs=1)


class TimeLimit(Callback):
    """Stop training once `seconds` of training time have passed (evaluation time excluded)."""

    def __init__(self, seconds: float, clock):
        self.seconds, self.clock = seconds, clock

    def on_step_end(self, state):
        if self.clock.training_seconds() > self.seconds:
            state.stop = True
            state.stop_reason = f"time limit of {self.seconds / 60:.1f} minutes reached"


class TrainingClock:
    """Wall-clock seconds spent in training steps (synchronised on CUDA), pausable for evals."""

    def __init__(self, device):
        self.device, self.total, self._start = device, 0.0, None

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self):
        self._sync()
        self._start = time.perf_counter()

    def pause(self):
        self._sync()
        self.total += time.perf_counter() - self._start
        self._start = None

    def training_seconds(self):
        running = time.perf_counter() - self._start if self._start is not None else 0.0
        return self.total + running


def cosine_with_warmup(optimizer, warmup_steps: int, total_steps: int):
    """Linear warm-up to the base LR over ``warmup_steps``, then cosine decay to 0."""
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / max(1, warmup_steps),
                                               total_iters=max(1, warmup_steps - 1))
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup_steps))
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_steps])


def run(cfg: dict, device: torch.device, download: bool = False) -> dict:
    seed_everything(0)
    train = load_dataset(cfg["dataset"], "train", image_size=cfg["image_size"], device=device,
                         download=download, limit=cfg["train_limit"])
    test = load_dataset(cfg["dataset"], "test", image_size=cfg["image_size"], device=device,
                        download=download, limit=cfg["test_limit"])
    encoder_kwargs = {"width": 8} if cfg["encoder"] == "resnet" else {}
    backbone = build_encoder(cfg["encoder"], cfg["image_size"], **encoder_kwargs)
    model = SimCLR(backbone, ProjectionHead(backbone.feature_dim, 2048, 128),
                   temperature=cfg["temperature"]).to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    steps_per_epoch = len(train) // cfg["batch"]
    if steps_per_epoch < 1:
        raise ValueError(f"batch {cfg['batch']} is larger than the {len(train)} training images")
    lr = cfg["lr_per_128"] * cfg["batch"] / 128
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=cfg["weight_decay"])
    total_steps = steps_per_epoch * cfg["epochs"]
    schedule = cosine_with_warmup(optimizer, steps_per_epoch * cfg["warmup_epochs"], total_steps)
    # CIFAR recipe of SimCLR: crops down to 8% of the image, colour strength 0.5, no blur
    augment = SimCLRAugment(cfg["image_size"], crop_scale=(0.08, 1.0), color_strength=0.5)
    generator = torch.Generator(device=device).manual_seed(0)

    def views(images, gen):
        view = augment(images, gen)
        return view.contiguous(memory_format=torch.channels_last) if cuda else view

    step = make_step(model, optimizer, augment=views, generator=generator,
                     autocast=torch.bfloat16 if cuda else None, scheduler=schedule)

    clock = TrainingClock(device)

    def knn_with_clock_paused():
        clock.pause()
        knn = knn_probe(backbone, train, test, k=cfg["knn_k"], batch_size=1024)
        print(f"kNN {knn:.4f} after {clock.training_seconds() / 60:.1f} min of training", flush=True)
        clock.start()
        return {"knn": knn, "training_minutes": clock.training_seconds() / 60}

    # every eval_every_epochs epochs, and once more when training ends (step count or time limit)
    evaluator = EvalEvery(steps_per_epoch * cfg["eval_every_epochs"], knn_with_clock_paused, at_end=True)
    callbacks = [TimeLimit(cfg["minutes"] * 60, clock), evaluator]
    clock.start()
    history = fit(step, train.batches(cfg["batch"], seed=0),
                  steps=total_steps, callbacks=callbacks, desc="SimCLR ResNet-18 CIFAR-10")
    clock.pause()
    seconds = clock.training_seconds()
    steps_done = len(history.records)
    curve = [{"epoch": e["step"] / steps_per_epoch, "knn": e["knn"], "training_minutes": e["training_minutes"]}
             for e in history.evals]
    final_knn = curve[-1]["knn"]
    losses = history.series("loss")
    return {"config": cfg, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__, "steps": steps_done, "epochs": steps_done / steps_per_epoch,
            "training_minutes": seconds / 60, "images_per_s": steps_done * cfg["batch"] / seconds,
            "views_per_s": 2 * steps_done * cfg["batch"] / seconds, "final_loss": losses[-1],
            "knn_top1": final_knn, "knn_curve": curve,
            "target": {"knn_top1": 0.80, "training_minutes": 15.0},
            "target_met": bool(final_knn >= 0.80 and seconds <= 15 * 60 + 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, embedded shapes, a few steps")
    p.add_argument("--download", action="store_true", help="download CIFAR-10 into data/ first")
    p.add_argument("--epochs", type=int, help="override the number of epochs (schedule length)")
    p.add_argument("--minutes", type=float, help="override the training time limit")
    p.add_argument("--out", type=Path, help="where to write the JSON result")
    args = p.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.epochs is not None:
        cfg["epochs"] = args.epochs
    if args.minutes is not None:
        cfg["minutes"] = args.minutes
    if args.smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("This benchmark needs a CUDA GPU and torch sees none. On Colab choose Runtime > "
              "Change runtime type > GPU; to check the script on a CPU run it with --smoke.",
              file=sys.stderr)
        return 2
    result = run(cfg, device, download=args.download)
    out = args.out if args.out is not None else (None if args.smoke else RESULT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("config", "knn_curve")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
