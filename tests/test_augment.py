"""course_utils.augment: shapes, ranges, determinism, per-sample randomness, reference values."""
import pytest
import torch
import torchvision.transforms.v2.functional as TF

from course_utils import augment as A


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def batch():
    return torch.rand(16, 3, 24, 24, generator=gen(123))


def smooth_batch(b=8, c=3, size=24):
    """Images with structure (a gradient plus blobs), so crops at different places differ."""
    x = torch.linspace(0, 1, size)
    base = (x[None, :] * x[:, None])[None, None].expand(b, c, size, size).clone()
    return (0.5 * base + 0.5 * torch.rand(b, c, size, size, generator=gen(7))).clamp(0, 1)


ALL_OPS = {
    "crop": lambda x, g: A.random_resized_crop(x, 16, generator=g),
    "flip": lambda x, g: A.horizontal_flip(x, generator=g),
    "rot90": lambda x, g: A.random_rot90(x, generator=g),
    "jitter": lambda x, g: A.color_jitter(x, generator=g),
    "gray": lambda x, g: A.random_grayscale(x, p=0.5, generator=g),
    "blur": lambda x, g: A.gaussian_blur(x, 5, generator=g),
    "simclr": lambda x, g: A.SimCLRAugment(16, blur=True)(x, g),
    "simclr_rot": lambda x, g: A.SimCLRAugment(16, rotate=True)(x, g),
}


@pytest.mark.parametrize("name", list(ALL_OPS))
def test_shape_range_dtype_device_and_determinism(name, batch):
    op = ALL_OPS[name]
    out = op(batch, gen(1))
    expected_hw = (16, 16) if name in ("crop", "simclr", "simclr_rot") else (24, 24)
    assert out.shape == (16, 3, *expected_hw)
    assert out.dtype == batch.dtype and out.device == batch.device
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert torch.equal(out, op(batch, gen(1))), "same generator seed must give the same output"
    assert not torch.equal(out, op(batch, gen(2))), "a different seed should give a different output"
    assert op(batch, None).shape == out.shape  # the global RNG works too


@pytest.mark.parametrize("name", ["crop", "jitter", "blur", "simclr"])
def test_each_sample_gets_its_own_randomness(name):
    one = smooth_batch(1)
    x = one.expand(12, -1, -1, -1).contiguous()       # the same image twelve times
    out = ALL_OPS[name](x, gen(3))
    diffs = (out[1:] - out[:1]).abs().flatten(1).amax(1)
    assert (diffs > 1e-3).sum() >= 8, f"{name}: copies of one image should mostly differ, diffs={diffs}"


def test_p_zero_is_identity(batch):
    assert torch.equal(A.horizontal_flip(batch, p=0.0, generator=gen()), batch)
    assert torch.equal(A.color_jitter(batch, p=0.0, generator=gen()), batch)
    assert torch.equal(A.random_grayscale(batch, p=0.0, generator=gen()), batch)
    assert torch.equal(A.gaussian_blur(batch, 3, p=0.0, generator=gen()), batch)


def test_flip_p_one_and_own_inverse(batch):
    assert torch.equal(A.horizontal_flip(batch, p=1.0, generator=gen()), batch.flip(-1))
    once = A.horizontal_flip(batch, generator=gen(5))
    flipped = (once != batch).flatten(1).any(1)
    assert 0 < flipped.sum() < len(batch), "p=0.5 should flip some samples and not others"
    assert torch.equal(A.horizontal_flip(once, generator=gen(5)), batch), "the same draws undo the flip"


def test_full_crop_is_identity(batch):
    out = A.random_resized_crop(batch, 24, scale=(1.0, 1.0), ratio=(1.0, 1.0), generator=gen())
    torch.testing.assert_close(out, batch, atol=1e-5, rtol=0)


def test_crop_area_follows_scale():
    # a crop of a horizontal ramp covers a range of x proportional to its width
    ramp = torch.linspace(0, 1, 64).expand(256, 1, 64, 64).contiguous()
    out = A.random_resized_crop(ramp, 32, scale=(0.25, 0.25), ratio=(1.0, 1.0), generator=gen())
    width = out[:, 0, 0, -1] - out[:, 0, 0, 0]        # fraction of the image spanned
    torch.testing.assert_close(width.mean(), torch.tensor(0.5 * 31 / 32), atol=0.02, rtol=0)


def test_grayscale_channels_equal_and_luma():
    x = torch.rand(6, 3, 8, 8, generator=gen(1))
    out = A.random_grayscale(x, p=1.0, generator=gen())
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    torch.testing.assert_close(out, TF.rgb_to_grayscale(x, num_output_channels=3), atol=1e-6, rtol=0)


def test_adjust_functions_match_torchvision(batch):
    for ours, ref, f in [(A.adjust_brightness, TF.adjust_brightness, 1.3),
                         (A.adjust_contrast, TF.adjust_contrast, 0.6),
                         (A.adjust_saturation, TF.adjust_saturation, 1.4),
                         (A.adjust_hue, TF.adjust_hue, 0.15)]:
        torch.testing.assert_close(ours(batch, f), ref(batch, f), atol=1e-5, rtol=0,
                                   msg=f"{ours.__name__} disagrees with torchvision")
    hsv_back = A.hsv_to_rgb(A.rgb_to_hsv(batch))
    torch.testing.assert_close(hsv_back, batch, atol=1e-5, rtol=0)


def test_per_sample_factors_apply_per_sample(batch):
    f = torch.linspace(0.5, 1.5, len(batch))
    out = A.adjust_contrast(batch, f)
    for i in (0, 7, 15):
        torch.testing.assert_close(out[i:i + 1], TF.adjust_contrast(batch[i:i + 1], float(f[i])),
                                   atol=1e-5, rtol=0)


def test_blur_preserves_constant_and_smooths():
    const = torch.full((4, 3, 16, 16), 0.3)
    torch.testing.assert_close(A.gaussian_blur(const, 5, p=1.0, generator=gen()), const, atol=1e-6, rtol=0)
    noise = torch.rand(8, 3, 16, 16, generator=gen(2))
    blurred = A.gaussian_blur(noise, 5, sigma=(1.0, 2.0), p=1.0, generator=gen())
    assert blurred.var() < 0.5 * noise.var(), "a sigma >= 1 blur should more than halve the variance of noise"
    torch.testing.assert_close(blurred.mean(), noise.mean(), atol=0.01, rtol=0)


def test_one_channel_input():
    x = torch.rand(5, 1, 16, 16, generator=gen(4))
    assert torch.equal(A.random_grayscale(x, p=1.0, generator=gen()), x), "1 channel: grayscale is a no-op"
    out = A.color_jitter(x, saturation=0.0, hue=0.0, p=1.0, generator=gen())
    assert out.shape == x.shape and not torch.equal(out, x)
    with pytest.raises(ValueError, match="saturation=0, hue=0"):
        A.color_jitter(x, generator=gen())
    view = A.SimCLRAugment(12, blur=True)(x, gen())
    assert view.shape == (5, 1, 12, 12) and 0 <= view.min() and view.max() <= 1
    assert A.gaussian_blur(x, 3, generator=gen()).shape == x.shape


def test_simclr_color_flag_controls_colour():
    # a batch of one flat colour: geometry changes nothing, so any change is colour
    flat = torch.tensor([0.8, 0.3, 0.2])[None, :, None, None].expand(32, 3, 16, 16).contiguous()
    plain = A.SimCLRAugment(16, color=False)(flat, gen())
    torch.testing.assert_close(plain, flat, atol=1e-6, rtol=0)
    coloured = A.SimCLRAugment(16, color=True)(flat, gen())
    changed = (coloured - flat).abs().flatten(1).amax(1) > 0.02
    assert changed.float().mean() > 0.6, "with color=True about 80% of the views should change colour"


def test_simclr_view_is_colour_after_geometry(batch):
    """A view is colour(geometry(x)): the colour-free recipe gives the geometric half, and the
    colour half moves no pixel (a per-pixel map of the geometric view)."""
    aug = A.SimCLRAugment(16, rotate=True, blur=False)
    g = gen(4)
    geometric = aug.geometry(batch, g)
    view = aug.colour(geometric, g)
    assert torch.equal(view, aug(batch, gen(4)))
    assert torch.equal(geometric, A.SimCLRAugment(16, rotate=True, color=False)(batch, gen(4)))
    # jitter/grayscale act per pixel: pixels equal in the geometric view stay equal in the view
    flat = geometric[:, :, :1, :1].expand_as(geometric).contiguous()
    coloured = aug.colour(flat, gen(5))
    assert torch.equal(coloured, coloured[:, :, :1, :1].expand_as(coloured))


def test_two_views_differ_and_are_reproducible(batch):
    aug = A.SimCLRAugment(16)
    v1, v2 = aug.two_views(batch, gen(9))
    assert v1.shape == v2.shape == (16, 3, 16, 16)
    assert not torch.equal(v1, v2)
    w1, w2 = aug.two_views(batch, gen(9))
    assert torch.equal(v1, w1) and torch.equal(v2, w2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batch_with_cpu_generator(batch):
    x = batch.cuda()
    aug = A.SimCLRAugment(16, blur=True)
    out = aug(x, gen(0))
    assert out.device == x.device and out.shape == (16, 3, 16, 16)
    assert torch.equal(out, aug(x, gen(0)))
    # geometry and coin flips come from the same CPU draws, so CPU and CUDA agree closely
    torch.testing.assert_close(out.cpu(), aug(batch, gen(0)), atol=1e-3, rtol=0)
    cuda_gen = torch.Generator(device="cuda").manual_seed(0)
    assert aug(x, cuda_gen).device == x.device


def test_validation_errors(batch):
    with pytest.raises(ValueError, match="p must be"):
        A.horizontal_flip(batch, p=1.5)
    with pytest.raises(ValueError, match="scale"):
        A.random_resized_crop(batch, 16, scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="scale"):
        A.random_resized_crop(batch, 16, scale=(0.9, 0.5))
    with pytest.raises(ValueError, match="size"):
        A.random_resized_crop(batch, 0)
    with pytest.raises(ValueError, match="odd"):
        A.gaussian_blur(batch, 4)
    with pytest.raises(ValueError, match="too large"):
        A.gaussian_blur(batch, 49)
    with pytest.raises(ValueError, match="hue"):
        A.color_jitter(batch, hue=0.7)
    with pytest.raises(ValueError, match="brightness"):
        A.color_jitter(batch, brightness=-1)
    with pytest.raises(ValueError, match="B×C×H×W"):
        A.horizontal_flip(batch[0])
    with pytest.raises(TypeError, match="float"):
        A.horizontal_flip((batch * 255).to(torch.uint8))
    with pytest.raises(ValueError, match="channels"):
        A.random_grayscale(torch.rand(2, 4, 8, 8))
    with pytest.raises(ValueError, match="image_size"):
        A.SimCLRAugment(0)
    with pytest.raises(ValueError, match="one value per sample"):
        A.adjust_brightness(batch, torch.ones(3))


def test_rot90_is_an_exact_quarter_turn_per_sample():
    x = smooth_batch(64)
    out = A.random_rot90(x, generator=gen(5))
    turns = []
    for b in range(len(x)):
        match = [k for k in range(4) if torch.equal(out[b], torch.rot90(x[b], k, dims=(1, 2)))]
        assert len(match) == 1, f"sample {b} is not an exact multiple of 90° of its input"
        turns.append(match[0])
    counts = torch.bincount(torch.tensor(turns), minlength=4)
    assert (counts >= 8).all(), f"each of the four turns should be drawn (64 samples): {counts}"
    with pytest.raises(ValueError, match="square"):
        A.random_rot90(torch.rand(2, 3, 8, 12))
