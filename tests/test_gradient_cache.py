"""More candidates without more back-propagated images: the tiled NT-Xent and gradient caching."""
import pytest
import torch
import torch.nn as nn

from course_utils.ledger import measure
from course_utils.objectives import MoCo, SimCLR, make_step
from course_utils.objectives.simclr import nt_xent_loss, nt_xent_loss_tiled


@pytest.mark.parametrize("n, d, m, tile", [(5, 8, 0, 3), (16, 4, 7, 5), (3, 6, 2, 100), (8, 3, 0, 1)])
def test_tiled_loss_equals_plain_loss_in_value_and_gradients(n, d, m, tile):
    g = torch.Generator().manual_seed(n + m)
    leaves = [torch.randn(k, d, generator=g, dtype=torch.float64, requires_grad=True) for k in (n, n, m)]
    negatives = leaves[2] if m else None
    plain = nt_xent_loss(leaves[0], leaves[1], 0.3, negatives)
    tiled = nt_xent_loss_tiled(leaves[0], leaves[1], 0.3, tile, negatives)
    wrt = leaves if m else leaves[:2]
    assert abs(plain.item() - tiled.item()) < 1e-12
    for a, b in zip(torch.autograd.grad(plain, wrt), torch.autograd.grad(tiled, wrt)):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_tiled_loss_keeps_order_n_d_not_n_squared():
    n, d = 512, 16
    z1, z2 = (torch.randn(n, d, requires_grad=True) for _ in range(2))
    kept = {name: measure(lambda f=f: f(z1, z2).backward()).activation_bytes
            for name, f in (("plain", lambda a, b: nt_xent_loss(a, b, 0.5)),
                            ("tiled", lambda a, b: nt_xent_loss_tiled(a, b, 0.5, 64)))}
    assert kept["plain"] >= (2 * n) ** 2 * 4, "the plain loss keeps the 2N×2N logits"
    assert kept["tiled"] <= 8 * (2 * n) * d * 4, "the tiled loss keeps a few 2N×d tensors"


def _simclr(bn: bool, dtype=torch.float64, tile=None):
    torch.manual_seed(0)
    layers = [nn.Flatten(), nn.Linear(3 * 8 * 8, 32)] + ([nn.BatchNorm1d(32)] if bn else []) + [nn.ReLU()]
    return SimCLR(nn.Sequential(*layers), nn.Linear(32, 16), temperature=0.5, tile=tile).to(dtype)


def _augment(images, generator):
    return images + 0.1 * torch.randn(images.shape, generator=generator, dtype=images.dtype)


def _update(model, images, **kwargs):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = make_step(model, opt, augment=_augment, generator=torch.Generator().manual_seed(1), **kwargs)(images)["loss"]
    return loss, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_gradient_caching_gives_the_full_batch_update_and_accumulation_does_not():
    images = torch.rand(16, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full_loss, full = _update(_simclr(bn=False), images)
    for kwargs in (dict(chunks=4), dict(chunks=2), dict(chunks=4, model_tile=5)):
        tile = kwargs.pop("model_tile", None)
        loss, cached = _update(_simclr(bn=False, tile=tile), images, **kwargs)
        assert abs(loss.item() - full_loss.item()) < 1e-12 and torch.allclose(cached, full, atol=1e-12, rtol=0)
    _, accumulated = _update(_simclr(bn=False), images, accumulation=4)
    assert (accumulated - full).abs().max() > 1e-3, "accumulation changes the objective"


def test_gradient_caching_with_batchnorm_moves_running_statistics_once_per_chunk():
    images = torch.rand(16, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model = _simclr(bn=True)
    _update(model, images, chunks=4)
    assert int(model.encoder[2].num_batches_tracked) == 4, "pass 1's updates are undone"


def test_gradient_caching_keeps_one_chunk_of_encoder_activations():
    images = torch.rand(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    kept = {}
    for chunks in (1, 4):       # tiled loss: the loss's own O(N²) graph is not what we measure
        model = _simclr(bn=True, dtype=torch.float32, tile=16)
        step = make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), augment=_augment,
                         generator=torch.Generator().manual_seed(1), chunks=chunks)
        kept[chunks] = measure(lambda: step(images), model=model).activation_bytes
    assert kept[4] < 0.4 * kept[1]


def _live_storages() -> dict[int, int]:
    """{data pointer: bytes} of every storage a live Python tensor or its ``.grad`` uses (a tensor
    autograd holds without a Python object, such as a graph's saved tensors, is not seen: this
    reads what the step's code holds, not what its graph keeps)."""
    import gc
    gc.collect()
    found = {}
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor):
            continue
        try:   # other tests leave fake, meta or freed tensors about: they hold no bytes here
            for t in (obj, obj.grad):
                if t is not None and t.device.type == "cpu" and not t.is_meta:
                    storage = t.untyped_storage()
                    found[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            continue
    return found


@pytest.mark.parametrize("through", ["kernel", "make_step"])
def test_gradient_caching_holds_the_views_once_and_z_twice_through_pass_3(through):
    """What lesson 02's memory budget charges gradient caching besides the chunk's graph: the 2N
    views once, the cached z and z.grad (2N×d each). Read at each pass-3 chunk, before it runs,
    from every live tensor the step made (the parameters' gradients excluded), calling the kernel
    directly and through the kit's step; fails if the step kept a
    second copy of the views or of z (it once held both: about twice the budget)."""
    from course_utils.objectives.gradient_cache import gradient_cache_backward
    n, d, chunks = 64, 16, 4
    images = torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    model = _simclr(bn=True, dtype=torch.float32)
    embed, held = model.embed, []

    def watched_embed(x):
        if torch.is_grad_enabled():                       # pass 3 (pass 1 runs without a graph)
            grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
            held.append(sum(n for ptr, n in _live_storages().items() if ptr not in before and ptr not in grads))
        return embed(x)

    before = _live_storages()     # what lived before the step (this and earlier tests' tensors)

    generator = torch.Generator().manual_seed(1)
    if through == "kernel":
        gradient_cache_backward(model, watched_embed, _augment(images, generator),
                                _augment(images, generator), model.loss, chunks=chunks)
    else:
        model.embed = watched_embed                       # make_step calls model.embed
        make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), augment=_augment,
                  generator=generator, chunks=chunks)(images)
    view_bytes, z_bytes = 3 * 8 * 8 * 4, d * 4
    budget = 2 * n * (view_bytes + 2 * z_bytes)
    assert len(held) == chunks
    for got in held:   # beyond the budget: the loss's detached scalar and the like, a few bytes
        assert budget <= got <= budget + 1024, (got, budget)


def test_gradient_caching_refuses_what_it_cannot_do():
    opt = torch.optim.SGD(_simclr(bn=False).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not both"):
        make_step(_simclr(bn=False), opt, augment=_augment, chunks=2, accumulation=2)
    with pytest.raises(ValueError, match="divisible into 3 chunks"):
        make_step(_simclr(bn=False), opt, augment=_augment, chunks=3)(torch.rand(8, 3, 8, 8, dtype=torch.float64))
    moco = MoCo(nn.Sequential(nn.Flatten(), nn.Linear(192, 8)), nn.Linear(8, 4), queue_size=16)
    with pytest.raises(TypeError, match="chunks"):
        make_step(moco, torch.optim.SGD(moco.parameters(), lr=0.1), augment=_augment, chunks=2)
    with pytest.raises(ValueError, match="tile"):
        nt_xent_loss_tiled(torch.rand(4, 3), torch.rand(4, 3), 0.5, 0)


def test_gradient_caching_on_two_ranks_with_gathered_negatives_equals_one_large_batch():
    from course_utils.distributed import launch
    from course_utils.experiments.gradient_cache import simclr_gradient_cache
    results = launch(simclr_gradient_cache, 2, {"dtype": "float64", "chunks": 4}, backend="gloo")
    for r in results:
        assert r["grad_diff"] <= 1e-12 * r["grad_scale"], r
        assert r["candidates_per_anchor"] == 63 and r["images_per_chunk"] == 4


def test_nt_xent_kept_bytes_follows_n_squared_plain_and_n_tiled():
    """The plain loss keeps its 2n×2n logits (doubling n: close to 4x); the tiled loss keeps
    O(n·d) (exactly 2x); bad sizes are refused."""
    from course_utils.experiments.training_memory import nt_xent_kept_bytes
    plain = nt_xent_kept_bytes(512, 32) / nt_xent_kept_bytes(256, 32)
    tiled = nt_xent_kept_bytes(512, 32, tile=64) / nt_xent_kept_bytes(256, 32, tile=64)
    assert 3.5 < plain <= 4.0 and tiled == 2.0, (plain, tiled)
    with pytest.raises(ValueError):
        nt_xent_kept_bytes(0, 32)
