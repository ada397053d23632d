"""MAE: masking semantics, order restoration, masked-only loss, encoder cost ∝ visible tokens."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from course_utils.models import ViT
from course_utils.objectives.mae import (MAE, interpolate_masked, masked_mse, patch_targets,
                                         random_masking, restore_order)


def _tokens(b=3, length=16, d=5, seed=0):
    return torch.randn(b, length, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.75, 0.9])
def test_masking_shapes_and_counts(ratio):
    x = _tokens(length=20)
    visible, mask, ids_restore = random_masking(x, ratio, torch.Generator().manual_seed(1))
    keep = int(20 * (1 - ratio))
    assert visible.shape == (3, keep, 5)
    assert mask.shape == (3, 20) and ids_restore.shape == (3, 20) and ids_restore.dtype == torch.long
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    assert (mask.sum(dim=1) == 20 - keep).all()


def test_matches_reference_semantics():
    # the kept tokens are those with the smallest noise, noise drawn as torch.rand(B, L)
    x = _tokens()
    visible, mask, _ = random_masking(x, 0.75, torch.Generator().manual_seed(7))
    noise = torch.rand(3, 16, generator=torch.Generator().manual_seed(7))
    ids_keep = noise.argsort(dim=1)[:, :4]
    assert torch.equal(visible, torch.stack([x[i, ids_keep[i]] for i in range(3)]))
    expected_mask = torch.ones(3, 16)
    for i in range(3):
        expected_mask[i, ids_keep[i]] = 0
    assert torch.equal(mask, expected_mask)
    # each sample gets its own mask
    assert not torch.equal(mask[0], mask[1])


def test_ids_restore_puts_visible_tokens_back_and_unshuffle_inverts_shuffle():
    x = _tokens()
    visible, mask, ids_restore = random_masking(x, 0.5, torch.Generator().manual_seed(2))
    filler = torch.zeros(3, 16 - visible.shape[1], 5)
    restored = restore_order(torch.cat([visible, filler], dim=1), ids_restore)
    kept = mask == 0
    assert torch.equal(restored[kept], x[kept])
    assert (restored[~kept] == 0).all()
    # unshuffle(shuffle(x)) == x exactly
    ids_shuffle = ids_restore.argsort(dim=1)
    shuffled = torch.gather(x, 1, ids_shuffle.unsqueeze(-1).expand_as(x))
    assert torch.equal(restore_order(shuffled, ids_restore), x)


def test_generator_makes_masks_reproducible():
    x = _tokens()
    a = random_masking(x, 0.75, torch.Generator().manual_seed(3))[1]
    b = random_masking(x, 0.75, torch.Generator().manual_seed(3))[1]
    c = random_masking(x, 0.75, torch.Generator().manual_seed(4))[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("ratio, exc", [(1.0, ValueError), (-0.1, ValueError), (True, TypeError),
                                        ("0.75", TypeError), (0.9, ValueError)])
def test_masking_bad_ratios(ratio, exc):
    with pytest.raises(exc):
        random_masking(_tokens(length=4), ratio)   # 0.9 of 4 tokens keeps int(0.4) = 0


def test_masking_bad_tokens():
    with pytest.raises(ValueError, match="B×L×D"):
        random_masking(torch.randn(4, 16), 0.5)


def _vit(**kw):
    torch.manual_seed(0)
    cfg = dict(image_size=16, patch_size=4, dim=32, depth=2, heads=4)
    cfg.update(kw)
    return ViT(**cfg)


def test_exactly_visible_tokens_reach_the_encoder():
    seen = []
    for in_encoder, expected in ((False, 4), (True, 16)):
        model = MAE(_vit(), mask_ratio=0.75, decoder_dim=16, mask_tokens_in_encoder=in_encoder)
        hook = model.encoder.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
        loss, pred, mask = model(torch.rand(2, 3, 16, 16), torch.Generator().manual_seed(0))
        hook.remove()
        assert seen[-1] == expected
        assert pred.shape == (2, 16, 48) and mask.shape == (2, 16) and torch.isfinite(loss)


def test_loss_ignores_visible_patches():
    model = MAE(_vit(), mask_ratio=0.75, decoder_dim=16)
    images = torch.rand(2, 3, 16, 16)
    _, pred, mask = model(images, torch.Generator().manual_seed(0))
    pred = pred.detach()                                   # fixed encoder/decoder output
    patches = model.encoder.patchify(images)
    m = mask.unsqueeze(-1)
    noise = torch.rand_like(patches)
    visible_changed = model.encoder.unpatchify(patches + noise * (1 - m))
    masked_changed = model.encoder.unpatchify(patches + noise * m)
    for norm in (False, True):
        loss = lambda imgs: masked_mse(pred, patch_targets(model.encoder.patchify(imgs), norm), mask)
        assert torch.allclose(loss(visible_changed), loss(images), atol=1e-7)
        assert not torch.allclose(loss(masked_changed), loss(images), atol=1e-3)


def test_norm_pix_targets_are_standardised_per_patch():
    t = patch_targets(torch.rand(2, 4, 12) * 3 + 1, norm_pix_loss=True)
    assert torch.allclose(t.mean(-1), torch.zeros(2, 4), atol=1e-5)
    assert torch.allclose(t.var(-1), torch.ones(2, 4), atol=1e-3)


def _encoder_flops(vit, tokens):
    with FlopCounterMode(display=False) as counter:
        vit.encode_tokens(tokens)
    return counter.get_total_flops()


@pytest.mark.parametrize("ratio", [0.5, 0.75])
def test_encoder_flops_scale_with_visible_tokens(ratio):
    vit = _vit(image_size=32, patch_size=8, dim=64, depth=2, mlp_ratio=2)   # L=16 tokens
    tokens = vit.embed_patches(torch.rand(2, 3, 32, 32))
    visible, _, _ = random_masking(tokens, ratio)
    measured = _encoder_flops(vit, visible) / _encoder_flops(vit, tokens)
    # per block: linear layers 2·L·D²·(4 + 2·mlp_ratio), attention matmuls 4·L²·D
    length, kept, d = 16, visible.shape[1], 64
    predicted = (2 * kept * d * d * 8 + 4 * kept ** 2 * d) / (2 * length * d * d * 8 + 4 * length ** 2 * d)
    assert measured == pytest.approx(predicted, rel=1e-6)
    # the linear layers dominate when L << D, so the ratio is close to the visible fraction
    assert 1 - ratio - 0.03 < measured <= 1 - ratio


def test_mae_trains_and_reconstructs():
    model = MAE(_vit(), mask_ratio=0.75, decoder_dim=16, norm_pix_loss=True)
    images = torch.rand(2, 3, 16, 16)
    loss, _, _ = model(images)
    loss.backward()
    assert model.encoder.patch_embed.weight.grad is not None
    assert model.decoder.mask_token.grad is not None
    masked, pasted, mask = model.reconstruct(images, torch.Generator().manual_seed(0))
    assert masked.shape == pasted.shape == images.shape
    keep = (1 - mask).unsqueeze(-1)
    assert torch.allclose(model.encoder.patchify(pasted) * keep, model.encoder.patchify(images) * keep, atol=1e-6)


def test_mae_bad_inputs():
    with pytest.raises(TypeError, match="ViT"):
        MAE(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError):
        MAE(_vit(), mask_ratio=1.0)
    with pytest.raises(ValueError):
        masked_mse(torch.zeros(2, 4, 3), torch.zeros(2, 4, 3), torch.zeros(2, 5))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_masking_uses_cpu_generator():
    x = _tokens()
    cpu = random_masking(x, 0.75, torch.Generator().manual_seed(5))
    gpu = random_masking(x.cuda(), 0.75, torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu))
    model = MAE(_vit(), decoder_dim=16).cuda()
    model(torch.rand(2, 3, 16, 16, device="cuda"))[0].backward()


# ------------------------------------------------------------------ interpolation baseline
def _grid_mask(b, grid, removed):
    mask = torch.zeros(b, grid * grid)
    mask[:, removed] = 1
    return mask


@pytest.mark.parametrize("method", ["idw", "nearest"])
def test_interpolation_keeps_visible_pixels_and_fills_constants_exactly(method):
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    mask = _grid_mask(2, 4, [0, 5, 6, 15])                          # 2×2 patches on a 4×4 grid
    out = interpolate_masked(images, mask, 2, method=method)
    pixel_removed = mask.reshape(2, 4, 1, 4, 1).expand(2, 4, 2, 4, 2).reshape(2, 1, 8, 8).bool()
    assert torch.equal(out[~pixel_removed.expand_as(out)], images[~pixel_removed.expand_as(images)])
    constant = torch.full((2, 3, 8, 8), 0.3)
    assert torch.allclose(interpolate_masked(constant, mask, 2, method=method), constant, atol=1e-6)


def test_nearest_takes_the_adjacent_visible_pixel_and_idw_averages():
    # 1×1 image 4×4 with patch 2: mask the top-left patch; its pixel (1, 1) is nearest to (1, 2)
    # and (2, 1) equally: ties go to the first visible pixel in raster order, (1, 2)
    images = torch.arange(16.0).reshape(1, 1, 4, 4)
    mask = _grid_mask(1, 2, [0])
    nearest = interpolate_masked(images, mask, 2, method="nearest")
    assert nearest[0, 0, 0, 0] == images[0, 0, 0, 2] and nearest[0, 0, 1, 1] == images[0, 0, 1, 2]
    idw = interpolate_masked(images, mask, 2)
    visible = images[0, 0][~torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]).bool()]
    assert visible.min() <= idw[0, 0, 0, 0] <= visible.max()       # a weighted mean of visible pixels


def test_interpolation_bad_inputs():
    images = torch.rand(1, 3, 8, 8)
    with pytest.raises(ValueError, match="B×L"):
        interpolate_masked(images, torch.zeros(1, 15), 2)
    with pytest.raises(ValueError, match="divide"):
        interpolate_masked(images, torch.zeros(1, 16), 3)
    with pytest.raises(ValueError, match="nothing to interpolate"):
        interpolate_masked(images, torch.ones(1, 16), 2)


def test_mask_tokens_in_encoder_keep_more_for_backward_but_decoder_sets_a_floor():
    """The ledger's kept-for-backward ratio of the two arms (lesson 04's boundary) on a tiny MAE:
    the encoder alone saves more than the whole step, since the decoder runs on all L tokens."""
    from course_utils.ledger import measure
    images = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    kept = {}
    for in_encoder in (True, False):
        model = MAE(_vit(depth=2), mask_ratio=0.75, decoder_dim=32, mask_tokens_in_encoder=in_encoder)
        step = lambda: model(images, torch.Generator().manual_seed(1))[0].backward()
        whole = measure(step, model=model).activation_bytes
        encoder = measure(lambda: model.forward_encoder(images, torch.Generator().manual_seed(1)),
                          model=model).activation_bytes
        kept[in_encoder] = (whole, encoder)
    step_ratio = kept[True][0] / kept[False][0]
    encoder_ratio = kept[True][1] / kept[False][1]
    assert 1.0 < step_ratio < encoder_ratio


def test_masked_at_runs_at_another_ratio_and_puts_the_own_one_back():
    mae = MAE(ViT(image_size=16, patch_size=4, dim=32, depth=1, heads=2), mask_ratio=0.75)
    images = torch.randn(2, 3, 16, 16)
    with mae.masked_at(0.5):
        _, mask, _ = mae.forward_encoder(images, torch.Generator().manual_seed(0))
    assert mask.sum(1).tolist() == [8.0, 8.0] and mae.mask_ratio == 0.75   # 16 patches, half masked
    with pytest.raises(RuntimeError), mae.masked_at(0.25):
        raise RuntimeError("a failing evaluation")
    assert mae.mask_ratio == 0.75, "restored when the block raises"
    with pytest.raises(ValueError, match="mask_ratio"), mae.masked_at(1.5):
        pass
    assert mae.mask_ratio == 0.75
