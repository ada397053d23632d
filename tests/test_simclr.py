"""NT-Xent: value at init, agreement with the textbook loop, extra negatives, accumulation."""
import math

import pytest
import torch
import torch.nn as nn

from course_utils.objectives.simclr import SimCLR, nt_xent_loss, nt_xent_loss_naive


def _random_pair(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)


@pytest.mark.parametrize("n", [4, 16, 64])
def test_loss_at_init_is_log_of_candidates(n):
    # random high-dimensional embeddings: all cosines ~ 0, so the loss is log(#candidates)
    z1, z2 = _random_pair(n, 2048)
    loss = nt_xent_loss(z1, z2, temperature=0.5)
    assert loss.item() == pytest.approx(math.log(2 * n - 1), abs=0.03)


def test_matches_naive_loop():
    z1, z2 = _random_pair(6, 5, seed=1)
    for t in (0.1, 0.5, 1.0):
        fast, slow = nt_xent_loss(z1, z2, t), nt_xent_loss_naive(z1, z2, t)
        assert torch.allclose(fast, slow, atol=1e-5), (t, fast, slow)
    extra = torch.randn(7, 5, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(nt_xent_loss(z1, z2, 0.2, extra), nt_xent_loss_naive(z1, z2, 0.2, extra), atol=1e-5)


def test_extra_negatives_add_candidates_but_never_positives():
    z1, z2 = _random_pair(8, 2048)
    extra = torch.randn(24, 2048, generator=torch.Generator().manual_seed(3))
    loss = nt_xent_loss(z1, z2, 0.5, extra_negatives=extra)
    assert loss.item() == pytest.approx(math.log(2 * 8 - 1 + 24), abs=0.03)
    # an empty set of extra negatives changes nothing
    assert torch.allclose(nt_xent_loss(z1, z2, 0.5, extra[:0]), nt_xent_loss(z1, z2, 0.5))
    # extra negatives are normalised inside: scale does not matter
    assert torch.allclose(nt_xent_loss(z1, z2, 0.5, 7.0 * extra), loss, atol=1e-6)
    # copying every positive into the negatives makes the task harder, never easier
    aligned = z1 + 0.01 * z2
    base = nt_xent_loss(aligned, z1, 0.1)
    with_copies = nt_xent_loss(aligned, z1, 0.1, extra_negatives=torch.cat([z1, aligned]))
    assert with_copies > base + 0.5
    # gradients flow into extra negatives (needed when they come from an all_gather with grad)
    extra_leaf = extra.clone().requires_grad_(True)
    nt_xent_loss(z1, z2, 0.5, extra_leaf).backward()
    assert extra_leaf.grad is not None and extra_leaf.grad.abs().sum() > 0


def test_gradient_accumulation_is_not_a_bigger_batch():
    n, k = 32, 4
    z1, z2 = _random_pair(n, 256, seed=4)
    z1.requires_grad_(True)
    full = nt_xent_loss(z1, z2)
    micro = torch.stack([nt_xent_loss(a, b) for a, b in zip(z1.chunk(k), z2.chunk(k))]).mean()
    # fewer candidates per anchor in each micro-batch: log(2N/k - 1) instead of log(2N - 1)
    assert full.item() == pytest.approx(math.log(2 * n - 1), abs=0.1)
    assert micro.item() == pytest.approx(math.log(2 * n // k - 1), abs=0.1)
    assert full.item() - micro.item() > 1.0
    g_full, = torch.autograd.grad(full, z1)
    g_micro, = torch.autograd.grad(micro, z1)
    assert not torch.allclose(g_full, g_micro, atol=1e-4)


def test_scale_invariant_and_stable_at_low_temperature():
    z1, z2 = _random_pair(16, 32, seed=5)
    assert torch.allclose(nt_xent_loss(100 * z1, z2), nt_xent_loss(z1, z2), atol=1e-5)
    aligned = nt_xent_loss(1e4 * z1, 1e4 * z1 + 1e-3 * z2, temperature=0.01)
    assert torch.isfinite(aligned) and aligned.item() < 1e-3
    loss = nt_xent_loss(z1, z2, temperature=0.001)
    assert torch.isfinite(loss)
    assert torch.allclose(loss.double(), nt_xent_loss_naive(z1, z2, 0.001).double(), rtol=1e-4)


def test_single_image_has_no_negatives():
    z1, z2 = _random_pair(1, 8)
    assert nt_xent_loss(z1, z2).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("bad, exc", [
    (dict(z1=torch.randn(4)), ValueError),
    (dict(z2=torch.randn(5, 8)), ValueError),
    (dict(z1=[[1.0]]), TypeError),
    (dict(temperature=0.0), ValueError),
    (dict(temperature=-1.0), ValueError),
    (dict(temperature=True), TypeError),
    (dict(extra_negatives=torch.randn(3, 7)), ValueError),
    (dict(extra_negatives=torch.randn(3)), ValueError),
    (dict(extra_negatives=[1.0]), TypeError),
])
def test_bad_inputs(bad, exc):
    args = dict(z1=torch.randn(4, 8), z2=torch.randn(4, 8), temperature=0.5, extra_negatives=None)
    args.update(bad)
    with pytest.raises(exc):
        nt_xent_loss(**args)


def test_simclr_module_trains_both_parts():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.BatchNorm1d(16), nn.ReLU())
    model = SimCLR(backbone, nn.Linear(16, 8), temperature=0.5)
    x = torch.rand(6, 3, 8, 8)
    loss = model(x, x + 0.05 * torch.randn_like(x))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError):
        model(x, x[:3])
    with pytest.raises(ValueError):
        SimCLR(backbone, nn.Identity(), temperature=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    z1, z2 = _random_pair(8, 16)
    extra = torch.randn(5, 16)
    cpu = nt_xent_loss(z1, z2, 0.3, extra)
    gpu = nt_xent_loss(z1.cuda(), z2.cuda(), 0.3, extra.cuda())
    assert torch.allclose(cpu, gpu.cpu(), atol=1e-5)


@pytest.mark.parametrize("n", [1, 4, 16, 128])
@pytest.mark.parametrize("t", [0.1, 0.5, 1.0])
def test_chance_level_is_exactly_log_2n_minus_1(n, t):
    # 2N orthonormal rows: every similarity between different rows is 0, positives included,
    # so each anchor's loss is log(sum of 2N-1 ones), for any temperature
    eye = torch.eye(2 * n, dtype=torch.float64)
    assert abs(nt_xent_loss(eye[:n], eye[n:], t).item() - math.log(2 * n - 1)) < 1e-9
    # positives identical to their anchor, negatives orthogonal: -1/T + log(e^(1/T) + 2N-2)
    expected = -1 / t + math.log(math.exp(1 / t) + 2 * n - 2)
    assert abs(nt_xent_loss(eye[:n], eye[:n], t).item() - expected) < 1e-9
