"""How large a batch pays: the gradient noise scale and the steps/examples trade-off (lesson 12).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv 1812.06162). With G
the full-data gradient and Σ the per-example gradient covariance, a batch of B examples drawn
with replacement gives a gradient G_B with

    E |G_B|² = |G|² + tr(Σ) / B                                   (1)

and the simple noise scale is B_simple = tr(Σ) / |G|². Measuring E|G_B|² at two batch sizes
B_small < B_big solves (1) for both unknowns (the paper's unbiased estimator, its appendix A.1):

    |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
    tr Σ  ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

Data parallel hands you both for free: each rank's gradient is a small batch, the all-reduced one
the big batch. ``two_batch_noise_scale`` is the estimator for any loss (the unit it needs
independent is the micro-batch: SimCLR's fixed-size groups of candidates), ``estimate_noise_scale``
its cross-entropy case, ``probe_during_training`` the loop that measures it along a run. The same model predicts steps S and examples E to reach a target loss:

    S = S_min (1 + B_noise / B),  E = E_min (1 + B / B_noise),  i.e. (S/S_min − 1)(E/E_min − 1) = 1

with B_crit = E_min / S_min; ``steps_to_target`` and ``fewest_steps`` (over a grid of learning rates)
measure S, ``fit_steps_examples`` fits the model to measured (B, S) pairs.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from . import checks


class NoiseScale(NamedTuple):
    b_simple: float        # tr(Σ) / |G|²
    grad_sq: float         # |G|², the squared norm of the true gradient
    trace_cov: float       # tr(Σ), the summed per-example gradient variance
    loss: float | None = None  # the mean loss of the batches measured (two-batch estimator only)


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def estimate_noise_scale(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *,
                         b_small: int, b_big: int, draws: int,
                         generator: torch.Generator | None = None) -> NoiseScale:
    """The paper's two-batch-size estimator of B_simple for a classifier with cross-entropy.

    Each of ``draws`` big batches (b_big rows drawn with replacement, so (1) holds exactly) is
    back-propagated as b_big/b_small micro-batches (``two_batch_noise_scale``).
    Leaves the model's .grad fields set to None.
    """
    def draw_big_batch():
        rows = torch.randint(len(images), (b_big,), generator=generator).to(images.device)
        return [lambda part=part: F.cross_entropy(model(images[part]), labels[part])
                for part in rows.split(b_small)]

    return two_batch_noise_scale(model, draw_big_batch, b_small=b_small, b_big=b_big, draws=draws)


def two_batch_noise_scale(model: nn.Module, draw_big_batch: Callable[[], list], *, b_small: int,
                          b_big: int, draws: int) -> NoiseScale:
    """The two-batch-size estimator for any loss whose big batch is b_big/b_small i.i.d. units.

    ``draw_big_batch()`` -> a list of b_big/b_small zero-argument callables, each returning the
    (mean) loss of one freshly drawn micro-batch of b_small examples. Their gradients are the
    small-batch gradients, their mean the big-batch one (what data-parallel ranks and the
    all-reduce give). |G_small|² and |G_big|² are averaged over all ``draws`` first, then solved
    for |G|² and tr Σ: the ratio of averages, as the paper does, not the average of noisy ratios.
    The micro-batch is the unit the estimator needs independent: for a loss that couples the
    examples of a micro-batch (SimCLR's candidates) it is exact only with the micro-batch held at
    b_small examples, and its tr Σ is then per example of such micro-batches.
    Also returns the mean micro-batch loss seen (``loss``). Leaves .grad fields set to None.
    """
    checks.positive_int(b_small, "b_small")
    checks.positive_int(draws, "draws")
    checks.positive_int(b_big, "b_big", minimum=2 * b_small)
    if b_big % b_small:
        raise ValueError(f"b_big={b_big} must be a multiple of b_small={b_small}: the big batch is "
                         "made of whole micro-batches")
    small_sq, big_sq, losses = [], [], []
    for _ in range(draws):
        micro_losses = draw_big_batch()
        if len(micro_losses) != b_big // b_small:
            raise ValueError(f"draw_big_batch() gave {len(micro_losses)} micro-batches, expected "
                             f"b_big/b_small = {b_big // b_small}")
        grads = []
        for micro_loss in micro_losses:
            model.zero_grad(set_to_none=True)
            loss = micro_loss()
            loss.backward()
            losses.append(loss.item())
            grads.append(_flat_grad(model))
        grads = torch.stack(grads)                        # (b_big/b_small) × parameters
        small_sq.append(grads.square().sum(1).mean().item())
        big_sq.append(grads.mean(0).square().sum().item())
    model.zero_grad(set_to_none=True)
    g_small, g_big = float(np.mean(small_sq)), float(np.mean(big_sq))
    grad_sq = (b_big * g_big - b_small * g_small) / (b_big - b_small)
    trace_cov = (g_small - g_big) / (1 / b_small - 1 / b_big)
    return NoiseScale(trace_cov / grad_sq, grad_sq, trace_cov, float(np.mean(losses)))


def exact_noise_scale(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> NoiseScale:
    """B_simple over the whole dataset from every per-example gradient (torch.func.vmap(grad)):
    G = mean_i g_i, tr Σ = mean_i |g_i − G|². Memory N × parameters: only for small data and
    models, which is why the paper's estimator exists."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one_loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    per_example = vmap(grad(one_loss), in_dims=(None, 0, 0))(params, images, labels)
    g = torch.cat([v.flatten(1) for v in per_example.values()], 1)    # N × parameters
    mean = g.mean(0)
    grad_sq, trace_cov = mean.square().sum().item(), (g - mean).square().sum(1).mean().item()
    return NoiseScale(trace_cov / grad_sq, grad_sq, trace_cov)


def probe_during_training(step: Callable, batches, *, steps: int, probe_at, average_over: int,
                          measure: Callable[[int], object], desc: str = "training with probes") -> list:
    """Train ``steps`` updates of ``step(batch)`` over ``batches`` (epoch -> iterator) and measure
    along the way: from each update k in ``probe_at`` on, ``measure(k)`` is called before each of
    ``average_over`` consecutive updates (the window is cut short at the end of the run).
    -> [(k, [measure results of the window])], in order: a noise scale is then a ratio of
    window averages, as the paper's moving averages are (the iterate wobbles, and |G|² with it)."""
    from tqdm.auto import tqdm

    checks.positive_int(steps, "steps")
    checks.positive_int(average_over, "average_over")
    windows, current, done, epoch = [], None, 0, 0
    with tqdm(total=steps, desc=desc) as bar:
        while done < steps:
            for batch in batches(epoch):
                if done in probe_at:
                    current = (done, [])
                    windows.append(current)
                if current is not None:
                    current[1].append(measure(done))
                    if len(current[1]) == average_over:
                        current = None
                step(batch)
                done += 1
                bar.update()
                if done == steps:
                    break
            epoch += 1
    return windows


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int):
    """Linear warm-up from lr/warmup_steps to lr over warmup_steps updates, then constant
    (torch's LinearLR; warmup_steps=1 is no warm-up)."""
    checks.positive_int(warmup_steps, "warmup_steps")
    if warmup_steps == 1:
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    # update k (from 0) uses lr·(k+1)/warmup_steps: the warmup_steps-th update is the first at lr
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup_steps,
                                             total_iters=warmup_steps - 1)


def steps_to_target(step: Callable, batches, loss_now: Callable[[], float], *, target: float,
                    max_steps: int) -> int | None:
    """Train with ``step(batch)`` over ``batches`` (epoch -> iterator) until ``loss_now()`` (the
    loss on a fixed evaluation set, checked after every update) is <= target: the number of
    updates, or None if max_steps pass or the loss stops being finite first."""
    checks.positive_int(max_steps, "max_steps")
    done, epoch = 0, 0
    while True:
        for batch in batches(epoch):
            step(batch)
            done += 1
            loss = loss_now()
            if not math.isfinite(loss):
                return None
            if loss <= target:
                return done
            if done >= max_steps:
                return None
        epoch += 1


def fewest_steps(steps_with: Callable[[float, int], int | None], lrs, *, max_steps: int,
                 start: float | None = None) -> tuple[int | None, float | None]:
    """(S, lr): the fewest updates to the target over the learning rates ``lrs`` and the LR that
    needs them (a tie goes to the smaller LR), or (None, None) if no LR gets there within
    ``max_steps``. ``steps_with(lr, limit)`` trains one run (``steps_to_target`` with
    ``max_steps=limit``): its updates to the target, or None if it has not got there after
    ``limit`` updates or stopped being finite.

    Each run is stopped at the best S so far, where it can at most tie, so the order the LRs are
    tried in changes the cost of the search, not its result: from ``start`` (say, the best LR of
    the previous batch size) outward on a log scale, the winner usually runs first and cuts every
    other run short. Without ``start``, in the order given."""
    checks.positive_int(max_steps, "max_steps")
    lrs = list(lrs)
    if not lrs or any(not lr > 0 for lr in lrs):
        raise ValueError(f"lrs must be positive learning rates, got {lrs}")
    if start is not None:
        if not start > 0:
            raise ValueError(f"start must be a positive learning rate, got {start}")
        lrs.sort(key=lambda lr: (abs(math.log(lr / start)), lr))
    best_steps, best_lr = None, None
    for lr in lrs:
        steps = steps_with(lr, best_steps or max_steps)
        if steps is not None and (best_steps is None or (steps, lr) < (best_steps, best_lr)):
            best_steps, best_lr = steps, lr
    return best_steps, best_lr


def fit_steps_examples(batch_sizes, steps) -> tuple[float, float]:
    """(S_min, E_min) of S = S_min + E_min / B, the paper's trade-off (E = B·S), by least squares
    on relative errors (each row divided by its S, so B=4's thousands of steps do not drown
    B=1024's tens). B_crit = E_min / S_min."""
    b = np.asarray(batch_sizes, float)
    s = np.asarray(steps, float)
    if b.shape != s.shape or len(b) < 3:
        raise ValueError("need at least three (batch size, steps) pairs of equal length")
    design = np.stack([np.ones_like(b), 1 / b], 1) / s[:, None]
    (s_min, e_min), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    return float(s_min), float(e_min)
