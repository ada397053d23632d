"""Shapes, exactness and validation of course_utils.models."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from course_utils.models import (
    MLP,
    ProjectionHead,
    SmallResNet,
    ViT,
    build_encoder,
    count_parameters,
    sincos_position_embedding_2d,
)

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- ResNet


@pytest.mark.parametrize("size", [16, 32, 96])
@pytest.mark.parametrize("width", [8, 16])
def test_resnet_feature_shape(size, width):
    model = SmallResNet(width=width)
    feats = model(torch.rand(2, 3, size, size))
    assert model.feature_dim == 4 * width
    assert feats.shape == (2, 4 * width)


def test_resnet_logits_and_features():
    model = SmallResNet(width=8, in_channels=1, num_classes=10)
    x = torch.rand(3, 1, 20, 24)  # non-square works too: the pool is global
    assert model(x).shape == (3, 10)
    assert model.features(x).shape == (3, 32)


def test_resnet_stage_count_follows_blocks():
    model = SmallResNet(width=8, blocks=(2, 1))
    assert model.feature_dim == 16
    assert len(model.stages) == 2 and len(model.stages[0]) == 2
    assert model(torch.rand(2, 3, 16, 16)).shape == (2, 16)


def test_resnet_has_no_inplace_relu_and_no_maxpool():
    model = SmallResNet()
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert all(not m.inplace for m in model.modules() if isinstance(m, nn.ReLU))
    stem_conv = model.stem[0]
    assert stem_conv.kernel_size == (3, 3) and stem_conv.stride == (1, 1)


def test_resnet_bad_inputs_raise():
    model = SmallResNet(in_channels=3)
    with pytest.raises(ValueError, match="3-channel"):
        model(torch.rand(2, 1, 32, 32))
    with pytest.raises(ValueError, match="at least 8"):
        model(torch.rand(2, 3, 7, 7))
    with pytest.raises(ValueError, match="4-D"):
        model(torch.rand(3, 32, 32))
    with pytest.raises(ValueError, match="blocks"):
        SmallResNet(blocks=())
    with pytest.raises(ValueError, match="width"):
        SmallResNet(width=0)


def test_resnet_stores_convolutions_channels_last_and_keeps_the_layout():
    import copy
    channels_last = lambda m: all(c.weight.is_contiguous(memory_format=torch.channels_last)  # noqa: E731
                                  for c in m.modules() if isinstance(c, nn.Conv2d))
    torch.manual_seed(0)
    net = SmallResNet(width=8)
    assert channels_last(net)
    assert channels_last(copy.deepcopy(net)) and channels_last(net.to(torch.float32))
    other = SmallResNet(width=8)
    other.load_state_dict(net.state_dict())
    assert channels_last(other)
    # the layout changes the speed, not the function: same features as the contiguous layout
    plain = copy.deepcopy(net)
    nn.utils.convert_conv2d_weight_memory_format(plain, torch.contiguous_format)
    assert not channels_last(plain)
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(net(x), plain(x), rtol=1e-4, atol=1e-5)


def test_init_is_deterministic_under_manual_seed():
    def weights(cls, seed, **kw):
        torch.manual_seed(seed)
        return [p.detach().clone() for p in cls(**kw).parameters()]

    for cls, kw in [(SmallResNet, dict(width=8)), (ViT, dict(dim=32, depth=2))]:
        a, b, c = weights(cls, 0, **kw), weights(cls, 0, **kw), weights(cls, 1, **kw)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x, y) for x, y in zip(a, c))


# ----------------------------------------------------------------------------- ViT


@pytest.mark.parametrize("size,patch", [(16, 2), (32, 4), (96, 12)])
def test_vit_shapes(size, patch):
    model = ViT(image_size=size, patch_size=patch, dim=32, depth=2, heads=4)
    x = torch.rand(2, 3, size, size)
    assert model.num_patches == (size // patch) ** 2
    assert model.patchify(x).shape == (2, model.num_patches, patch * patch * 3)
    assert model.embed_patches(x).shape == (2, model.num_patches, 32)
    assert model(x).shape == (2, model.feature_dim) == (2, 32)


def test_vit_patchify_layout_and_exact_round_trip():
    model = ViT(image_size=8, patch_size=4, dim=16, depth=1, heads=2, in_channels=2)
    x = torch.randn(3, 2, 8, 8)
    patches = model.patchify(x)  # 3×4×32
    # patch 1 is the top-right 4×4 square, pixels row-major with channels last
    assert torch.equal(patches[:, 1], x[:, :, 0:4, 4:8].permute(0, 2, 3, 1).reshape(3, -1))
    assert torch.equal(patches[:, 2], x[:, :, 4:8, 0:4].permute(0, 2, 3, 1).reshape(3, -1))
    assert torch.equal(model.unpatchify(patches), x)


def test_vit_encode_tokens_on_subset():
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=4).eval()
    x = torch.rand(2, 3, 16, 16)
    tokens = model.embed_patches(x)  # 2×16×32
    keep = torch.tensor([0, 3, 5, 9])
    visible = model.encode_tokens(tokens[:, keep])
    assert visible.shape == (2, 4, 32)
    # the full run through the pieces is exactly forward()
    full = model.encode_tokens(tokens)
    assert full.shape == tokens.shape
    torch.testing.assert_close(full.mean(dim=1), model(x))
    # no position is added inside the blocks: permuting tokens permutes the output
    perm = torch.randperm(16)
    torch.testing.assert_close(model.encode_tokens(tokens[:, perm]), full[:, perm], rtol=1e-5, atol=1e-5)
    # a subset attends only to itself, so it differs from the same rows of the full run
    assert not torch.allclose(visible, full[:, keep], atol=1e-4)


def test_vit_position_embedding_is_fixed_buffer():
    model = ViT(image_size=16, patch_size=4, dim=32, depth=1, heads=4)
    assert "pos_embed" in dict(model.named_buffers())
    assert all("pos" not in name for name, _ in model.named_parameters())
    pos = sincos_position_embedding_2d(4, 32)
    assert pos.shape == (16, 32)
    torch.testing.assert_close(model.pos_embed[0], pos)
    assert torch.linalg.matrix_rank(pos) > 4  # positions are distinguishable
    # position 0 is (row 0, col 0): every sin is 0, every cos is 1
    assert torch.equal(pos[0, :8], torch.zeros(8)) and torch.equal(pos[0, 8:16], torch.ones(8))


def test_vit_flops_are_all_visible_to_flop_counter():
    """Every matmul (including q@kᵀ and attn@v) is counted: forward FLOPs match the formula."""
    b, size, p, d, depth, r = 2, 16, 4, 32, 2, 2
    model = ViT(image_size=size, patch_size=p, dim=d, depth=depth, heads=4, mlp_ratio=r)
    L = (size // p) ** 2
    with FlopCounterMode(display=False) as counter:
        model(torch.rand(b, 3, size, size))
    per_block = 2 * b * L * d * (3 * d + d + 2 * r * d) + 2 * (2 * b * L * L * d)
    expected = 2 * b * L * (p * p * 3) * d + depth * per_block
    assert counter.get_total_flops() == expected


def test_vit_attention_matrix_is_visible_to_saved_tensor_hooks():
    """The ledger sees the B×H×L×L attention probabilities kept for backward (a fused kernel would hide them)."""
    b, heads, L = 2, 4, 16
    model = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=heads)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.rand(b, 3, 16, 16)).sum()
    assert shapes.count((b, heads, L, L)) >= 2  # at least the softmax output of each of 2 blocks


def test_vit_gradients_reach_every_parameter():
    model = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=4, num_classes=5)
    model(torch.rand(2, 3, 16, 16)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_vit_bad_inputs_raise():
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        ViT(image_size=30, patch_size=4)
    with pytest.raises(ValueError, match="divisible by heads"):
        ViT(dim=30, heads=4)
    model = ViT(image_size=32, patch_size=4, dim=32, depth=1)
    with pytest.raises(ValueError, match="32×32"):
        model(torch.rand(2, 3, 16, 16))
    with pytest.raises(ValueError, match="3-channel"):
        model(torch.rand(2, 1, 32, 32))
    with pytest.raises(ValueError, match="encode_tokens expects"):
        model.encode_tokens(torch.rand(2, 5, 16))
    with pytest.raises(ValueError, match="unpatchify expects"):
        model.unpatchify(torch.rand(2, 10, 48))


# ----------------------------------------------------------------------------- MLP and head


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_mlp_parameter_count_formula(layers):
    in_dim, hidden, out = 64, 32, 10
    dims = [in_dim] + [hidden] * (layers - 1) + [out]
    expected = sum((a + 1) * b for a, b in zip(dims[:-1], dims[1:]))
    model = MLP(in_dim, hidden, out, layers=layers)
    assert count_parameters(model) == expected
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == layers


def test_mlp_flattens_and_validates():
    model = MLP(1 * 8 * 8, 16, 10)
    assert model(torch.rand(5, 1, 8, 8)).shape == (5, 10)
    with pytest.raises(ValueError, match="in_dim=64"):
        model(torch.rand(5, 3, 8, 8))
    with pytest.raises(ValueError, match="layers"):
        MLP(4, 4, 4, layers=0)


def test_projection_head():
    head = ProjectionHead(64, hidden_dim=32, out_dim=16)
    assert head(torch.randn(4, 64)).shape == (4, 16)
    assert any(isinstance(m, nn.BatchNorm1d) for m in head.modules())
    plain = ProjectionHead(64, hidden_dim=32, out_dim=16, batch_norm=False)
    assert count_parameters(plain) == 65 * 32 + 33 * 16
    with pytest.raises(ValueError, match="B×64"):
        head(torch.randn(4, 32))
    # SimSiam's projector ends in BatchNorm: in training mode each output dimension is standardised
    ended = ProjectionHead(64, hidden_dim=32, out_dim=16, output_batch_norm=True)
    assert isinstance(ended.net[-1], nn.BatchNorm1d) and count_parameters(ended) == count_parameters(head) + 2 * 16
    out = ended(torch.randn(32, 64))
    assert torch.allclose(out.mean(0), torch.zeros(16), atol=1e-5)
    assert torch.allclose(out.var(0, unbiased=False), torch.ones(16), atol=1e-3)


# ----------------------------------------------------------------------------- factory


def test_build_encoder():
    resnet = build_encoder("resnet", 32, 1, width=8)
    assert isinstance(resnet, SmallResNet) and resnet(torch.rand(2, 1, 32, 32)).shape == (2, 32)
    vit = build_encoder("vit", 32, 3, dim=32, depth=1)
    assert isinstance(vit, ViT) and vit.patch_size == 4 and vit.num_patches == 64
    with pytest.raises(ValueError, match="resnet"):
        build_encoder("alexnet", 32, 3)
    with pytest.raises(ValueError, match="patch_size"):
        build_encoder("vit", 28, 3)
    assert build_encoder("vit", 28, 3, patch_size=7, dim=32, depth=1).num_patches == 16


def test_count_parameters():
    model = nn.Linear(3, 2)
    assert count_parameters(model) == 8
    model.bias.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 6
    with pytest.raises(TypeError):
        count_parameters(torch.zeros(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_models_run_on_cuda():
    for model, size in [(SmallResNet(width=8), 32), (ViT(dim=32, depth=1), 32)]:
        model = model.cuda()
        assert model(torch.rand(2, 3, size, size, device="cuda")).device.type == "cuda"


def test_resnet18_is_the_cifar_resnet18():
    net = build_encoder("resnet18", 32)
    assert net.feature_dim == 512 and net.blocks == (2, 2, 2, 2)
    # torchvision's resnet18 has 11 689 512 parameters; the CIFAR variant swaps the 7×7 stem
    # (9 408 weights) for a 3×3 one (1 728) and drops the 1000-way classifier (513 000)
    assert count_parameters(net) == 11_689_512 - 9_408 + 1_728 - 513_000
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 512)
    assert build_encoder("resnet18", 32, num_classes=10)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="resnet18 fixes"):
        build_encoder("resnet18", 32, width=8)
