import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.ledger import cuda_peak_bytes, measure, predict_step, record_memory_snapshot
from course_utils.optim import OPTIMIZERS, make_optimizer


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def supervised_step(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


@pytest.mark.parametrize("make", [mlp, cnn])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("batch", [4, 32])
def test_prediction_matches_measurement(make, opt_name, batch):
    torch.manual_seed(0)
    model = make()
    opt = make_optimizer(opt_name, model.parameters(), lr=0.1)
    x, y = torch.rand(batch, 3, 8, 8), torch.randint(0, 10, (batch,))
    record = measure(supervised_step(model, opt, x, y), model=model, optimizer=opt)
    record.compare(predict_step(model, x.shape, optimizer=opt_name)).assert_close(rtol=0.0)
    assert record.encoded == {"images": batch}


def test_mlp_flops_by_hand():
    model = mlp()
    x, y = torch.rand(5, 3, 8, 8), torch.randint(0, 10, (5,))
    rec = measure(supervised_step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y), model=model)
    d = 3 * 8 * 8
    assert rec.forward_flops == 2 * 5 * (d * 64 + 64 * 10)
    # first layer: weight gradient only (the batch needs no gradient); second: weight + input
    assert rec.backward_flops == 2 * 5 * d * 64 + 2 * 2 * 5 * 64 * 10


def test_activation_bytes_linear_in_batch_resident_constant():
    records = []
    for batch in (8, 16, 32):
        model = cnn()
        torch.manual_seed(0)
        x, y = torch.rand(batch, 3, 8, 8), torch.randint(0, 10, (batch,))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        records.append(measure(supervised_step(model, opt, x, y), model=model, optimizer=opt))
    a = [r.activation_bytes for r in records]
    # doubling the batch doubles per-sample activations; the fixed part is BatchNorm's 2·C stats
    # and the NLL scalar
    fixed = 2 * 8 * 4 + 4
    assert (a[1] - fixed) == pytest.approx(2 * (a[0] - fixed), rel=1e-9)
    assert (a[2] - fixed) == pytest.approx(4 * (a[0] - fixed), rel=1e-9)
    assert len({r.param_bytes + r.grad_bytes for r in records}) == 1


def test_peak_not_sum_under_accumulation():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.rand(16, 3, 8, 8), torch.randint(0, 10, (16,))
    one = measure(supervised_step(model, opt, x, y), model=model).activation_bytes

    micro = list(zip(x.chunk(4), y.chunk(4)))  # views of one batch tensor: each counts its slice

    def accumulate():
        opt.zero_grad()
        for xs, ys in micro:
            F.cross_entropy(model(xs), ys).backward()
        opt.step()
    four = measure(accumulate, model=model).activation_bytes
    # four micro-batches of 4 keep only one micro-batch alive at a time
    assert four < one / 3


def test_caches_and_optimizer_state():
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    queue = torch.zeros(128, 16)
    rec = measure(supervised_step(model, opt, torch.rand(2, 3, 8, 8), torch.tensor([1, 2])),
                  model=model, optimizer=opt, caches=[queue])
    assert rec.cache_bytes == 128 * 16 * 4
    assert rec.optimizer_bytes == 2 * rec.param_bytes
    assert rec.peak_bytes is None and "not measured" in str(rec)


def test_bad_inputs():
    with pytest.raises(TypeError):
        measure(42)
    with pytest.raises(ValueError, match="optimizer"):
        predict_step(mlp(), (2, 3, 8, 8), optimizer="lion")
    with pytest.raises(ValueError, match="positive"):
        predict_step(mlp(), (-2, 3, 8, 8))
    with pytest.raises(ValueError, match="no rule"):
        predict_step(nn.Sequential(nn.Flatten(), nn.Linear(192, 4), nn.Tanh()), (2, 3, 8, 8))
    rec = measure(lambda: None)
    with pytest.raises(ValueError, match="unknown ledger lines"):
        rec.compare({"flopz": 1})
    with pytest.raises(AssertionError, match="off by"):
        rec.compare({"flops": 100}).assert_close()


def test_slice_of_a_dataset_counts_as_the_slice():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data, labels = torch.rand(1000, 3, 8, 8), torch.randint(0, 10, (1000,))
    sliced = measure(supervised_step(model, opt, data[:16], labels[:16]), model=model)
    copied = measure(supervised_step(model, opt, data[:16].clone(), labels[:16].clone()), model=model)
    assert sliced.activation_bytes == copied.activation_bytes


def test_cuda_helpers_on_a_cpu_step(tmp_path):
    ran = []
    assert cuda_peak_bytes(lambda: ran.append(1), "cpu") is None
    assert ran == [1], "the step runs once whatever the device"
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour of the snapshot")
    assert record_memory_snapshot(lambda: ran.append(1), tmp_path / "s.pickle") is None
    assert not (tmp_path / "s.pickle").exists()


def test_cuda_peak_is_the_records_peak():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = mlp().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.rand(64, 3, 8, 8, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    step = supervised_step(model, opt, x, y)
    step()
    rec = measure(step, model=model, optimizer=opt)
    alone = cuda_peak_bytes(step, "cuda")
    assert rec.peak_bytes > 0 and alone > 0 and rec.notes == ""
    # the record's reading and the helper's are one function: same step, same peak
    assert rec.peak_bytes == pytest.approx(alone, rel=0.25)


# ------------------------------------------------------------------ the repeated line
def test_recomputed_flops_are_the_forward_run_again_in_backward():
    """Full recomputation re-runs every block's forward inside backward: the ledger's repeated
    line is exactly what the backward gains over the same step without it."""
    from course_utils.ledger import fake_mode
    from course_utils.experiments.planning import gpt_ledger
    recs = {}
    for mode in ("none", "full"):
        with fake_mode():
            recs[mode] = gpt_ledger(layers=2, hidden=64, heads=4, vocab=97, seq=32, batch=2, recompute=mode)
    assert recs["none"].recomputed_flops == 0
    assert recs["full"].recomputed_flops == recs["full"].backward_flops - recs["none"].backward_flops > 0
    assert recs["full"].forward_flops == recs["none"].forward_flops


def test_re_encoded_counts_gradient_cachings_second_pass_not_a_cache():
    """Gradient caching encodes the 2N views without a graph, then again chunk by chunk with
    one: the second pass is the repeated line (2N items); the naive step repeats nothing."""
    from course_utils.augment import SimCLRAugment
    from course_utils.models import SmallResNet
    from course_utils.models.heads import ProjectionHead
    from course_utils.objectives import SimCLR, make_step
    images, n = torch.rand(8, 3, 16, 16), 8
    for chunks, repeated in ((1, 0), (4, 2 * n)):
        torch.manual_seed(0)
        backbone = SmallResNet(width=4, blocks=(1,))
        model = SimCLR(backbone, ProjectionHead(backbone.feature_dim, 16, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        step = make_step(model, opt, augment=SimCLRAugment(16), generator=torch.Generator().manual_seed(0),
                         chunks=chunks)
        rec = measure(lambda: step((images, None)), model=model, optimizer=opt,
                      encoders={"views": model.encoder})
        assert rec.encoded["views"] == 2 * n + repeated
        assert rec.re_encoded.get("views", 0) == repeated


def test_the_ledger_stands_on_torch_and_the_ground_modules_only():
    """Importing the ledger loads none of what it measures (models, objectives, distributed
    mechanisms, experiments): the world where this fails is an arrow back up, which once made
    ``import course_utils.ledger`` load the objectives (issue 25)."""
    import subprocess
    import sys
    code = ("import sys, course_utils.ledger; print(' '.join(sorted(m for m in sys.modules "
            "if m.startswith('course_utils.'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    above = [m for m in loaded if m.split(".")[1] not in ("ledger", "checks", "optim", "report")]
    assert not above, f"course_utils.ledger loads {above}"
