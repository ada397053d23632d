"""SimSiam (course_utils.objectives.simsiam) against the paper's formula, its stop-gradient, the
collapse it prevents, and the representation diagnostics (course_utils.evaluate)."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_utils.augment import SimCLRAugment
from course_utils.evaluate import alignment_uniformity, collapse_stats
from course_utils.models import SmallResNet
from course_utils.objectives import SimSiam, make_step
from course_utils.objectives.simsiam import negative_cosine, simsiam_loss


def _reference(p1, p2, z1, z2):
    """Chen & He (2021), Algorithm 1, written from the paper: D(p, z) = −cos(p, z.detach())."""
    def d(p, z):
        return -F.cosine_similarity(p, z.detach(), dim=-1).mean()
    return d(p1, z2) / 2 + d(p2, z1) / 2


def test_the_loss_equals_the_papers_pseudocode_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(16, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    ours = simsiam_loss(*leaves)
    grads = torch.autograd.grad(ours, leaves[:2])
    ref = _reference(*leaves)
    ref_grads = torch.autograd.grad(ref, leaves[:2])
    assert abs(ours.item() - ref.item()) < 1e-12
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(grads, ref_grads))
    assert -1 <= ours.item() <= 1


def test_the_stop_gradient_cuts_the_target_branch_and_the_ablation_does_not():
    g = torch.Generator().manual_seed(1)
    p1, p2, z1, z2 = (torch.randn(8, 4, generator=g, requires_grad=True) for _ in range(4))
    stopped = torch.autograd.grad(simsiam_loss(p1, p2, z1, z2), (z1, z2), allow_unused=True)
    assert all(gr is None for gr in stopped)
    flowing = torch.autograd.grad(simsiam_loss(p1, p2, z1, z2, stop_gradient=False), (z1, z2))
    assert all(gr.abs().sum() > 0 for gr in flowing)
    z = torch.randn(8, 4, generator=g)
    assert negative_cosine(z, z).item() == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same non-empty shape"):
        negative_cosine(z, z[:4])


def _train(stop_gradient: bool, steps: int = 100) -> dict:
    torch.manual_seed(0)
    backbone = SmallResNet(width=8, blocks=(1, 1))
    # a linear projector: a BatchNorm at its output would hold every dimension's variance up
    model = SimSiam(backbone, torch.nn.Linear(backbone.feature_dim, 32), dim=32,
                    stop_gradient=stop_gradient)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    augment = SimCLRAugment(16)
    images = torch.rand(256, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    step = make_step(model, opt, augment=augment, generator=torch.Generator().manual_seed(0))
    for i in range(steps):
        step((images[(32 * i) % 256:(32 * i) % 256 + 32], None))
    model.eval()
    with torch.no_grad():
        views = [augment(images[:128], torch.Generator().manual_seed(k)) for k in (7, 8)]
        z1, z2 = (model.embed(v) for v in views)
    return {**collapse_stats(z1), **alignment_uniformity(z1, z2), "dim": 32}


def test_without_the_stop_gradient_the_representation_collapses():
    """The ablation that shows why SimSiam has a stop-gradient: trained the same way, the run
    without it ends with its features near one vector (a fraction of the kept run's spread, an
    effective rank near 1, views in trivial agreement), while the kept run stays spread."""
    kept, cut = _train(True), _train(False)
    assert cut["std"] < 0.2 * kept["std"], (cut, kept)
    assert cut["effective_rank"] < 1.1 and kept["effective_rank"] > 2, (cut, kept)
    assert cut["alignment"] < 0.1 * kept["alignment"], (cut, kept)   # the views agree trivially


def test_diagnostics_on_known_inputs():
    one = torch.ones(10, 4)
    assert collapse_stats(one)["std"] == 0.0 and collapse_stats(one)["effective_rank"] == pytest.approx(1.0)
    spread = torch.eye(4).repeat(3, 1)
    stats = collapse_stats(spread)
    assert stats["effective_rank"] == pytest.approx(4.0, rel=1e-6)   # 4 orthogonal directions, equally used
    same = alignment_uniformity(spread, spread)
    assert same["alignment"] == 0.0 and same["uniformity"] < 0
    assert alignment_uniformity(one, one) == {"alignment": 0.0, "uniformity": 0.0}
    with pytest.raises(ValueError, match="at least 2 rows"):
        collapse_stats(torch.ones(1, 4))


def test_view_embeddings_reads_what_each_loss_compares_in_eval_mode():
    """The lessons' one reading of two views' features: SimSiam's projections (not its
    predictions), in eval mode (BatchNorm's running statistics, so a row does not depend on the
    rest of the batch), without gradients; the model is left in the mode it was in."""
    from course_utils.evaluate import view_embeddings
    backbone = SmallResNet(width=4)
    model = SimSiam(backbone, torch.nn.Linear(backbone.feature_dim, 16), dim=16).train()
    views = [torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(k)) for k in (1, 2)]
    z1, z2 = view_embeddings(model, views)
    assert model.training and not z1.requires_grad and z1.shape == (6, 16)
    model.eval()
    with torch.no_grad():
        assert torch.equal(z1, model.embed(views[0])) and torch.equal(z2, model.embed(views[1]))
        # eval mode: a row does not depend on the rest of the batch (to rounding: the batch size
        # may change the kernels' summation order)
        torch.testing.assert_close(z1[:3], model.embed(views[0][:3]), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="two views"):
        view_embeddings(model, views[:1])
    with pytest.raises(TypeError, match="embed"):
        view_embeddings(SmallResNet(width=4), views)


def test_the_kit_recipe_is_the_papers_heads_with_a_full_width_predictor():
    """SimSiam.recipe: the one construction lesson 13, the SSL benchmark and gpu_budget share."""
    backbone = SmallResNet(width=4)
    model = SimSiam.recipe(backbone, 16, stop_gradient=False)
    assert isinstance(model.projector.net[-1], torch.nn.BatchNorm1d)       # projector ends in BN
    assert model.predictor[0].out_features == 16 and model.stop_gradient is False
    with pytest.raises(TypeError, match="feature_dim"):
        SimSiam.recipe(torch.nn.Linear(3, 3), 16)
