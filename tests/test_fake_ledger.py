"""The ledger on fake tensors gives the real ledger's numbers, exactly, for every kit model."""
import resource

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.augment import SimCLRAugment
from course_utils.ledger import fake_mode, is_fake, measure, predict_step
from course_utils.experiments.training_memory import measure_tinygpt
from course_utils.models import SmallResNet, ViT, build_encoder, clone_module
from course_utils.models.heads import MLP, ProjectionHead
from course_utils.objectives import MAE, MoCo, SimCLR, Supervised, make_step
from course_utils.optim import OPTIMIZERS, make_optimizer

LINES = ("flops", "forward_flops", "backward_flops", "activation_bytes", "param_bytes",
         "grad_bytes", "optimizer_bytes", "cache_bytes", "comm_bytes", "encoded", "saved_tensors")


def kit_objective(name):
    """One CI-size model per kit objective (16 px images, 8 per batch)."""
    if name == "supervised-resnet":
        return Supervised(SmallResNet(num_classes=10)), None
    if name == "supervised-vit":
        return Supervised(ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=2, num_classes=10)), None
    if name == "supervised-mlp":
        return Supervised(MLP(3 * 16 * 16, 32, 10)), None
    if name in ("simclr", "simclr-tiled"):
        backbone = SmallResNet()
        return SimCLR(backbone, ProjectionHead(backbone.feature_dim, 32, 16),
                      tile=4 if name == "simclr-tiled" else None), SimCLRAugment(16)
    if name == "moco":
        backbone = SmallResNet()
        return MoCo(backbone, ProjectionHead(backbone.feature_dim, 32, 16), queue_size=64), SimCLRAugment(16)
    if name == "mae":
        return MAE(ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=2)), None
    raise ValueError(name)


def ledger_of(name, optimizer="adamw", accumulation=1):
    torch.manual_seed(0)
    model, augment = kit_objective(name)
    opt = make_optimizer(optimizer, model.parameters(), lr=0.1)
    step = make_step(model, opt, augment=augment, generator=torch.Generator().manual_seed(0),
                     accumulation=accumulation)
    x = torch.rand(8, 3, 16, 16)
    x = x.flatten(1) if name == "supervised-mlp" else x
    batch = (x, torch.randint(0, 10, (8,))) if name.startswith("supervised") else (x, None)
    step(batch)  # a first step creates the optimizer state
    return measure(lambda: step(batch), model=model, optimizer=opt, caches=model.caches,
                   encoders=model.ledger_encoders)


def same_lines(real, fake):
    return {k: (getattr(real, k), getattr(fake, k)) for k in LINES if getattr(real, k) != getattr(fake, k)}


@pytest.mark.parametrize("name", ["supervised-resnet", "supervised-vit", "supervised-mlp",
                                  "simclr", "simclr-tiled", "moco", "mae"])
def test_every_objective_fake_equals_real(name):
    real = ledger_of(name)
    with fake_mode():
        fake = ledger_of(name)
    assert fake.fake and not real.fake and fake.peak_bytes is None
    assert real.flops > 0 and real.activation_bytes > 0 and real.optimizer_bytes > 0
    assert same_lines(real, fake) == {}, "fake and real ledgers differ (real, fake)"


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_every_optimizer_and_accumulation(optimizer):
    real = ledger_of("supervised-resnet", optimizer, accumulation=2)
    with fake_mode():
        fake = ledger_of("supervised-resnet", optimizer, accumulation=2)
    assert same_lines(real, fake) == {}


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("autocast", [False, True])
def test_tinygpt_fake_equals_real(recompute, autocast):
    args = dict(layers=2, hidden=32, heads=4, vocab=64, seq=16, batch=2)
    real, _ = measure_tinygpt(**args, recompute=recompute, autocast=autocast, steps=2)
    with fake_mode():
        fake, model = measure_tinygpt(**args, recompute=recompute, autocast=autocast, steps=2)
    assert is_fake(next(model.parameters()))
    assert same_lines(real, fake) == {}


def test_fake_matches_the_analytic_prediction():
    model_real = build_encoder("resnet", 16)
    with fake_mode():
        torch.manual_seed(0)
        model = nn.Sequential(SmallResNet(), nn.Linear(SmallResNet().feature_dim, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.rand(4, 3, 16, 16), torch.randint(0, 10, (4,))

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        fake = measure(step, model=model, optimizer=opt)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))
    with fake_mode():
        fake_mlp = clone_module(mlp)
        opt = torch.optim.SGD(fake_mlp.parameters(), lr=0.1)
        x, y = torch.rand(4, 3, 16, 16), torch.randint(0, 10, (4,))
        rec = measure(lambda: F.cross_entropy(fake_mlp(x), y).backward(), model=fake_mlp, optimizer=opt)
    rec.compare({k: v for k, v in predict_step(mlp, (4, 3, 16, 16)).items()
                 if k != "optimizer_bytes"}).assert_close(rtol=0.0)
    assert fake.param_bytes == 4 * sum(p.numel() for p in model_real.parameters()) + 4 * (64 * 10 + 10)


def test_a_big_model_costs_no_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with fake_mode():
        big = nn.Linear(40_000, 40_000)            # 6.4 GB of fp32 weights if it were real
        opt = torch.optim.AdamW(big.parameters(), foreach=False)
        x = torch.randn(64, 40_000)
        rec = measure(lambda: (big(x).square().mean().backward(), opt.step()), model=big, optimizer=opt)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert rec.param_bytes == 4 * (40_000 ** 2 + 40_000) and rec.optimizer_bytes == 2 * rec.param_bytes
    assert rec.forward_flops == 2 * 64 * 40_000 ** 2
    assert grown_mib < 200, f"building a fake 6.4 GB layer grew peak memory by {grown_mib:.0f} MiB"


def test_data_dependent_step_says_so():
    with fake_mode():
        model = nn.Linear(4, 4)
        x = torch.randn(8, 4)
        with pytest.raises(ValueError, match="cannot be known without data"):
            measure(lambda: model(x[x[:, 0] > 0]).sum().backward(), model=model)


def test_clone_module_is_a_deep_copy():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    copy = clone_module(net)
    for a, b in zip(list(net.parameters()) + list(net.buffers()), list(copy.parameters()) + list(copy.buffers())):
        assert torch.equal(a, b) and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert all(isinstance(p, nn.Parameter) for p in copy.parameters())
    with pytest.raises(TypeError):
        clone_module("net")


def test_peak_is_measured_once_and_mfu_is_a_fraction_of_it():
    from course_utils.ledger import peak_flops, utilisation
    from course_utils.experiments.training_memory import recompute_tradeoff
    peak = peak_flops("cpu")
    assert peak > 1e8 and peak_flops("cpu") == peak          # cached: the same reading
    u = utilisation(10 ** 9, 2.0)
    assert u["flops_per_second"] == 5e8 and u["mfu"] == 5e8 / peak
    row = recompute_tradeoff(2, 64, 4, 97, 32, 3, modes=("none",), repeats=1)[0]
    assert 0 < row["mfu"] < 1, row   # a toy step cannot beat the large-matmul peak
    with pytest.raises(ValueError):
        utilisation(10, 0.0)


def test_a_peak_timed_on_a_busy_machine_is_timed_again_when_a_step_beats_it(monkeypatch):
    """A low cached peak (as if timed under load) is re-measured, not reported as MFU > 1; a step
    that still beats the fresh reading warns instead of passing silently."""
    from course_utils.ledger import speed
    speed.peak_flops("cpu")
    key = ("cpu", 1024, 5, torch.get_num_threads())          # the default reading, just cached
    monkeypatch.setitem(speed._PEAKS, key, 1e3)               # a peak read on a very busy machine
    u = speed.utilisation(10 ** 9, 1.0)                      # 1 GFLOP/s: far above 1 kFLOP/s
    assert u["peak_flops"] > 1e8 and speed._PEAKS[key] == u["peak_flops"] and u["mfu"] < 1
    with pytest.warns(UserWarning, match="beats the measured matmul peak"):
        assert speed.utilisation(10 ** 18, 1.0)["mfu"] > 1
