"""Figures the lessons show: an image grid, training curves, a bar chart, lesson 06's memory
breakdown and what-fits widget, lesson 09's pipeline timeline. Each returns its figure (or axes)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from . import checks, memory
from .memory import PRECISIONS
from .models.transformer import RECOMPUTE_MODES
from .optim import OPTIMIZERS
from .report import show_table

__all__ = ["show_images", "plot_curves", "plot_bars", "image_grid", "plot_memory_breakdown",
           "what_fits_widget", "what_fits_summary", "plot_timeline"]


def image_grid(images, *, nrow: int = 8, pad: int = 1, pad_value: float = 1.0) -> np.ndarray:
    """Tile N×C×H×W images (C = 1 or 3, values in [0, 1]) with ``torchvision.utils.make_grid`` into
    one (rows·(H+pad)+pad)×(nrow·(W+pad)+pad)×3 array for ``imshow``: clipped to [0, 1], one-channel
    images as gray RGB, height-width-channel order as matplotlib wants."""
    checks.positive_int(nrow, "nrow")
    # imported here: torchvision's import loads torch._dynamo (about 1.5 s of CPU), which a process
    # that tiles no image and builds no optimizer (torch.optim loads it at the first) need not pay
    from torchvision.utils import make_grid
    grid = make_grid(_as_images(images), nrow=nrow, padding=pad, pad_value=pad_value)
    return grid.clamp(0, 1).permute(1, 2, 0).numpy()


def show_images(images, *, nrow: int = 8, title: str | None = None, labels=None,
                classes: Sequence[str] | None = None, ax=None, scale: float = 1.0):
    """Show N×C×H×W images (a tensor, a list of C×H×W tensors, or anything with `.images`)
    as a grid; `labels` (N ints, or N strings) are written above each image, mapped through
    `classes` when given. Returns the matplotlib figure."""
    if hasattr(images, "images") and not isinstance(images, torch.Tensor):
        if labels is None:
            labels = getattr(images, "labels", None)
        if classes is None:
            classes = getattr(images, "classes", None)
        images = images.images
    x = _as_images(images)
    n, _, h, w = x.shape
    names = _label_names(labels, classes, n)
    cols = min(checks.positive_int(nrow, "nrow"), n)
    grid = image_grid(x, nrow=cols)
    if ax is None:
        rows = math.ceil(n / cols)
        fig, ax = plt.subplots(figsize=(max(2.0, 1.1 * cols * scale), max(1.5, 1.1 * rows * scale + 0.3)))
    else:
        fig = ax.figure
    ax.imshow(grid, interpolation="nearest")
    ax.set_axis_off()
    if names is not None:
        for i, name in enumerate(names):
            r, col = divmod(i, cols)
            ax.text(1 + col * (w + 1) + w / 2, r * (h + 1) + 0.6, name, ha="center", va="bottom",
                    fontsize=7, clip_on=False)
    if title:
        ax.set_title(title, pad=12 if names is not None else 4)
    fig.tight_layout()
    return fig


_POSITION_KEYS = ("step", "eval_step", "epoch", "batch_index")


def plot_curves(history, keys: Sequence[str] | None = None, ax=None, *, logy: bool = False,
                title: str | None = None):
    """Plot training curves from a dict of lists, or an object with `.as_dict()` (train.History).

    Each key in `keys` (default: every numeric series except step/epoch counters) becomes one line,
    against `history["step"]` — or `history["eval_step"]` for keys named `eval_*` — when that
    series has the same length, else against the index. With `ax` all lines share it; without,
    each key gets its own panel. Returns the figure.
    """
    data = history.as_dict() if hasattr(history, "as_dict") else history
    if not isinstance(data, Mapping):
        raise TypeError(f"history must be a dict of lists or have .as_dict(), got {type(history).__name__}")
    if keys is None:
        keys = [k for k, v in data.items() if k not in _POSITION_KEYS and _is_numeric_series(v)]
    elif isinstance(keys, str):
        keys = [keys]
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"keys {missing} are not in the history; it has {list(data)}")
    if not keys:
        raise ValueError(f"nothing to plot: no numeric series in the history (keys: {list(data)})")
    if ax is None:
        fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 2.8), squeeze=False)
        axes = list(axes[0])
    else:
        fig, axes = ax.figure, [ax] * len(keys)
    for key, a in zip(keys, axes):
        ys = _to_floats(data[key], key)
        x_key = "eval_step" if key.startswith("eval_") else "step"
        if x_key in data and len(data[x_key]) == len(ys):
            xs, x_label = _to_floats(data[x_key], x_key), "step"
        else:
            xs, x_label = np.arange(len(ys)), "index"
        a.plot(xs, ys, label=key, marker="o" if len(ys) <= 20 else None, markersize=3)
        a.set_xlabel(x_label)
        if logy:
            a.set_yscale("log")
        if ax is None:
            a.set_title(key)
        a.grid(alpha=0.3)
    if ax is not None:
        ax.legend()
        if title:
            ax.set_title(title)
    elif title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_bars(values: Mapping[str, float], *, ax=None, title: str | None = None,
              ylabel: str | None = None, fmt: str = "{:.3g}", logy: bool = False):
    """A labelled bar per entry of `values` (name -> number), the number written on the bar."""
    if not isinstance(values, Mapping) or not values:
        raise ValueError("values must be a non-empty dict of name -> number")
    names = [str(k) for k in values]
    heights = _to_floats(list(values.values()), "values")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(3.0, 0.9 * len(names) + 1), 2.8))
    else:
        fig = ax.figure
    bars = ax.bar(names, heights, color="C0")
    for bar, hgt in zip(bars, heights):
        ax.text(bar.get_x() + bar.get_width() / 2, hgt, fmt.format(hgt), ha="center", va="bottom",
                fontsize=8)
    if logy:
        ax.set_yscale("log")
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=30 if len(names) > 4 else 0)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------


def _as_images(images) -> torch.Tensor:
    """Anything image-like -> float CPU tensor N×C×H×W with C in {1, 3}."""
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError("no images to show: got an empty list")
        images = torch.stack([torch.as_tensor(im) for im in images])
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(images)
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a tensor N×C×H×W, got {type(images).__name__}")
    x = images.detach().float().cpu()
    if x.dim() == 3:
        x = x[None]
    if x.dim() != 4 or x.shape[1] not in (1, 3) or x.shape[0] == 0:
        raise ValueError(f"images must be N×C×H×W with C = 1 or 3 and N > 0, got {tuple(images.shape)}")
    return x


def _label_names(labels, classes, n):
    if labels is None:
        return None
    labels = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
    if len(labels) < n:
        raise ValueError(f"got {len(labels)} labels for {n} images; pass one label per image")
    names = []
    for lab in labels[:n]:
        if classes is not None and isinstance(lab, int) and 0 <= lab < len(classes):
            names.append(str(classes[lab]))
        else:
            names.append(str(lab))
    return names


def _is_numeric_series(v) -> bool:
    try:
        _to_floats(v, "")
        return len(v) > 0
    except (TypeError, ValueError):
        return False


def _to_floats(v, key) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().float().cpu().numpy().reshape(-1)
    try:
        return np.asarray([float(x) for x in v], dtype=float)
    except (TypeError, ValueError) as err:
        raise ValueError(f"history[{key!r}] must be a list of numbers") from err


# --------------------------------------------------------------------------- training memory
# Lesson 06's figures over course_utils.memory's predictor; memory itself holds formulas only.

def plot_memory_breakdown(report: dict, ax=None, title: str | None = None):
    """Stacked bar of ``memory.what_fits(...)["breakdown"]`` next to the device's capacity line
    (GiB). Returns the figure."""
    ax = ax or plt.subplots(figsize=(5, 4))[1]
    bottom = 0.0
    for name, nbytes in report["breakdown"].items():
        gib = nbytes / 2**30
        if gib > 0:
            ax.bar(0, gib, bottom=bottom, label=f"{name} {gib:.2f} GiB", width=0.5)
            bottom += gib
    ax.axhline(report["capacity"] / 2**30, color="k", ls="--", label="device memory")
    ax.set_xticks([])
    ax.set_ylabel("GiB")
    ax.set_xlim(-0.6, 1.8)
    verdict = "fits" if report["fits"] else "does not fit"
    ax.set_title(title or f"predicted {report['total'] / 2**30:.1f} GiB: {verdict}")
    ax.legend(loc="upper right", fontsize=8)
    return ax.figure


def what_fits_summary(report: dict) -> str:
    """One line per part of ``memory.what_fits(...)`` in GiB, then total against capacity."""
    gib = 2 ** 30
    lines = [f"{k}: {v / gib:.3f} GiB" for k, v in report["breakdown"].items()]
    verdict = "fits" if report["fits"] else "does not fit"
    lines.append(f"total: {report['total'] / gib:.3f} GiB of {report['capacity'] / gib:.1f} GiB "
                 f"({verdict})")
    return "\n".join(lines)


def what_fits_widget():
    """Sliders/dropdowns over ``memory.what_fits``; redraws the stacked bar on every change."""
    import ipywidgets as w

    def show(**kwargs):
        try:
            report = memory.what_fits(**kwargs)
        except ValueError as err:  # e.g. bf16 on a T4: say why instead of a traceback
            print(err)
            return
        plot_memory_breakdown(report)
        plt.show()
        print(what_fits_summary(report))  # the same figures as text: readable, and testable

    return w.interactive(
        show,
        model=w.Dropdown(options=list(memory.PRESETS), value="GPT-2 small (124M)"),
        batch=w.IntSlider(value=8, min=1, max=64),
        seq=w.Dropdown(options=[256, 512, 1024, 2048], value=1024),
        precision=w.Dropdown(options=[("the device's mixed precision", None),
                                      *[(p, p) for p in memory.PRECISIONS]], value=None),
        optimizer=w.Dropdown(options=list(OPTIMIZERS), value="adamw"),
        recompute=w.Dropdown(options=list(RECOMPUTE_MODES), value="none"),
        attention=w.Dropdown(options=[("fused (sdpa, as GPU runs use)", "sdpa"),
                                      ("eager (s² probabilities kept)", "eager")], value="sdpa"),
        device=w.Dropdown(options=list(memory.DEVICES), value="T4 (Colab) 16 GB"),
    )


def planner_widget():
    """Lesson 11's planner: model (SimCLR / MoCo v2 / MAE / GPT), batch, size, precision,
    optimizer, MoCo's queue, MAE's mask ratio, devices, parallelism, recomputation, attention,
    device memory, peak and MFU -> the six ledger lines per device, measured live on fake tensors
    (``experiments.planning.plan_run``), whether it fits and the predicted step time."""
    import ipywidgets as w

    # loaded when the widget is built, not with the plots: the planner loads the objectives,
    # the distributed mechanisms and torchvision's ResNet-50, which no other plot needs
    from .experiments.planning import PLANNED_MODELS, ledger_lines, plan_run

    def show(model, per_device_batch, size, precision, optimizer, queue_size, mask_ratio, devices,
             strategy, recompute, attention, device_gb, peak_tflops, mfu):
        try:
            plan = plan_run(model, per_device_batch=per_device_batch, size=size, devices=devices,
                            strategy=strategy, recompute=recompute, precision=precision,
                            optimizer=optimizer, queue_size=queue_size, mask_ratio=mask_ratio,
                            attention=attention, device_bytes=device_gb * 2**30,
                            peak_flops=peak_tflops * 1e12, mfu=mfu)
        except ValueError as err:   # e.g. FSDP for a ResNet: say why instead of a traceback
            print(err)
            return
        show_table(ledger_lines(plan["record"]))
        if plan["gathered_bytes"]:
            print(f"+ {plan['gathered_bytes'] / 1e9:.2f} GB of parameters FSDP gathers at a time")
        for line in plan["assumptions"]:
            print(f"  assumes {line}")
        verdict = "fits" if plan["fits"] else "does NOT fit"
        print(f"{verdict} on a {device_gb} GiB device (margin {plan['margin_bytes'] / 1e9:+.1f} GB); "
              f"step ≈ {plan['step_seconds']:.2f} s at {mfu:.0%} MFU of {peak_tflops} TFLOP/s")

    return w.interactive(
        show, {"manual": True, "manual_name": "measure on fake tensors"},
        model=w.Dropdown(options=list(PLANNED_MODELS), value="GPT 7B"),
        per_device_batch=w.IntSlider(value=1, min=1, max=512),
        size=w.Dropdown(options=[224, 512, 1024, 2048, 4096, 8192], value=4096,
                        description="image px / seq"),
        precision=w.Dropdown(options=[("the model's usual", None), *[(p, p) for p in PRECISIONS]],
                             value=None),
        optimizer=w.Dropdown(options=[("the model's usual", None), *[(o, o) for o in OPTIMIZERS]],
                             value=None),
        queue_size=w.Dropdown(options=[4096, 16384, 65536, 262144], value=65536,
                              description="MoCo queue"),
        mask_ratio=w.FloatSlider(value=0.75, min=0.0, max=0.95, step=0.05, description="MAE mask"),
        devices=w.Dropdown(options=[1, 8, 64, 512, 1024], value=64),
        strategy=w.Dropdown(options=["ddp", "fsdp"], value="fsdp"),
        recompute=w.Dropdown(options=["none", "selective", "full"], value="none"),
        attention=w.Dropdown(options=["sdpa", "eager"], value="sdpa"),
        device_gb=w.Dropdown(options=[16, 24, 40, 80, 141], value=80),
        peak_tflops=w.FloatText(value=312.0), mfu=w.FloatSlider(value=0.4, min=0.05, max=0.8, step=0.05),
    )


# --------------------------------------------------------------------------- pipeline schedules
def plot_timeline(timeline, ax=None):
    """Gantt chart of a pipeline schedule (``distributed.pipeline.simulate`` or
    ``pipeline_orders.simulate_order``): one row per device, F blue, B orange, W green, the
    micro-batch number inside; later chunks (interleaved) paler; DualPipe's reverse direction
    hatched, and an overlapped F&B chunk drawn as two half-height bars. Returns the axes."""
    ax = ax or plt.subplots(figsize=(10, 0.5 * timeline.devices + 1))[1]
    colors = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
    shared = {}
    for op in timeline.ops:
        shared.setdefault((op.device, op.start, op.end), []).append(op)
    for op in timeline.ops:
        pair = shared[(op.device, op.start, op.end)]
        height = 0.8 / len(pair)
        y = op.device - 0.4 + height * (pair.index(op) + 0.5)
        ax.barh(y, op.end - op.start, height=height, left=op.start, color=colors[op.kind],
                edgecolor="white", alpha=0.6 + 0.4 * (op.chunk == 0),
                hatch="//" if op.direction else None)
        ax.text((op.start + op.end) / 2, y, str(op.microbatch), ha="center",
                va="center", fontsize=7 if len(pair) == 1 else 5, color="white")
    ax.set_yticks(range(timeline.devices), [f"device {d}" for d in range(timeline.devices)])
    ax.invert_yaxis()
    ax.set_xlabel("time (units)")
    ax.set_title(f"{timeline.schedule}: p={timeline.devices}, m={timeline.microbatches}, "
                 f"bubble {timeline.bubble_fraction:.0%}")
    return ax
