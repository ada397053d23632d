"""course_utils.evaluate: probes read separable features, see nothing in random labels."""

import math

import pytest
import torch
from torch import nn

from course_utils.evaluate import extract_features, knn_accuracy, linear_probe, probe_encoder
from course_utils.models import SmallResNet

torch.set_num_threads(1)

NUM_CLASSES, DIM = 5, 32


def gaussian_blobs(n, seed, separation=4.0, labels=None):
    """n points in DIM dims around NUM_CLASSES well separated means (unit noise)."""
    g = torch.Generator().manual_seed(seed)
    means = separation * torch.eye(NUM_CLASSES, DIM)  # fixed: same classes in every split
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g) if labels is None else labels
    return means[y] + torch.randn(n, DIM, generator=g), y


@pytest.fixture(scope="module")
def blobs():
    train_x, train_y = gaussian_blobs(2000, seed=0)
    test_x, test_y = gaussian_blobs(1000, seed=1)
    return train_x, train_y, test_x, test_y


def chance_band(n_test, p=1 / NUM_CLASSES, sigmas=5):
    """Accuracy of a label-blind classifier: p ± 5 binomial standard deviations."""
    half = sigmas * math.sqrt(p * (1 - p) / n_test)
    return p - half, p + half


# ----------------------------------------------------------------------------- linear probe


def test_linear_probe_separable_blobs(blobs):
    acc = linear_probe(*blobs)
    assert 0.98 <= acc <= 1.0


def test_linear_probe_random_labels_is_chance(blobs):
    train_x, _, test_x, test_y = blobs
    random_y = torch.randint(0, NUM_CLASSES, (train_x.shape[0],), generator=torch.Generator().manual_seed(2))
    lo, hi = chance_band(test_x.shape[0])
    assert lo <= linear_probe(train_x, random_y, test_x, test_y) <= hi


def test_linear_probe_is_deterministic_and_scale_invariant(blobs):
    train_x, train_y, test_x, test_y = blobs
    acc = linear_probe(*blobs, epochs=30)
    assert linear_probe(*blobs, epochs=30) == acc
    # standardisation uses train statistics: wildly scaled and shifted dimensions do not matter
    scale = torch.logspace(-3, 3, DIM)
    shifted = linear_probe(train_x * scale + 100, train_y, test_x * scale + 100, test_y, epochs=30)
    assert abs(shifted - acc) <= 0.01


def test_linear_probe_sees_through_no_grad(blobs):
    with torch.no_grad():
        assert linear_probe(*blobs, epochs=30) >= 0.98


def test_linear_probe_validates():
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    with pytest.raises(ValueError, match="10 feature rows but 9 labels"):
        linear_probe(x, y[:9], x, y)
    with pytest.raises(ValueError, match="dimension 4 but test features 3"):
        linear_probe(x, y, x[:, :3], y)
    with pytest.raises(ValueError, match="N×D"):
        linear_probe(x.reshape(10, 2, 2), y, x, y)
    with pytest.raises(TypeError, match="integer"):
        linear_probe(x, y.float(), x, y)
    with pytest.raises(ValueError, match="NaN"):
        linear_probe(x.clone().fill_(float("nan")), y, x, y)
    with pytest.raises(ValueError, match="epochs"):
        linear_probe(x, y, x, y, epochs=0)


# ----------------------------------------------------------------------------- kNN


def test_knn_separable_blobs(blobs):
    assert 0.97 <= knn_accuracy(*blobs, k=20) <= 1.0


def test_knn_random_labels_is_chance(blobs):
    train_x, _, test_x, test_y = blobs
    random_y = torch.randint(0, NUM_CLASSES, (train_x.shape[0],), generator=torch.Generator().manual_seed(3))
    lo, hi = chance_band(test_x.shape[0])
    assert lo <= knn_accuracy(train_x, random_y, test_x, test_y) <= hi


def test_knn_votes_are_similarity_weighted():
    # two class-0 neighbours at cosine 0.1 vs one class-1 neighbour at cosine 0.9:
    # a majority vote says 0; exp(s/T) weights say 1 (e^9 >> 2·e^1), a flat T says 0.
    query = torch.tensor([[1.0, 0.0]])
    s1, s2 = 0.1, 0.9
    train = torch.tensor([[s1, math.sqrt(1 - s1**2)], [s1, -math.sqrt(1 - s1**2)], [s2, math.sqrt(1 - s2**2)]])
    labels = torch.tensor([0, 0, 1])
    assert knn_accuracy(train, labels, query, torch.tensor([1]), k=3, temperature=0.1) == 1.0
    assert knn_accuracy(train, labels, query, torch.tensor([0]), k=3, temperature=100.0) == 1.0
    assert knn_accuracy(train, labels, query, torch.tensor([1]), k=1) == 1.0


def test_knn_chunking_does_not_change_result(blobs):
    assert knn_accuracy(*blobs, chunk_size=7) == knn_accuracy(*blobs, chunk_size=4096)


def test_knn_validates():
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 10\]"):
        knn_accuracy(x, y, x, y, k=11)
    with pytest.raises(ValueError, match="temperature"):
        knn_accuracy(x, y, x, y, k=3, temperature=0)
    with pytest.raises(ValueError, match="labels"):
        knn_accuracy(x, y[:5], x, y, k=3)


# ----------------------------------------------------------------------------- features


class ModeSpy(nn.Module):
    """Records the mode it ran in and whether autograd was recording."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 3)
        self.seen = []

    def forward(self, x):
        self.seen.append((self.training, torch.is_grad_enabled()))
        return self.lin(x.flatten(1))


def test_extract_features_restores_modes_and_uses_eval_no_grad():
    spy = ModeSpy()
    spy.train()
    spy.lin.eval()  # a mixed state must come back exactly
    feats = extract_features(spy, torch.rand(10, 3, 2, 2), batch_size=4)
    assert spy.seen == [(False, False)] * 3  # 3 batches of 4, 4, 2
    assert spy.training and not spy.lin.training
    assert feats.shape == (10, 3) and feats.dtype == torch.float32 and feats.device.type == "cpu"
    assert not feats.requires_grad


def test_extract_features_matches_eval_forward_and_keeps_bn_stats():
    torch.manual_seed(0)
    model = SmallResNet(width=4, blocks=(1, 1)).train()
    images = torch.rand(9, 3, 16, 16)
    running_mean = model.stem[1].running_mean.clone()
    feats = extract_features(model, images, batch_size=4)
    assert model.training
    assert torch.equal(model.stem[1].running_mean, running_mean)  # eval mode: stats untouched
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(feats, model(images), rtol=1e-5, atol=1e-6)


def test_extract_features_validates():
    with pytest.raises(TypeError):
        extract_features(lambda x: x, torch.rand(2, 3, 8, 8))
    with pytest.raises(ValueError, match="batch_size"):
        extract_features(ModeSpy(), torch.rand(2, 3, 2, 2), batch_size=0)


def test_probe_encoder_returns_both_accuracies():
    class Identity(nn.Module):
        def forward(self, x):
            return x.flatten(1)

    train_x, train_y = gaussian_blobs(400, seed=4)
    test_x, test_y = gaussian_blobs(200, seed=5)
    result = probe_encoder(Identity(), (train_x, train_y), (test_x, test_y), k=10)
    assert set(result) == {"linear", "knn"}
    assert result["linear"] >= 0.97 and result["knn"] >= 0.95
    with pytest.raises(TypeError, match="images"):
        probe_encoder(Identity(), train_x, (test_x, test_y))


def test_extract_features_accepts_a_dataset_object():
    class Dataset:
        images = torch.rand(5, 3, 2, 2)
        labels = torch.zeros(5, dtype=torch.long)

    spy = ModeSpy()
    torch.testing.assert_close(extract_features(spy, Dataset()), extract_features(spy, Dataset.images))


def test_knn_probe_is_knn_accuracy_on_extracted_features():
    from course_utils.evaluate import extract_features, knn_accuracy, knn_probe
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5))
    train = (torch.randn(40, 3, 2, 2), torch.randint(0, 3, (40,)))
    test = (torch.randn(10, 3, 2, 2), torch.randint(0, 3, (10,)))
    expected = knn_accuracy(extract_features(encoder, train[0]), train[1],
                            extract_features(encoder, test[0]), test[1], k=40)
    assert knn_probe(encoder, train, test, k=50) == expected   # k=50 > 40 train samples: capped


def test_batchnorm_calibrated_measures_running_statistics_on_a_copy():
    """The copy's BatchNorm statistics are the images' (one pass, cumulative average); the
    encoder itself keeps (0, 1); a network without BatchNorm comes back with equal weights."""
    import torch
    from course_utils.evaluate import batchnorm_calibrated
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    images = torch.randn(64, 3, 8, 8) * 3 + 2
    calibrated = batchnorm_calibrated(encoder, images, batch_size=64)
    conv_out = encoder[0](images).detach()
    assert torch.allclose(calibrated[1].running_mean, conv_out.mean((0, 2, 3)), atol=1e-5)
    assert torch.equal(encoder[1].running_mean, torch.zeros(4)) and torch.equal(encoder[1].running_var, torch.ones(4))
    plain = torch.nn.Linear(3, 2)
    same = batchnorm_calibrated(plain, images)
    assert same is not plain and torch.equal(same.weight, plain.weight)


@pytest.mark.parametrize("objective", ["SimCLR", "MoCo"])
def test_a_run_probed_on_its_way_goes_on_as_if_it_had_not_been(objective):
    """Lesson 05 trains one run per objective and seed and probes it each time it has spent a
    budget: each shorter budget's run is a prefix of the longer one only if probing leaves the run
    untouched (train mode, BatchNorm statistics, MoCo's key encoder and queue, the data order and
    the views). Fails if a probe changed any of them."""
    from course_utils.augment import SimCLRAugment
    from course_utils.data import load_dataset
    from course_utils.models import ProjectionHead
    from course_utils.objectives import MoCo, SimCLR, make_step
    from course_utils.train import TrainState, fit

    train = load_dataset("shapes", "train", image_size=16, limit=64)
    test = load_dataset("shapes", "test", image_size=16, limit=32)
    augment = SimCLRAugment(16, crop_scale=(0.6, 1.0))

    def run(probe_at):
        torch.manual_seed(0)
        backbone = SmallResNet(width=4, blocks=(1, 1))
        head = ProjectionHead(backbone.feature_dim, 16, 8)
        model = SimCLR(backbone, head) if objective == "SimCLR" else \
            MoCo(backbone, head, queue_size=32, bn_groups=2)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        step = make_step(model, opt, augment=augment, generator=torch.Generator().manual_seed(0))
        state, batches = TrainState(), train.batches(16, seed=0)
        for stop in (*probe_at, 5):
            fit(step, batches, steps=stop, state=state, progress=False)
            if stop in probe_at:
                probe_encoder(model.encoder, train, test, epochs=3)
        return model.state_dict(), state.history.series("loss")

    probed, probed_losses = run(probe_at=(2, 3))
    straight, straight_losses = run(probe_at=())
    assert probed_losses == straight_losses
    assert probed.keys() == straight.keys()
    assert all(torch.equal(probed[k], straight[k]) for k in probed), \
        [k for k in probed if not torch.equal(probed[k], straight[k])]
