"""course_utils.data: every offline dataset loads, deterministically, and bad arguments say why."""
import warnings

import pytest
import torch

from course_utils import data
from course_utils.data import shapes as shapes_module
from course_utils.data import DatasetUnavailableError, ImageDataset, load_dataset


@pytest.fixture
def empty_root(tmp_path, monkeypatch):
    """A private, empty data folder (no shared cache, no downloaded datasets)."""
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    return tmp_path


def check_dataset(ds, n, chw, n_classes):
    assert isinstance(ds, ImageDataset)
    assert len(ds) == n and tuple(ds.images.shape) == (n, *chw)
    assert ds.images.dtype == torch.float32 and ds.labels.dtype == torch.int64
    assert 0.0 <= ds.images.min() and ds.images.max() <= 1.0
    assert ds.images.std() > 0.05, "images should not be blank"
    assert len(ds.classes) == n_classes
    assert set(ds.labels.unique().tolist()) == set(range(n_classes)), "every class should appear"


def test_available_datasets():
    names = data.available_datasets()
    assert names[0] == "shapes"
    assert {"shapes", "digits", "textures", "cifar10", "stl10"} <= set(names)
    assert data.dataset_splits("stl10") == ("train", "test", "unlabeled")


def test_shapes_load_balanced_and_split_specific():
    test = load_dataset("shapes", "test")
    check_dataset(test, 2000, (3, 32, 32), 8)
    assert torch.bincount(test.labels).tolist() == [250] * 8, "chunks of 1000 are class-balanced"
    assert test.classes == data.SHAPE_CLASSES
    train_head = load_dataset("shapes", "train", limit=200)
    assert not torch.equal(train_head.images, test.images[:200]), "train and test need different seeds"


def test_shapes_colour_says_nothing_about_the_class():
    # the mean colour of an image is a nuisance: per-class averages of it are all alike
    ds = load_dataset("shapes", "test")
    mean_rgb = ds.images.mean(dim=(2, 3))                                      # N×3
    per_class = torch.stack([mean_rgb[ds.labels == k].mean(0) for k in range(8)])  # 8×3
    assert (per_class - mean_rgb.mean(0)).abs().max() < 0.06


def test_shapes_cache_round_trip_and_corruption(empty_root):
    first = load_dataset("shapes", "test")
    cache = empty_root / f"shapes-v{shapes_module._SHAPES_VERSION}-test-2000.pt"   # versioned name
    assert cache.exists(), "a full load should write the cache"
    assert not list(empty_root.glob("*.tmp")), "no temporary file may be left behind"
    again = load_dataset("shapes", "test")                                       # from the cache
    assert torch.equal(first.images, again.images) and torch.equal(first.labels, again.labels)
    fresh, labels = data.make_shapes(2000, seed=1)                               # regenerated
    assert torch.equal(first.images, fresh.float() / 255) and torch.equal(first.labels, labels)
    cache.write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="corrupt"):
        repaired = load_dataset("shapes", "test")
    assert torch.equal(repaired.images, first.images)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                           # healthy again
        load_dataset("shapes", "test", limit=10)


def test_shapes_limit_is_a_prefix_without_the_cache(empty_root):
    head = load_dataset("shapes", "test", limit=300)                            # renders 1 chunk
    assert not (empty_root / "shapes-v1-test-2000.pt").exists()
    full = load_dataset("shapes", "test")
    assert torch.equal(head.images, full.images[:300]) and torch.equal(head.labels, full.labels[:300])


def test_image_size_resizes():
    small = load_dataset("shapes", "test", image_size=16, limit=64)
    assert small.images.shape == (64, 3, 16, 16)
    assert 0 <= small.images.min() and small.images.max() <= 1
    native = load_dataset("shapes", "test", limit=64)
    # antialiased downsampling keeps the per-image mean colour
    torch.testing.assert_close(small.images.mean((2, 3)), native.images.mean((2, 3)), atol=0.02, rtol=0)


def test_digits():
    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    check_dataset(train, 1437, (1, 8, 8), 10)
    check_dataset(test, 360, (1, 8, 8), 10)
    assert torch.equal(train.images, load_dataset("digits", "train").images)
    big = load_dataset("digits", "test", image_size=24)
    assert big.images.shape == (360, 1, 24, 24)


def test_textures_and_photos():
    train = load_dataset("textures", "train")
    check_dataset(train, 2048, (3, 32, 32), 8)
    check_dataset(load_dataset("textures", "test"), 512, (3, 32, 32), 8)
    assert torch.equal(train.images, load_dataset("textures", "train").images)
    # the recoloured crops: the same crops and labels, each its own colour, the same on every load
    recoloured = load_dataset("textures-recoloured", "train")
    check_dataset(recoloured, 2048, (3, 32, 32), 8)
    assert torch.equal(recoloured.labels, train.labels)
    assert torch.equal(recoloured.images, load_dataset("textures-recoloured", "train").images)
    hue_gap = (recoloured.images.mean(dim=(2, 3)) - train.images.mean(dim=(2, 3))).abs().mean()
    assert hue_gap > 0.05, hue_gap
    # colour tells no class apart: every photo's crops, the four grey ones included, carry the
    # same saturation on average (drawn U(0.2, 1) per crop: mean 0.6); a hue turn left them grey
    brightest, darkest = recoloured.images.amax(1), recoloured.images.amin(1)
    saturation = ((brightest - darkest) / brightest.clamp(min=1e-3)).mean(dim=(1, 2))
    per_class = torch.stack([saturation[recoloured.labels == c].mean() for c in range(8)])
    assert ((per_class > 0.5) & (per_class < 0.7)).all(), per_class
    assert "astronaut" in data.available_photos()
    photo = data.load_photo("astronaut", 48)
    assert photo.shape == (3, 48, 48) and photo.dtype == torch.float32
    assert 0 <= photo.min() and photo.max() <= 1 and photo.std() > 0.1
    gray = data.load_photo("camera", 16)
    assert gray.shape == (3, 16, 16) and torch.equal(gray[0], gray[2])
    with pytest.raises(ValueError, match="astronaut"):
        data.load_photo("mona_lisa", 32)


@pytest.mark.parametrize("name", ["cifar10", "stl10"])
def test_torchvision_datasets_without_download_raise_clearly(name, empty_root):
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset(name, "train", download=False)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "download=True" in message and "'shapes'" in message and str(empty_root) in message


def test_a_broken_cifar10_folder_gives_the_same_clear_error(empty_root):
    (empty_root / "cifar-10-batches-py").mkdir()          # present but empty: torchvision refuses
    with pytest.raises(DatasetUnavailableError, match="download=True"):
        load_dataset("cifar10", "test")


def test_batches_cover_one_epoch_and_are_seeded():
    ds = load_dataset("digits", "test")
    seen = torch.cat([y for _, y in ds.batches(64, seed=0, drop_last=False)(0)])
    assert torch.equal(seen.sort().values, ds.labels.sort().values), "one epoch = every image once"
    source = ds.batches(64, seed=0)
    batches = list(source(0))
    assert len(batches) == len(source) == 360 // 64
    x, y = batches[0]
    assert x.shape == (64, 1, 8, 8) and y.shape == (64,) and x.device == ds.device
    again = list(ds.batches(64, seed=0))                   # iterating directly = epoch 0
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    assert not torch.equal(next(iter(ds.batches(64, seed=1)))[1], y), "another seed, another order"
    assert not torch.equal(next(source(1))[1], y), "every epoch is reshuffled"
    ordered = next(iter(ds.batches(10, shuffle=False)))
    assert torch.equal(ordered[0], ds.images[:10])


def test_batches_resume_any_epoch_and_carry_ids():
    ds = load_dataset("digits", "test")
    run = ds.batches(32, seed=3, with_ids=True)
    epochs = [list(run(e)) for e in range(4)]              # successive epochs, as fit draws them
    fresh = ds.batches(32, seed=3, with_ids=True)
    for e in (3, 1):                                       # a resumed run jumps to its epoch
        assert all(torch.equal(a[2], b[2]) for a, b in zip(epochs[e], fresh(e)))
    images, labels, ids = epochs[2][0]
    assert torch.equal(images, ds.images[ids]) and torch.equal(labels, ds.labels[ids])
    fresh.load_state_dict(run.state_dict())
    with pytest.raises(ValueError, match="same data, batch_size and seed"):
        ds.batches(32, seed=4).load_state_dict(run.state_dict())


def test_subset_and_to():
    ds = load_dataset("digits", "test")
    head = ds.subset(20)
    assert torch.equal(head.images, ds.images[:20]) and head.classes == ds.classes
    a, b = ds.subset(50, seed=3), ds.subset(50, seed=3)
    assert torch.equal(a.labels, b.labels) and not torch.equal(a.images, ds.images[:50])
    assert len({tuple(im.flatten().tolist()) for im in a.images}) >= 48, "no repeats (dups in digits aside)"
    moved = ds.to("cpu")
    assert moved.device.type == "cpu" and torch.equal(moved.images, ds.images)


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match="shapes"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match=r"\['train', 'test', 'unlabeled'\]"):
        load_dataset("stl10", "validation")
    with pytest.raises(ValueError, match="limit"):
        load_dataset("digits", limit=0)
    with pytest.raises(ValueError, match="limit"):
        load_dataset("digits", limit=-5)
    with pytest.raises(ValueError, match="limit <= 360"):
        load_dataset("digits", "test", limit=361)
    with pytest.raises(ValueError, match="image_size"):
        load_dataset("digits", image_size=0)
    with pytest.raises(TypeError, match="image_size"):
        load_dataset("digits", image_size=16.0)
    with pytest.raises(ValueError, match="device"):
        load_dataset("digits", device="tpu")
    ds = load_dataset("digits", "test")
    with pytest.raises(ValueError, match="batch_size"):
        ds.batches(0)
    with pytest.raises(ValueError, match="drop_last"):
        ds.batches(1000)
    with pytest.raises(ValueError, match="n <= 360"):
        ds.subset(1000)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_dataset("digits", device="cuda")


def test_shapes_v2_nuisances_are_bounded():
    """v2 toned the nuisances down (issue 3): stripes and noise stay small next to the fg/bg
    contrast, so within the shape's interior pixels stay close to one colour."""
    assert shapes_module._SHAPES_VERSION >= 2
    assert shapes_module._STRIPE_AMP_MAX <= 0.15 and shapes_module._NOISE_STD_MAX <= 0.03
    g = torch.Generator().manual_seed(0)
    coords = torch.linspace(-1, 1, 32)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    tex = shapes_module._stripes(g, 64, xx, yy)                                    # 64×32×32 in [1-amp, 1]
    assert tex.max() <= 1 + 1e-6 and tex.min() >= 1 - shapes_module._STRIPE_AMP_MAX - 1e-6
