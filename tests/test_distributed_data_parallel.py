"""Lesson 07 on two real gloo ranks: DDP is one large-batch update; its boundaries."""
import pytest
import torch

from course_utils.distributed import launch
from course_utils.experiments import data_parallel as lesson
from course_utils.experiments import toys

FP32_TOL = 1e-6   # max |Δθ| after every step, parameters of size ~0.3: summation-order rounding
FP64_TOL = 1e-12


@pytest.fixture(scope="module")
def ranks():
    """One launch for every check (starting ranks costs seconds, the checks milliseconds)."""
    return launch(lesson.suite, 2, {"steps": 4}, timeout=240)


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adamw"])
def test_ddp_equals_single_process_on_concatenated_batch_every_step(ranks, optimizer):
    for r in ranks:
        fp32, fp64 = r["equivalence"][optimizer], r["equivalence_fp64"][optimizer]
        assert len(fp32["max_abs_diff"]) == 4
        assert max(fp32["max_abs_diff"]) < FP32_TOL, fp32
        assert max(fp64["max_abs_diff"]) < FP64_TOL, fp64   # rounding, not a different algorithm
        assert fp32["param_scale"] > 0.1                     # the tolerance is tight relative to θ
    # Ranks started from different seeds; DDP's constructor broadcast rank 0's parameters.
    a, b = (r["equivalence"][optimizer] for r in ranks)
    assert a["checksum_before_broadcast"] != b["checksum_before_broadcast"]
    assert a["checksum_after_broadcast"] == b["checksum_after_broadcast"] == a["checksum_before_broadcast"]


def test_no_sync_accumulation_equals_large_batch_with_one_all_reduce_per_step(ranks):
    for r in ranks:
        ns = r["no_sync"]
        assert max(ns["max_abs_diff"]) < FP32_TOL
        assert ns["micro_batches"] == 2
        assert ns["allreduce_buckets_per_step"] == [1] * 4   # not one per micro-batch


def test_allreduce_bytes_match_ring_formula_and_manual_average(ranks):
    for r in ranks:
        c = r["comm"]
        psi, n = c["param_bytes"], c["world_size"]
        assert c["payload_per_step"] == psi                   # every gradient byte, once per step
        assert sum(c["bucket_bytes"]) == psi
        assert c["ring_sent_per_step"] == pytest.approx(2 * (n - 1) / n * psi)
        assert c["manual_equals_ddp_bitwise"]
        if c["wire_per_step"] is not None:                     # Linux: bytes really written
            assert 1.0 <= c["wire_per_step"] / c["ring_formula"] < 1.25


def test_per_rank_batchnorm_differs_and_synced_batchnorm_matches_large_batch(ranks):
    for r in ranks:
        bn = r["batchnorm"]
        assert bn["batch_mean_gap"] > 0.1                      # shards really differ
        assert bn["per_rank_bn"]["output_diff"] > 1e-2
        assert bn["per_rank_bn"]["grad_diff"] > 1e-3
        assert bn["synced_bn"]["output_diff"] < 1e-5
        assert bn["synced_bn"]["grad_diff"] < 1e-5
        assert bn["synced_bn"]["running_mean_diff"] < 1e-6


def test_gathered_simclr_negatives_equal_single_process_large_batch(ranks):
    for r in ranks:
        s = r["simclr"]
        assert s["gathered"]["loss"] == pytest.approx(s["loss_single"], abs=1e-5)
        assert s["gathered"]["grad_diff"] < 1e-5 * max(1.0, s["gathered"]["grad_scale"])
        # Per-rank negatives: a smaller, easier problem with a different gradient.
        assert s["per_rank"]["loss"] < s["loss_single"] - 0.1
        assert s["per_rank"]["grad_diff"] > 1e-3
        # counted from the logits each loss was computed on: 2B−1 per rank, 2nB−1 gathered
        n = len(ranks)
        assert s["gathered"]["candidates"] == s["candidates_single"] \
            == n * (s["per_rank"]["candidates"] + 1) - 1
        assert s["matches_torch_all_gather"]


def test_moco_queue_filled_from_all_ranks_is_identical_everywhere(ranks):
    a, b = ranks[0]["moco"], ranks[1]["moco"]
    assert torch.equal(a["shared_keys"], b["shared_keys"])
    assert torch.equal(a["shared_ids"], b["shared_ids"])
    owners = set((a["shared_ids"][a["shared_ids"] >= 0] // 1000).tolist())
    assert owners == {0, 1}
    assert set((a["own_ids"][a["own_ids"] >= 0] // 1000).tolist()) == {0}   # per-rank queue: own keys only
    assert not torch.equal(a["own_keys"], b["own_keys"])


def test_the_gpu_preset_runs_every_worker_the_lesson_launches():
    """Lesson 07's gpu preset, run on two gloo ranks on the CPU: its sizes must suit every worker
    (on the H200, run 3, a 64-key MoCo queue refused the 2 x 64 keys of one step; the world where
    this fails is a preset that only a GPU runtime would reach)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import gpu_budget
    gpu = gpu_budget.preset("07_data_parallel", "gpu")
    assert gpu["dp"]["queue_size"] >= gpu["ranks"] * gpu["dp"]["batch"]
    results = launch(lesson.suite, gpu["ranks"], gpu["dp"], timeout=240)
    assert results[0]["moco"]["ptr"] >= 0 and set(results[0]) >= {"equivalence", "moco", "simclr"}
    assert launch(lesson.ddp_comm_bytes, gpu["ranks"], gpu["comm"], timeout=120)[0]


def test_settings_reject_unknown_keys():
    with pytest.raises(ValueError, match="unknown setting"):
        toys.settings({"stpes": 3}, lesson.DEFAULTS)
