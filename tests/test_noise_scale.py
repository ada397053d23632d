"""course_utils.noise_scale: the noise-scale estimator, the warm-up schedule and the S/E fit."""
import math

import numpy as np
import pytest
import torch

from course_utils import noise_scale


def _toy():
    torch.manual_seed(0)
    images, labels = torch.randn(256, 6), torch.randint(0, 3, (256,))
    return torch.nn.Linear(6, 3), images, labels


def _per_example_loop(model, images, labels):
    """|G|² and tr Σ from one backward pass per example, no torch.func."""
    grads = []
    for x, y in zip(images, labels):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x[None]), y[None]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    g = torch.stack(grads).double()
    mean = g.mean(0)
    return mean.square().sum().item(), (g - mean).square().sum(1).mean().item()


def test_exact_noise_scale_matches_a_per_example_loop():
    model, images, labels = _toy()
    exact = noise_scale.exact_noise_scale(model, images, labels)
    grad_sq, trace_cov = _per_example_loop(model, images, labels)
    assert (exact.grad_sq, exact.trace_cov) == pytest.approx((grad_sq, trace_cov), rel=1e-4)
    assert exact.b_simple == pytest.approx(trace_cov / grad_sq, rel=1e-4)


def test_two_batch_estimator_agrees_with_per_example_gradients():
    model, images, labels = _toy()
    exact = noise_scale.exact_noise_scale(model, images, labels)
    estimate = noise_scale.estimate_noise_scale(model, images, labels, b_small=4, b_big=64, draws=64,
                                       generator=torch.Generator().manual_seed(0))
    assert estimate.grad_sq == pytest.approx(exact.grad_sq, rel=0.3)
    assert estimate.trace_cov == pytest.approx(exact.trace_cov, rel=0.1)
    assert all(p.grad is None for p in model.parameters())


def test_estimator_refuses_a_big_batch_that_is_not_whole_micro_batches():
    model, images, labels = _toy()
    with pytest.raises(ValueError, match="multiple"):
        noise_scale.estimate_noise_scale(model, images, labels, b_small=4, b_big=10, draws=1)


def test_warmup_is_linear_then_constant():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched, lrs = noise_scale.warmup_schedule(opt, 4), []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = noise_scale.warmup_schedule(opt, 1)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 1.0


def test_fit_recovers_the_papers_curve():
    batch = np.array([4, 16, 64, 256, 1024])
    s_min, e_min = noise_scale.fit_steps_examples(batch, 40 + 3000 / batch)
    assert (s_min, e_min) == pytest.approx((40, 3000))
    with pytest.raises(ValueError, match="three"):
        noise_scale.fit_steps_examples([4, 8], [10, 5])


def test_steps_to_target_counts_updates_and_gives_up():
    losses = iter([3.0, 2.0, 1.0, 0.5])
    batches = lambda epoch: iter(range(2))   # two batches an epoch
    assert noise_scale.steps_to_target(lambda b: None, batches, lambda: next(losses), target=1.0, max_steps=10) == 3
    assert noise_scale.steps_to_target(lambda b: None, batches, lambda: 5.0, target=1.0, max_steps=5) is None
    assert noise_scale.steps_to_target(lambda b: None, batches, lambda: math.nan, target=1.0, max_steps=5) is None


def test_fewest_steps_finds_the_grids_best_in_any_order_and_cheaper_from_the_winner():
    """The search's result is the exhaustive one (fewest steps, then the smaller LR) whatever LR it
    starts from; starting from the winner costs no more updates than the grid's own order."""
    rng = np.random.default_rng(0)
    lrs = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64]
    for trial in range(200):
        # each LR's true steps to the target, None where it never gets there; ties are common
        true = {lr: (None if rng.random() < 0.2 else int(rng.integers(1, 12))) for lr in lrs}
        cost = []

        def steps_with(lr, limit):
            cost.append(min(true[lr], limit) if true[lr] is not None else limit)
            return true[lr] if true[lr] is not None and true[lr] <= limit else None

        reached = sorted((s, lr) for lr, s in true.items() if s is not None)
        expected = reached[0] if reached else (None, None)
        costs = {}
        for start in [None, *lrs, 0.05]:
            cost.clear()
            assert noise_scale.fewest_steps(steps_with, lrs, max_steps=12, start=start) == expected, (true, start)
            costs[start] = sum(cost)
        if reached:
            assert costs[expected[1]] <= costs[None]
    with pytest.raises(ValueError, match="positive"):
        noise_scale.fewest_steps(lambda lr, limit: 1, [0.1, 0.0], max_steps=5)
    with pytest.raises(ValueError, match="start"):
        noise_scale.fewest_steps(lambda lr, limit: 1, [0.1], max_steps=5, start=-1.0)


def test_two_batch_estimator_on_groups_of_a_coupled_loss():
    """A loss that couples the examples of a micro-batch (here: the squared norm of the group's
    mean output, like SimCLR's candidates) is estimated with the group as the unit: against the
    group-level |G|² and tr Σ of many independently drawn groups."""
    torch.manual_seed(0)
    model, data = torch.nn.Linear(4, 2), torch.randn(512, 4) + 1.0
    group, gen = 8, torch.Generator().manual_seed(1)

    def group_loss(rows):
        return model(data[rows]).mean(0).square().sum()   # not a mean of per-example losses

    def draw():
        return [lambda rows=torch.randperm(len(data), generator=gen)[:group]: group_loss(rows) for _ in range(8)]

    estimate = noise_scale.two_batch_noise_scale(model, draw, b_small=group, b_big=8 * group, draws=200)
    assert estimate.loss > 0 and all(p.grad is None for p in model.parameters())
    # reference: the mean and covariance of many independent group gradients, per image (× group)
    grads = []
    for _ in range(2000):
        model.zero_grad(set_to_none=True)
        group_loss(torch.randperm(len(data), generator=gen)[:group]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    g = torch.stack(grads).double()
    grad_sq, trace_cov = g.mean(0).square().sum().item(), group * g.var(0).sum().item()
    assert estimate.grad_sq == pytest.approx(grad_sq, rel=0.1)
    assert estimate.trace_cov == pytest.approx(trace_cov, rel=0.15)
    with pytest.raises(ValueError, match="micro-batches"):
        noise_scale.two_batch_noise_scale(model, lambda: draw()[:3], b_small=group, b_big=8 * group, draws=1)


def test_probe_during_training_measures_windows_before_updates():
    updates, seen = [], []
    batches = lambda epoch: iter(range(3))     # three batches an epoch
    windows = noise_scale.probe_during_training(updates.append, batches, steps=7, probe_at=(0, 5), average_over=3,
                                       measure=lambda k: (k, len(updates)))
    assert updates == [0, 1, 2, 0, 1, 2, 0]
    # before update k, k updates have been made; the last window is cut at the end of the run
    assert windows == [(0, [(0, 0), (1, 1), (2, 2)]), (5, [(5, 5), (6, 6)])]
