"""The Llama-shaped model (course_utils.models.llama) and the planner's check against TorchTitan's
published memory figures (course_utils.experiments.published): the parameter count, recomputation
that changes memory and not the gradients, the memory tracker on fake tensors equal to real ones,
and the 8-GPU plan within the stated error of Table 1."""
from __future__ import annotations

import pytest
import torch

from course_utils.experiments.published import (PLAN_OVER_PUBLISHED, PUBLISHED_LLAMA,
                                                 against_published, llama_fsdp_peak)
from course_utils.ledger import fake_mode, measure, peak_live_bytes
from course_utils.models.llama import LLAMA_SHAPES, SAC_THROUGH_HOOKS, Llama, llama_param_count

SMALL = dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=64)


def small_batch(seq=16, batch=2):
    tokens = torch.randint(SMALL["vocab"], (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def test_parameter_count_is_the_formula_and_8b_is_8_03_billion():
    net = Llama(**SMALL, seq_len=16)
    assert sum(p.numel() for p in net.parameters()) == llama_param_count(**SMALL)
    with fake_mode():
        big = Llama(**LLAMA_SHAPES["Llama 3.1 8B"], seq_len=8)
        assert sum(p.numel() for p in big.parameters()) == llama_param_count(**LLAMA_SHAPES["Llama 3.1 8B"])
    assert round(llama_param_count(**LLAMA_SHAPES["Llama 3.1 8B"]) / 1e9, 2) == 8.03


def test_recomputation_changes_what_is_kept_not_the_gradients():
    x, y = small_batch()
    grads, peaks = {}, {}
    for mode in ("none", "op-selective", "full"):
        torch.manual_seed(0)
        net = Llama(**SMALL, seq_len=16, recompute=mode)
        net.loss(x, y).backward()
        grads[mode] = [p.grad.clone() for p in net.parameters()]
        net.zero_grad(set_to_none=True)
        peaks[mode] = peak_live_bytes(lambda: net.loss(x, y).backward(), model=net)
    for mode in ("op-selective", "full"):
        assert all(torch.equal(a, b) for a, b in zip(grads["none"], grads[mode])), mode
    kept = {m: p["Activation"] for m, p in peaks.items()}
    assert kept["full"] < kept["op-selective"] < kept["none"], kept


@pytest.mark.skipif(not SAC_THROUGH_HOOKS, reason="this torch keeps a selective checkpoint's cache "
                    "out of saved-tensor hooks (torch >= 2.12 routes it through them)")
def test_the_ledger_sees_what_a_selective_checkpoint_keeps():
    """measure's kept-for-backward line counts the selective checkpoint's cache too (routed
    through the saved-tensor hooks): less than without recomputation, more than full."""
    x, y = small_batch()
    kept = {}
    for mode in ("none", "op-selective", "full"):
        torch.manual_seed(0)
        net = Llama(**SMALL, seq_len=16, recompute=mode)
        kept[mode] = measure(lambda: net.loss(x, y).backward(), model=net).activation_bytes
    assert kept["full"] < kept["op-selective"] < kept["none"], kept


def test_the_tracker_reads_the_same_peak_on_fake_tensors():
    def peak(fake):
        with fake_mode() if fake else _nothing():
            torch.manual_seed(0)
            net = Llama(**SMALL, seq_len=16, recompute="op-selective")
            x, y = small_batch()
            return peak_live_bytes(lambda: net.loss(x, y).backward(), model=net)
    assert peak(True) == peak(False)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_8_gpu_plan_is_within_the_stated_error_of_torchtitans_table_1():
    row = PUBLISHED_LLAMA[0]
    assert (row["gpus"], row["batch"], row["seq"], row["reserved_gib"]) == (8, 2, 8192, 82.4)
    plan = llama_fsdp_peak(row["model"], gpus=8, batch=2, seq=8192)
    ratio = plan["peak"]["Total"] / 2**30 / row["reserved_gib"]
    assert PLAN_OVER_PUBLISHED[0] <= ratio <= PLAN_OVER_PUBLISHED[1], ratio
    # at the peak (inside the loss's backward) two fp32 logit-sized gradients are live
    logits = 2 * 8192 * LLAMA_SHAPES[row["model"]]["vocab"] * 4
    assert plan["peak"]["Temp"] == 2 * logits
    # 16 bytes per parameter less the gradients, which backward has not made yet: 4 + 8, sharded
    assert plan["peak"]["Sharded Grad"] == 0
    assert abs((plan["peak"]["Sharded Param"] + plan["peak"]["OptState"]) * 8 / (12 * plan["params"]) - 1) < 1e-3
    # gathered in bf16: the root (embedding, norm, output), kept from forward to backward, and the
    # last block, not resharded after forward
    shape = LLAMA_SHAPES[row["model"]]
    root = llama_param_count(**dict(shape, layers=0))
    block = llama_param_count(**dict(shape, layers=1)) - root
    assert plan["peak"]["Unsharded Param"] == 2 * (root + block)


def test_a_block_keeps_torchtitans_selection():
    """Per block, op-selective keeps its input, the attention output and log-sum-exp, and the
    outputs of wq, wv, w1, w2 (every matmul but every second one): 2·b·s·(4h + g·d + f) + 4·b·a·s."""
    shape, batch, seq = LLAMA_SHAPES["Llama 3.1 8B"], 2, 8192   # long enough to peak in backward
    kept = {n: llama_fsdp_peak(gpus=8, batch=batch, seq=seq, layers=n)["peak"]["Activation"] for n in (1, 2)}
    kv = shape["kv_heads"] * shape["hidden"] // shape["heads"]
    tokens = batch * seq
    assert kept[2] - kept[1] == 2 * tokens * (4 * shape["hidden"] + kv + shape["ffn"]) + 4 * tokens * shape["heads"]


def test_a_shallow_slice_runs_and_bad_input_is_refused():
    rows = against_published(layers=1)
    assert [r["layers"] for r in rows] == [1, 1] and all(r["planned_gib"] > 0 for r in rows)
    with pytest.raises(ValueError, match="model"):
        llama_fsdp_peak("Llama 9B", gpus=8, batch=2, seq=8)
    with pytest.raises(ValueError, match="recompute"):
        Llama(**SMALL, seq_len=8, recompute="some")
    with pytest.raises(ValueError, match="kv_heads"):
        Llama(**dict(SMALL, kv_heads=3), seq_len=8)
