"""MoCo: FIFO queue, momentum key encoder, K negatives per anchor, shuffle/split BN."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.objectives.moco import (FeatureQueue, MoCo, bn_group_overlap, encode_in_groups,
                                          queue_staleness, shuffle_batch, unshuffle_batch)


def _tagged(start, b, dim):
    """b keys whose first entry is their global enqueue index (start..start+b-1)."""
    keys = torch.zeros(b, dim)
    keys[:, 0] = torch.arange(start, start + b, dtype=torch.float32)
    return keys


def _contents(queue):
    return sorted(queue.keys[:, 0].tolist())


def test_queue_buffers_and_init():
    q = FeatureQueue(16, 8)
    names = dict(q.named_buffers())
    assert {"keys", "ptr"} <= set(names) and {"keys", "ptr"} <= set(q.state_dict())
    assert q.keys.shape == (16, 8) and int(q.ptr) == 0
    assert torch.allclose(q.keys.norm(dim=1), torch.ones(16), atol=1e-5)
    assert not q.filled().any()


@pytest.mark.parametrize("size, b", [(12, 4), (10, 4), (7, 3), (5, 5)])
def test_queue_is_exactly_fifo(size, b):
    # also covers size % b != 0: a batch straddling the end wraps to the start
    q, total = FeatureQueue(size, 3), 0
    for step in range(9):
        q.enqueue(_tagged(total, b, 3))
        total += b
        assert int(q.ptr) == total % size
        expected = list(range(max(0, total - size), total))
        if total >= size:  # after K + B enqueued keys the oldest are gone, the newest K remain
            assert _contents(q) == expected, (step, _contents(q))
        else:
            assert sorted(v for v, f in zip(q.keys[:, 0].tolist(), q.filled().tolist()) if f) == expected


def test_queue_oldest_batch_gone_after_k_plus_b():
    size, b = 12, 4
    q = FeatureQueue(size, 2)
    for i in range((size + b) // b):
        q.enqueue(_tagged(i * b, b, 2))
    assert min(_contents(q)) == b  # keys 0..b-1 evicted, everything else present
    assert _contents(q) == list(range(b, size + b))


def test_queue_ages_and_ids():
    q = FeatureQueue(6, 2)
    q.enqueue(_tagged(0, 4, 2), ids=torch.tensor([10, 11, 12, 13]))
    q.enqueue(_tagged(4, 4, 2), ids=torch.tensor([14, 15, 16, 17]))  # wraps: slots 4, 5, 0, 1
    assert q.ids.tolist() == [16, 17, 12, 13, 14, 15]
    assert q.ages().tolist() == [1, 1, 2, 2, 1, 1]
    assert q.filled().all()


def test_queue_bad_inputs():
    q = FeatureQueue(4, 3)
    with pytest.raises(ValueError, match="dim"):
        q.enqueue(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="larger than the queue"):
        q.enqueue(torch.zeros(5, 3))
    with pytest.raises(ValueError):
        q.enqueue(torch.zeros(3))
    with pytest.raises(ValueError):
        q.enqueue(torch.zeros(2, 3), ids=torch.zeros(3))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="size"):
            FeatureQueue(bad, 3)
    for bad in (2.5, True):
        with pytest.raises(TypeError, match="size"):
            FeatureQueue(bad, 3)


def _parts(bn=True, seed=0):
    """(backbone, projector) of a tiny MoCo: 3×4×4 images -> 16 features -> 8-d keys."""
    torch.manual_seed(seed)
    layers = [nn.Flatten(), nn.Linear(3 * 4 * 4, 16)]
    if bn:
        layers.append(nn.BatchNorm1d(16))
    return nn.Sequential(*layers, nn.ReLU()), nn.Linear(16, 8)


def _encoder(bn=True, seed=0):
    return nn.Sequential(*_parts(bn, seed))


def test_key_encoder_gets_no_gradient_and_query_does():
    model = MoCo(*_parts(), queue_size=32, bn_groups=2)
    x = torch.rand(8, 3, 4, 4)
    model(x, x.flip(-1)).backward()
    assert all(not p.requires_grad and p.grad is None for p in model.key_encoder.parameters())
    assert all(p.grad is not None for p in model.query_encoder.parameters())
    assert not model.queue.keys.requires_grad


@pytest.mark.parametrize("b", [4, 8, 16])
def test_negatives_per_anchor_is_queue_size(b):
    model = MoCo(*_parts(), queue_size=64)
    x = torch.rand(b, 3, 4, 4)
    q, k = model.encode_queries(x), model.encode_keys(x)
    assert model.contrastive_logits(q, k).shape == (b, 1 + 64)


def test_ema_math():
    model = MoCo(*_parts(), queue_size=16, momentum=0.9)
    with torch.no_grad():
        for p in model.query_encoder.parameters():
            p.add_(torch.randn_like(p))
    old_k = [p.clone() for p in model.key_encoder.parameters()]
    new_q = [p.clone() for p in model.query_encoder.parameters()]
    model.momentum_update()
    for pk, ok, pq in zip(model.key_encoder.parameters(), old_k, new_q):
        assert torch.allclose(pk, 0.9 * ok + 0.1 * pq, atol=1e-6)
    model.momentum = 0.0
    model.momentum_update()
    assert all(torch.equal(a, b) for a, b in zip(model.key_encoder.parameters(), new_q))


def test_forward_enqueues_this_steps_keys_in_training_only():
    model = MoCo(*_parts(bn=False), queue_size=16, bn_groups=1)
    x = torch.rand(4, 3, 4, 4)
    before = model.queue.keys.clone()
    model(x, x)
    assert int(model.queue.ptr) == 4 and model.queue.filled().sum() == 4
    expected = F.normalize(model.key_encoder(x), dim=1)  # momentum update already applied
    assert torch.allclose(model.queue.keys[:4], expected, atol=1e-6)
    assert torch.equal(model.queue.keys[4:], before[4:])
    model.eval()
    model(x, x)
    assert int(model.queue.ptr) == 4


def test_shuffle_roundtrip_and_split_bn():
    x = torch.arange(10.0).reshape(10, 1)
    g = torch.Generator().manual_seed(0)
    shuffled, idx = shuffle_batch(x, g)
    assert not torch.equal(shuffled, x) and torch.equal(unshuffle_batch(shuffled, idx), x)
    enc = _encoder()
    imgs = torch.rand(8, 3, 4, 4)
    grouped = encode_in_groups(enc, imgs, 2)
    by_hand = torch.cat([enc(imgs[:4]), enc(imgs[4:])])
    assert torch.allclose(grouped, by_hand, atol=1e-6)
    # different BN groups really give different statistics (what makes the shuffle matter)
    assert not torch.allclose(grouped, enc(imgs), atol=1e-3)


def test_shuffled_keys_come_back_in_order():
    # without BatchNorm the shuffle must not change any key: it only moves BN group membership
    model = MoCo(*_parts(bn=False), queue_size=16, bn_groups=4)
    x = torch.rand(8, 3, 4, 4)
    keys = model.encode_keys(x, torch.Generator().manual_seed(1))
    assert torch.allclose(keys, F.normalize(model.key_encoder(x), dim=1), atol=1e-6)


def test_queue_in_state_dict_roundtrip():
    a = MoCo(*_parts(), queue_size=16)
    x = torch.rand(4, 3, 4, 4)
    a(x, x)
    b = MoCo(*_parts(seed=1), queue_size=16)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.queue.keys, b.queue.keys) and int(b.queue.ptr) == 4


def test_staleness_fresh_key_is_not_stale():
    model = MoCo(*_parts(bn=False), queue_size=16, bn_groups=1, momentum=0.5)
    images = torch.rand(12, 3, 4, 4)
    model(images[:4], images[:4], ids=torch.arange(4))
    ages, cos = queue_staleness(model, images)
    assert ages.tolist() == [1, 1, 1, 1] and torch.allclose(cos, torch.ones(4), atol=1e-5)
    with torch.no_grad():  # the query encoder moves; after the next EMA step old keys drift
        for p in model.query_encoder.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model(images[4:8], images[4:8], ids=torch.arange(4, 8))
    ages, cos = queue_staleness(model, images)
    assert sorted(ages.tolist()) == [1] * 4 + [2] * 4
    assert cos[ages == 1].min() > 0.9999 and cos[ages == 2].max() < 0.999


def test_moco_bad_inputs():
    for kwargs in (dict(momentum=1.5), dict(temperature=0.0), dict(bn_groups=0)):
        with pytest.raises(ValueError):
            MoCo(*_parts(), **kwargs)
    with pytest.raises(TypeError):
        MoCo("resnet", nn.Linear(16, 8))
    model = MoCo(*_parts(), queue_size=4)
    with pytest.raises(ValueError, match="larger than the queue"):
        model(torch.rand(8, 3, 4, 4), torch.rand(8, 3, 4, 4))
    with pytest.raises(ValueError):
        model(torch.rand(4, 3, 4, 4), torch.rand(2, 3, 4, 4))
    with pytest.raises(ValueError, match="BatchNorm groups"):
        MoCo(*_parts(), bn_groups=4)(torch.rand(6, 3, 4, 4), torch.rand(6, 3, 4, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda():
    model = MoCo(*_parts(), queue_size=16).cuda()
    x = torch.rand(4, 3, 4, 4, device="cuda")
    model(x, x, ids=torch.arange(4), generator=torch.Generator().manual_seed(0)).backward()
    assert model.queue.keys.is_cuda and int(model.queue.ptr) == 4


def test_unshuffled_keys_use_their_querys_bn_group():
    # shuffle_keys=False: each key is normalised with exactly its query's group (the BN leak)
    model = MoCo(*_parts(), queue_size=16, bn_groups=2, shuffle_keys=False)
    x = torch.rand(8, 3, 4, 4)
    expected = F.normalize(encode_in_groups(model.key_encoder, x, 2), dim=1)
    assert torch.equal(model.encode_keys(x, torch.Generator().manual_seed(1)), expected)
    shuffled = MoCo(*_parts(), queue_size=16, bn_groups=2)
    assert not torch.allclose(shuffled.encode_keys(x, torch.Generator().manual_seed(1)), expected, atol=1e-4)
    with pytest.raises(TypeError):
        MoCo(*_parts(), shuffle_keys="yes")



@pytest.mark.parametrize("arm", [dict(shuffle_keys=False), dict(bn_groups=1)])
def test_arms_without_the_shuffle_consume_the_same_random_numbers(arm):
    # the world where this fails: the unshuffled arm of lesson 03 sees other augmentations than
    # the shuffled one from step 2 on, and the comparison is confounded
    from course_utils.augment import SimCLRAugment
    images, states = torch.rand(8, 3, 4, 4), []
    for kwargs in (dict(), arm):
        torch.manual_seed(0)
        model = MoCo(*_parts(), queue_size=16, **kwargs)
        gen = torch.Generator().manual_seed(3)
        model.training_loss(images, augment=SimCLRAugment(4), generator=gen)
        states.append(gen.get_state())
    assert torch.equal(*states)

def _overlap_by_hand(perm, groups):
    b, size = len(perm), len(perm) // groups
    query_group = [set(range(g * size, (g + 1) * size)) for g in range(groups)]
    key_group = [set(perm[g * size:(g + 1) * size].tolist()) for g in range(groups)]
    out = []
    for i in range(b):
        kg = next(s for s in key_group if i in s)
        out.append(len(kg & query_group[i // size]) / size)
    return out


@pytest.mark.parametrize("b, groups", [(10, 2), (12, 3), (16, 4), (8, 1)])
def test_bn_group_overlap_is_exact(b, groups):
    g = torch.Generator().manual_seed(b)
    for _ in range(5):
        perm = torch.randperm(b, generator=g)
        assert torch.allclose(bn_group_overlap(perm, groups), torch.tensor(_overlap_by_hand(perm, groups)))
    assert (bn_group_overlap(torch.arange(b), groups) == 1).all()   # no shuffle: the same group


def test_bn_group_overlap_mean_is_about_one_over_groups():
    g, b, groups = torch.Generator().manual_seed(0), 128, 2
    mean = torch.stack([bn_group_overlap(torch.randperm(b, generator=g), groups) for _ in range(500)]).mean()
    size = b // groups
    assert abs(mean.item() - (1 + (size - 1) ** 2 / (b - 1)) / size) < 0.005
