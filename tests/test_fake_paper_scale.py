"""Paper-size runs on fake tensors (seconds each), checked against published figures and the
kit's own analytic predictors."""
import pytest
import torch

from course_utils import memory as M
from course_utils.ledger import fake_mode, fake_world, measure_tinygpt
from course_utils.ledger.plan import gpt_ledger, resnet50_encoder, ssl_ledger, vit_large_16


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_resnet50_size_and_flops_match_the_published_figures():
    with fake_mode():
        encoder = resnet50_encoder()
        rec = ssl_ledger("simclr", 8, encoder=encoder)
    # He et al. 2016, Table 1: 3.8e9 "FLOPs" (multiply-adds); torchvision's model card: 4.09
    # GMACs and 25.6 M parameters with the 1000-class classifier (2048·1000 + 1000)
    macs_per_image = rec.forward_flops / 2 / (2 * 8)   # two views of 8 images
    assert macs_per_image / 4.1e9 == pytest.approx(1, abs=0.01)
    assert (n_params(encoder) + 2048 * 1000 + 1000) / 25.6e6 == pytest.approx(1, abs=0.01)
    assert rec.encoded == {"encoder images": 16}


def test_vit_large_and_the_mae_speed_up():
    with fake_mode():
        assert n_params(vit_large_16()) / 304e6 == pytest.approx(1, abs=0.01)   # Dosovitskiy et al. Table 1
        visible_only = ssl_ledger("mae", 4, mask_ratio=0.75)
        with_mask_tokens = ssl_ledger("mae", 4, mask_ratio=0.75, mask_tokens_in_encoder=True)
    # He et al. 2022 (MAE), Table 2(c): an encoder that also processes the mask tokens costs 3.3x
    # the training FLOPs of one that sees the 25% visible patches only (ViT-L, 8-block decoder)
    speed_up = with_mask_tokens.flops / visible_only.flops
    assert speed_up == pytest.approx(3.3, rel=0.10), speed_up
    assert visible_only.encoded["encoder tokens"] == 4 * 196 // 4


def test_moco_queue_is_a_cache_line():
    with fake_mode():
        rec = ssl_ledger("moco", 4, queue_size=65536)
    keys, bookkeeping = 65536 * 128 * 4, 2 * 65536 * 8 + 2 * 8   # written_at, ids; ptr, count
    assert rec.cache_bytes == keys + bookkeeping


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpt2_scale_matches_transformer_memory(recompute):
    cfg = dict(layers=12, hidden=768, heads=12, vocab=50257, seq=1024, batch=8)
    with fake_mode():
        record, _ = measure_tinygpt(*cfg.values(), recompute=recompute, optimizer="adamw")
    pred = M.transformer_memory(*cfg.values(), recompute=recompute, optimizer="adamw")
    assert record.activation_bytes == pytest.approx(pred["activations"], rel=0.01)
    assert (record.param_bytes, record.grad_bytes, record.optimizer_bytes) == \
        (pred["params"], pred["grads"], pred["optimizer"])


def test_7b_sixteen_bytes_per_parameter_and_fsdp_sharding():
    cfg = dict(layers=32, hidden=4096, heads=32, vocab=32000, seq=4096, batch=1)
    psi = cfg["vocab"] * 4096 + 4096 * 4096 + 32 * (12 * 4096 ** 2 + 13 * 4096) + 2 * 4096
    with fake_world(64) as mesh, fake_mode():
        fsdp = gpt_ledger(**cfg, strategy="fsdp", mesh=mesh)
    with fake_world(8) as mesh, fake_mode():
        ddp = gpt_ledger(**cfg, strategy="ddp", mesh=mesh)
    # ZeRO (Rajbhandari et al. 2020): mixed-precision Adam holds 16 bytes per parameter
    assert ddp.resident_bytes == 16 * psi
    assert fsdp.resident_bytes == pytest.approx(16 * psi / 64, rel=1e-3)
    assert ddp.comm_bytes == pytest.approx(2 * 7 / 8 * 4 * psi, abs=4)
    # FSDP2 gathers every block twice (forward, backward) but the root's parameters (embeddings,
    # final norm) once, kept from forward to backward
    root = cfg["vocab"] * 4096 + 4096 * 4096 + 2 * 4096
    assert fsdp.comm_bytes == pytest.approx(63 / 64 * 4 * (3 * psi - root), rel=1e-6)
    assert fsdp.flops == ddp.flops and fsdp.activation_bytes == pytest.approx(ddp.activation_bytes, rel=1e-3)
