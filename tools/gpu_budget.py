"""How long each lesson takes at gpu scale on a free-tier Colab T4, predicted from the kit's own
ledger, beside the ci and default times measured on this machine.

    python tools/gpu_budget.py               # the table, and whether every lesson fits the budget
    python tools/gpu_budget.py --markdown    # the README's table
    python tools/gpu_budget.py --record      # copy build/times-{ci,default}.json (make course
                                             # at both scales) into docs/lesson_times.json

The model, per lesson:  seconds = fixed + FLOPs / (PEAK_FLOPS * MFU)

- FLOPs: the lesson's heavy work at its gpu preset (``WORK`` below): training steps times one
  step's FLOPs, and images through an encoder (probes, evaluation) times one forward's FLOPs.
  Each step is measured by ``course_utils.ledger.measure`` on a real step of the same objective
  built with the lesson's constructors at batch ``PROBE_BATCH``, and scaled to the preset's batch:
  every counted op (convolutions, matmuls, attention) grows linearly with the batch, except
  SimCLR's 2N x 2N similarities, under 0.1% of a step here. The presets are read from the
  lesson's source (``notebooks/src``), never copied; the lists of runs in ``WORK`` are
  hand-written from the lesson (each names its cells) and must change when the lesson does.
- fixed: the lesson's ci time measured here (imports, data, launches, planning, plots, the
  small measured steps), from ``docs/lesson_times.json``. The probes' CPU side (L-BFGS and kNN
  on 10k features) is seconds and is not counted.
- Lessons whose work is not arithmetic (06-12: process launches, collectives, planning in fake
  mode on the CPU, simulators, tiny MLPs) are predicted at their **default time measured here**:
  their gpu presets do the same launches and CPU-side work, and a GPU only shortens the
  arithmetic, which is small there. Lesson 06's transformer steps are counted as FLOPs too.
- PEAK_FLOPS: the T4's fp32 peak (NVIDIA's datasheet, 8.1 TFLOP/s; no lesson uses autocast, and
  Turing has no TF32). MFU: assumed, 0.35, for small convolutional and ViT training steps in
  fp32; ``tools/gpu_check.py`` reports measured / predicted on a GPU.
- A floor per training step, where a GPU run measured one at the same model and batch
  (``benchmarks/gpu_runs/step_times.json``): a work item takes at least its steps times that
  step time. The first GPU run (an H200, 2026-12-04) showed why: lesson 04's ViT step took 33 ms
  there, 1.9 TFLOP/s, below what the MFU above credits a T4 with, because at these sizes a step
  is bound by kernel launches and the batch's augmentation, not by FLOPs. No T4 steps faster
  than an H200, and Colab's host CPU is slower than that machine's, so the floor is optimistic
  too; lessons without a measured step (02, 03, 05, 13) are predicted from FLOPs alone.
"""
from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEVICE = "Tesla T4 (Colab free tier)"
PEAK_FLOPS = 8.1e12       # fp32, NVIDIA T4 datasheet
MFU = 0.35                # assumed: see the module docstring
BUDGET_SECONDS = 15 * 60  # per lesson
PROBE_BATCH = 4           # batch of the real step whose FLOPs are scaled to the preset's
TIMES = ROOT / "docs" / "lesson_times.json"
STEP_TIMES = ROOT / "benchmarks" / "gpu_runs" / "step_times.json"
CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000


# --------------------------------------------------------------------------- presets
class _Names(dict):
    """The names a preset may use: ``dict``, ``not_reversed``, module-level literals, and any other
    name (an imported constant such as ``NOT_RESOLVED``) as an opaque placeholder."""

    def __missing__(self, name):
        return f"<{name}>"


def preset(lesson: str, scale: str = "gpu") -> dict:
    """The preset ``config(SCALE, ci=..., default=..., gpu=...)`` of ``notebooks/src/<lesson>.py``,
    evaluated from the source (literals, ``dict(...)`` and names assigned from literals above)."""
    from course_utils.compare import not_reversed   # a pure function presets call for their claims
    source = (ROOT / "notebooks" / "src" / f"{lesson}.py").read_text()
    tree = ast.parse(source)
    names = _Names(dict=dict, not_reversed=not_reversed)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = eval(compile(ast.Expression(node.value), lesson, "eval"),
                                                 {"__builtins__": {}}, names)
            except Exception:  # noqa: BLE001 - not a literal: not a preset ingredient
                pass
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "config":
                keywords = {k.arg: k.value for k in call.keywords}
                chosen = keywords.get(scale) or keywords["default"]
                values = {}
                if "common" in keywords:
                    values.update(eval(compile(ast.Expression(keywords["common"]), lesson, "eval"),
                                       {"__builtins__": {}}, names))
                values.update(eval(compile(ast.Expression(chosen), lesson, "eval"),
                                   {"__builtins__": {}}, names))
                return values
    raise ValueError(f"no config(SCALE, ...) call in notebooks/src/{lesson}.py")


# --------------------------------------------------------------------------- FLOPs
def step_flops(build, batch: int, *, augment=None) -> float:
    """FLOPs of one training step of ``build()`` (an objective) at ``batch`` 32x32 RGB images:
    the ledger's count of a real step at PROBE_BATCH, scaled linearly to ``batch``."""
    import torch

    from course_utils.ledger import measure
    from course_utils.objectives import make_step
    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    step = make_step(model, optimizer, augment=augment, generator=torch.Generator().manual_seed(0))
    images = torch.rand(PROBE_BATCH, 3, 32, 32)
    labels = torch.arange(PROBE_BATCH) % 10
    record = measure(lambda: step((images, labels)), model=model, optimizer=optimizer)
    return record.flops * batch / PROBE_BATCH


def forward_flops(encoder) -> float:
    """FLOPs of one 32x32 image through ``encoder`` (no grad), counted by torch's FlopCounterMode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        encoder.eval()(torch.rand(PROBE_BATCH, 3, 32, 32))
    return counter.get_total_flops() / PROBE_BATCH


@functools.lru_cache(maxsize=None)
def gpt_step_flops(layers, hidden, heads, vocab, seq, batch) -> float:
    """One TinyGPT training step, counted by the ledger in fake mode (no arithmetic)."""
    from course_utils.ledger import fake_mode
    from course_utils.experiments.training_memory import measure_tinygpt
    with fake_mode():
        record, _ = measure_tinygpt(layers, hidden, heads, vocab, seq, batch, steps=1)
    return record.flops


@dataclass
class Work:
    what: str           # the lesson's cells this is
    count: float        # steps or images
    flops_each: float   # FLOPs per step or per image
    floor_each: float = 0.0  # seconds per step measured on a GPU at this model and batch, if any

    @property
    def flops(self) -> float:
        return self.count * self.flops_each


def work_01(p) -> list[Work]:
    from course_utils.models import SmallResNet
    from course_utils.objectives import Supervised
    build = lambda: Supervised(SmallResNet(width=p["train_width"], num_classes=10))  # noqa: E731
    return [Work("training run (fit, cfg.steps at cfg.batch_size)", p["steps"],
                 step_flops(build, p["batch_size"])),
            Work("test accuracy every cfg.eval_every steps (10k images)",
                 p["steps"] // p["eval_every"] * CIFAR_TEST,
                 forward_flops(SmallResNet(width=p["train_width"], num_classes=10)))]


def work_02(p) -> list[Work]:
    from course_utils.augment import SimCLRAugment
    from course_utils.models import ProjectionHead, SmallResNet
    from course_utils.objectives import SimCLR
    blocks = tuple(p["blocks"])

    def build():
        backbone = SmallResNet(width=p["width"], blocks=blocks)
        return SimCLR(backbone, ProjectionHead(backbone.feature_dim, 128, 64), p["temperature"])
    augment = SimCLRAugment(p["image_size"], crop_scale=tuple(p["crop_scale"]),
                            color_strength=p["color_strength"], rotate=p["rotate"])
    step = step_flops(build, p["batch"], augment=augment)
    arms = len(p["temperatures"]) * p["temperature_seeds"]
    no_colour = p["temperature_seeds"]                         # one no-colour arm per seed
    # the recipe's arm of a seed that also trains the main recipe is that run on its way
    read_off = min(p["temperature_seeds"], p["main_seeds"]) if p["temperature"] in p["temperatures"] else 0
    # floors as built and calibrated, every main seed's end, the arms (those read off too)
    probes = 2 * p["seeds"] + p["main_seeds"] + arms + no_colour
    image = forward_flops(SmallResNet(width=p["width"], blocks=blocks))
    gc = sum(step_flops(build, n, augment=augment) for n in p["gc_sweep"]) * 3
    return [Work("main recipe (cfg.steps, from cfg.main_seeds seeds)", p["main_seeds"] * p["steps"], step),
            Work("temperature arms and the no-colour arms (cfg.ablation_steps each; the recipe's "
                 "arm of a main seed is read off its main run)",
                 (arms - read_off + no_colour) * p["ablation_steps"], step),
            Work("probes: random inits (two floors), main runs, every arm (probe_train + probe_test)",
                 probes * (p["probe_train"] + p["probe_test"]), image),
            Work("BatchNorm recalibration of the random inits", p["seeds"] * p["calibration_images"], image),
            Work("gradient-caching memory sweep (3 methods per N in cfg.gc_sweep)", 1, gc)]


def work_03(p) -> list[Work]:
    from course_utils.models import ProjectionHead, SmallResNet
    from course_utils.objectives import MoCo
    from course_utils.augment import SimCLRAugment
    blocks = tuple(p["blocks"])
    augment = SimCLRAugment(p["image_size"], crop_scale=tuple(p["crop_scale"]),
                            color_strength=p["color_strength"], rotate=p["rotate"])

    @functools.lru_cache(maxsize=None)
    def moco_step(queue):
        return step_flops(build(queue), p["batch"], augment=augment)

    def build(queue):
        def make():
            backbone = SmallResNet(width=p["width"], blocks=blocks)
            return MoCo(backbone, ProjectionHead(backbone.feature_dim, 128, p["dim"]), queue_size=queue,
                        momentum=0.99, temperature=p["temperature"], bn_groups=2)
        return make
    image = forward_flops(SmallResNet(width=p["width"], blocks=blocks))
    others = len(p["seeds"]) - 1   # the main recipe again from each other seed
    # floors (one per seed), the main run's probes, two per other seed, the unshuffled run's
    probes = (len(p["seeds"]) + p["steps"] // p["probe_every"] + 2 * others
              + p["sweep_steps"] // p["probe_every"])
    return [Work("main run (cfg.steps at K = cfg.queue)", p["steps"], moco_step(p["queue"])),
            Work(f"the main recipe from {others} more seeds (cfg.steps each)", others * p["steps"],
                 moco_step(p["queue"])),
            Work("momentum-0 runs (cfg.stale_steps, one per seed)", len(p["seeds"]) * p["stale_steps"],
                 moco_step(p["queue"])),
            Work("unshuffled-keys run (cfg.sweep_steps)", p["sweep_steps"], moco_step(p["queue"])),
            Work("probes (probe_train + probe_test each)", probes * (p["probe_train"] + p["probe_test"]),
                 image)]


def measured_step_seconds(lesson: str, model: dict) -> float:
    """Seconds per training step a GPU run measured for ``lesson`` at exactly this model and batch
    (benchmarks/gpu_runs/step_times.json), else 0.0: a floor, since no T4 steps faster than the
    H200 that measured it."""
    runs = json.loads(STEP_TIMES.read_text())["runs"] if STEP_TIMES.exists() else []
    return next((r["seconds"] / r["steps"] for r in runs
                 if r["lesson"] == lesson and r["model"] == model and "steps" in r), 0.0)


def work_04(p) -> list[Work]:
    from course_utils.models import ViT
    from course_utils.objectives import MAE

    def build():
        vit = ViT(image_size=p["image_size"], patch_size=p["patch"], dim=p["dim"], depth=p["depth"], heads=4)
        return MAE(vit, mask_ratio=0.75, decoder_dim=64, decoder_depth=1)
    vit = ViT(image_size=p["image_size"], patch_size=p["patch"], dim=p["dim"], depth=p["depth"], heads=4)
    seeds = len(p["probe_seeds"])
    floor = measured_step_seconds("04_mae", {k: p[k] for k in ("image_size", "patch", "dim", "depth",
                                                              "batch")})
    step = step_flops(build, p["batch"])
    return [Work("main run (cfg.steps)", p["steps"], step, floor),
            Work("probe arms: pixels and norm_pix_loss per seed (cfg.probe_steps each; the pixel "
                 "arm of cfg.seed is read off the main run)",
                 (2 * seeds - (p.get("seed", 0) in p["probe_seeds"])) * p["probe_steps"], step, floor),
            Work("probes per seed (random init and two arms) on the full train and test splits",
                 3 * seeds * (CIFAR_TRAIN + CIFAR_TEST), forward_flops(vit))]


def work_05(p) -> list[Work]:
    # every objective and seed trains its steps to the largest budget (the budgets are nested),
    # probed at random init and at each budget
    runs = 5 * len(p["seeds"])
    probes = runs * (1 + len(p["budgets_gflops"]))
    from course_utils.models import SmallResNet
    image = forward_flops(SmallResNet(width=p["width"]))
    alloc = sum(p["alloc_budgets_flops"]) * len(p["alloc_widths"]) * len(p["alloc_seeds"])
    # the fresh seeds: at each of the smallest and largest budgets, both end budgets' best widths
    # with their grid neighbours (up to 3 + 3) and one extreme width: at most 7, at most every width
    ends = min(p["alloc_budgets_flops"]) + max(p["alloc_budgets_flops"])
    alloc += ends * min(7, len(p["alloc_widths"])) * len(p["alloc_test_seeds"])
    return [Work("matched-budget runs: 5 objectives x cfg.seeds to max(cfg.budgets_gflops)", runs,
                 max(p["budgets_gflops"]) * 1e9),
            Work("probes: 5 objectives x cfg.seeds x (random init + each budget)",
                 probes * (p["probe_train"] + p["probe_test"]), image),
            Work("allocation runs (budgets x widths x seeds, then the compared points x fresh seeds)", 1, alloc)]


def work_06(p) -> list[Work]:
    # measure_tinygpt(steps=2) per measured configuration: the example (twice), each sweep
    # configuration under three recompute modes, four optimizers, and recompute_tradeoff's
    # repeats of both modes on recompute_model: counted generously, an upper bound
    configs = [p["example"]] * 2 + [c for c in p["sweep"] for _ in range(3)] + [p["sweep"][0]] * 4
    steps = sum(2 * gpt_step_flops(*map(int, c)) for c in configs)
    steps += 2 * (p["repeats"] + 1) * gpt_step_flops(*map(int, p["recompute_model"]))
    return [Work("TinyGPT steps (example, sweep x recompute modes, optimizers, trade-off)", 1, steps)]


def work_13(p) -> list[Work]:
    from course_utils.augment import SimCLRAugment
    from course_utils.models import SmallResNet
    from course_utils.objectives import SimSiam
    blocks = tuple(p["blocks"])
    augment = SimCLRAugment(p["image_size"], crop_scale=tuple(p["crop_scale"]),
                            color_strength=p["color_strength"], rotate=p["rotate"])

    def build():
        backbone = SmallResNet(width=p["width"], blocks=blocks)
        return SimSiam.recipe(backbone, p["dim"])
    # a SimSiam step costs SimCLR's give or take two small matmuls (the lesson asserts how much), so every
    # budget run counts as cfg.budget_steps SimSiam steps: MoCo's more, cheaper steps add to the same
    step = step_flops(build, p["batch"], augment=augment)
    image = forward_flops(SmallResNet(width=p["width"], blocks=blocks))
    seeds = len(p["seeds"])
    # every collapse_every steps per arm (the cut arms' last read is their end; the kept arm's are
    # the first collapse_steps of SimSiam's budget run); one read at the end of each budget run
    reads = 3 * seeds * -(-p["collapse_steps"] // p["collapse_every"]) + 3 * seeds
    return [Work("collapse arms: no stop-gradient, no predictor, per seed (cfg.collapse_steps each; "
                 "the kept arm is the SimSiam budget run's start)", 2 * seeds * p["collapse_steps"], step),
            Work("matched budget: 3 objectives x cfg.seeds, the FLOPs of cfg.budget_steps steps each",
                 3 * seeds * p["budget_steps"], step),
            Work("probes: the random init and 3 objectives per seed (probe_train + probe_test)",
                 4 * seeds * (p["probe_train"] + p["probe_test"]), image),
            Work("diagnostics: two views of cfg.stats_images per read", reads * 2 * p["stats_images"], image)]


WORK = {"01_resource_ledger": work_01, "02_simclr": work_02, "03_moco": work_03, "04_mae": work_04,
        "05_compute_budget": work_05, "06_training_memory": work_06, "13_no_negatives": work_13}


# --------------------------------------------------------------------------- the table
def lessons() -> list[str]:
    return sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def measured_times() -> dict:
    if not TIMES.exists():
        raise FileNotFoundError(f"{TIMES} is missing: run `make course` at ci and default scale "
                                "(COURSE_SCALE=ci make course; make course), then "
                                "`python tools/gpu_budget.py --record`")
    return json.loads(TIMES.read_text())


def predict(lesson: str, times: dict) -> dict:
    ci, default = times["ci"][lesson], times["default"][lesson]
    if lesson in WORK:
        work = WORK[lesson](preset(lesson))
        flops = sum(w.flops for w in work)
        compute = sum(max(w.flops / (PEAK_FLOPS * MFU), w.count * w.floor_each) for w in work)
        fixed = ci if lesson != "06_training_memory" else default
        basis = "FLOPs" if lesson != "06_training_memory" else "default time + FLOPs"
        seconds = fixed + compute
    else:
        work, flops, compute, basis, seconds = [], 0.0, 0.0, "default time (not arithmetic)", default
    if any(w.floor_each for w in work):
        basis += ", GPU-measured step times"
    return dict(lesson=lesson, ci_seconds=ci, default_seconds=default, gpu_seconds=round(seconds, 1),
                gpu_flops=flops, compute_seconds=round(compute, 1), basis=basis,
                fits=seconds <= BUDGET_SECONDS,
                work=[dict(what=w.what, count=w.count, flops=w.flops,
                           floor_seconds=w.count * w.floor_each) for w in work])


def table(times: dict | None = None) -> list[dict]:
    times = times or measured_times()
    return [predict(lesson, times) for lesson in lessons()]


def markdown(rows: list[dict], times: dict) -> str:
    head = (f"| lesson | ci, measured | default, measured | gpu, predicted on a T4 | basis |\n"
            f"|---|---:|---:|---:|---|\n")
    def flops(r):
        return f" ({r['gpu_flops'] / 1e15:.2f} PFLOP)" if r["gpu_flops"] else ""

    def duration(seconds):
        return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    body = "".join(
        f"| {r['lesson']} | {duration(r['ci_seconds'])} | {duration(r['default_seconds'])} | "
        f"{duration(r['gpu_seconds'])} | {r['basis']}{flops(r)} |\n" for r in rows)
    foot = (f"\nMeasured on {times['machine']} ({times['date']}); gpu predicted as "
            f"fixed + FLOPs / ({PEAK_FLOPS / 1e12:.1f} TFLOP/s x MFU {MFU:.2f}, assumed), budget "
            f"{BUDGET_SECONDS // 60} min per lesson (`python tools/gpu_budget.py`).\n")
    return head + body + foot


def record() -> dict:
    import datetime
    import os
    times = {}
    for scale in ("ci", "default"):
        path = ROOT / "build" / f"times-{scale}.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run make course at {scale} scale first")
        times[scale] = {k: round(v) for k, v in json.loads(path.read_text()).items()}
    times["date"] = datetime.date.today().isoformat()
    times["machine"] = f"{os.cpu_count()} CPU cores, two lessons at a time (make course)"
    TIMES.write_text(json.dumps(times, indent=1) + "\n")
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--markdown", action="store_true", help="print the README's table")
    p.add_argument("--record", action="store_true", help="store build/times-*.json in docs/")
    args = p.parse_args(argv)
    times = record() if args.record else measured_times()
    rows = table(times)
    if args.markdown:
        print(markdown(rows, times), end="")
    else:
        for r in rows:
            print(f"{r['lesson']:<30} ci {r['ci_seconds']:>5.0f} s   default {r['default_seconds']:>6.0f} s   "
                  f"gpu {r['gpu_seconds']:>7.0f} s ({r['basis']}){'' if r['fits'] else '  OVER BUDGET'}")
            for w in r["work"]:
                print(f"    {w['flops'] / 1e12:>10.1f} TFLOP  {w['what']}")
    over = [r["lesson"] for r in rows if not r["fits"]]
    print(f"budget {BUDGET_SECONDS // 60} min per lesson on a {DEVICE}: "
          + (f"OVER for {', '.join(over)}" if over else "every lesson fits"),
          file=sys.stderr if args.markdown else sys.stdout)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
