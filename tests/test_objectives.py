"""The one objective contract (training_loss, encoder, caches, ledger_encoders) and make_step."""
import pytest
import torch
import torch.nn as nn

from course_utils.augment import SimCLRAugment
from course_utils.ledger import measure
from course_utils.models import ProjectionHead, SmallResNet, ViT
from course_utils.objectives import MAE, MoCo, Objective, SimCLR, SimSiam, Supervised, make_step

IMAGES = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
LABELS = torch.arange(8) % 3
AUGMENT = SimCLRAugment(16)


def _objective(name):
    torch.manual_seed(0)
    if name == "MAE":
        return MAE(ViT(image_size=16, patch_size=4, dim=16, depth=1, heads=2), decoder_dim=16)
    backbone = SmallResNet(width=4)
    if name == "supervised":
        return Supervised(backbone, nn.Linear(backbone.feature_dim, 3))
    head = ProjectionHead(backbone.feature_dim, 16, 8)
    if name == "SimSiam":
        return SimSiam(backbone, head, dim=8)
    return (SimCLR(backbone, head) if name == "SimCLR" else
            MoCo(backbone, head, queue_size=16, bn_groups=2))


@pytest.mark.parametrize("name", ["supervised", "SimCLR", "MoCo", "MAE", "SimSiam"])
def test_every_objective_keeps_the_contract(name):
    model = _objective(name)
    assert isinstance(model, Objective)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    before = [p.detach().clone() for p in model.encoder.parameters()]
    step = make_step(model, opt, augment=AUGMENT, generator=torch.Generator().manual_seed(1))
    out = step((IMAGES, LABELS, torch.arange(8)))
    assert set(out) >= {"loss"} and out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.encoder.parameters())), \
        "the encoder a probe evaluates is the one the step trains"
    features = model.encoder(IMAGES)
    assert features.shape[0] == 8
    rec = measure(lambda: step((IMAGES, LABELS)), model=model, optimizer=opt, caches=model.caches,
                  encoders=model.ledger_encoders)
    assert all(v > 0 for v in rec.encoded.values()), rec.encoded
    assert (rec.cache_bytes > 0) == (name == "MoCo")


def test_training_loss_returns_what_mae_reconstructs():
    out = _objective("MAE").training_loss(IMAGES, generator=torch.Generator().manual_seed(0))
    assert out["pred"].shape == (8, 16, 4 * 4 * 3) and out["mask"].shape == (8, 16)
    assert out["mask"].sum(1).eq(12).all(), "75% of 16 patches removed per image"


def test_accumulation_sums_micro_batch_gradients():
    """For a per-sample loss (no BatchNorm) k micro-batches give the full batch's update."""
    def run(accumulation):
        torch.manual_seed(0)
        model = Supervised(nn.Sequential(nn.Flatten(), nn.Linear(768, 3)))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        out = make_step(model, opt, accumulation=accumulation)((IMAGES, LABELS))
        return out["loss"], [p.detach() for p in model.parameters()]
    (loss1, p1), (loss4, p4) = run(1), run(4)
    assert torch.allclose(loss1, loss4, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(p1, p4))


def test_accumulation_augments_the_batch_once():
    """With augment=, accumulation draws the batch's views once and splits them, as a data loader
    would: a per-sample loss then gives the full batch's update, and SimCLR's micro-batches see the
    very views of the single-batch step (only the candidates differ)."""
    def run(accumulation):
        torch.manual_seed(0)
        model = Supervised(nn.Sequential(nn.Flatten(), nn.Linear(768, 3)))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        make_step(model, opt, augment=AUGMENT, generator=torch.Generator().manual_seed(2),
                  accumulation=accumulation)((IMAGES, LABELS))
        return [p.detach() for p in model.parameters()]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(run(1), run(4)))

    seen = {}
    def recording(images, generator):
        view = AUGMENT(images, generator)
        seen.setdefault(key, []).append(view)
        return view
    for key in (1, 4):
        model = _objective("SimCLR")
        make_step(model, torch.optim.SGD(model.parameters(), lr=0.0), augment=recording,
                  generator=torch.Generator().manual_seed(2), accumulation=key)(IMAGES)
    assert len(seen[1]) == len(seen[4]) == 2, "each view is drawn once, whatever the micro-batching"
    assert all(torch.equal(a, b) for a, b in zip(seen[1], seen[4]))


def test_accumulation_is_not_exact_with_batchnorm_in_train_mode():
    """BatchNorm normalises with each micro-batch's statistics: even a supervised loss changes.
    In eval mode (running statistics) every sample is processed on its own and it is exact."""
    def grads(train_mode, accumulation):
        torch.manual_seed(0)
        model = Supervised(SmallResNet(width=4, num_classes=3))
        model.train(train_mode)
        make_step(model, torch.optim.SGD(model.parameters(), lr=0.0), accumulation=accumulation)((IMAGES, LABELS))
        return torch.cat([p.grad.flatten() for p in model.parameters()])
    for train_mode, exact in ((True, False), (False, True)):
        g1, g4 = grads(train_mode, 1), grads(train_mode, 4)
        gap = ((g1 - g4).norm() / g1.norm()).item()
        assert (gap < 1e-5) == exact, (train_mode, gap)


def test_simclr_accumulation_shrinks_the_candidates():
    losses = {}
    for k in (1, 4):
        model = _objective("SimCLR")
        step = make_step(model, torch.optim.SGD(model.parameters(), lr=0.0), augment=AUGMENT,
                         generator=torch.Generator().manual_seed(0), accumulation=k)
        losses[k] = float(step(IMAGES)["loss"])
    # at random init the loss is about log(candidates): 15 vs 3 candidates per anchor
    assert losses[1] - losses[4] > 0.8


def test_make_step_reports_the_scheduled_lr_and_runs_under_autocast():
    model = _objective("supervised")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
    step = make_step(model, opt, scheduler=sched, autocast=torch.bfloat16)
    assert [step((IMAGES, LABELS))["lr"] for _ in range(3)] == pytest.approx([0.75, 1.0, 1.0])


def test_bad_inputs_say_what_to_pass():
    model = _objective("SimCLR")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="objective"):
        make_step(nn.Linear(2, 2), opt)
    with pytest.raises(ValueError, match="augment"):
        make_step(model, opt)(IMAGES)
    with pytest.raises(ValueError, match="accumulation"):
        make_step(model, opt, augment=AUGMENT, accumulation=0)
    with pytest.raises(ValueError, match="multiple of accumulation"):
        make_step(model, opt, augment=AUGMENT, accumulation=3)(IMAGES)
    with pytest.raises(ValueError, match="labels"):
        make_step(_objective("supervised"), opt)(IMAGES)
    with pytest.raises(ValueError, match="a batch must be"):
        make_step(model, opt, augment=AUGMENT)((IMAGES, LABELS, LABELS, LABELS))
    with pytest.raises(ValueError, match="autocast"):
        make_step(model, opt, autocast=torch.float64)
