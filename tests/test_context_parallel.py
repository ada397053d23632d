"""Ring attention (context parallel) equals unsplit attention; bytes, memory and causal load."""
import pytest
import torch

from course_utils.distributed import context_parallel as cp
from course_utils.distributed import launch
from course_utils.experiments import pipeline_tensor_parallel as lesson


def test_block_math_merges_to_full_softmax():
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 8, 4, dtype=torch.float64) for _ in range(3))
    full, full_lse = cp.block_forward(q, k, v, 0.5)
    out, lse = cp.block_forward(q, k[:, :5], v[:, :5], 0.5)
    out, lse = cp.merge(out, lse, *cp.block_forward(q, k[:, 5:], v[:, 5:], 0.5))
    assert torch.allclose(out, full, atol=1e-14) and torch.allclose(lse, full_lse, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_one_process_function_matches_autograd(causal):
    torch.manual_seed(1)
    q, k, v, w = (torch.randn(2, 8, 4, dtype=torch.float64) for _ in range(4))
    ours, ref = ([t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2))
    (cp.ring_attention(*ours, cp.Ring(), causal=causal) * w).sum().backward()
    (lesson._attention_unsplit(*ref, causal) * w).sum().backward()
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: cp.ring_attention(*t, cp.Ring(), causal=causal),
                                    [t.clone()[:1, :4].requires_grad_() for t in (q, k, v)])


def test_causal_block_counts_plain_vs_zigzag():
    assert [cp.score_blocks(r, 2, True, False) for r in range(2)] == [3, 7]
    assert [cp.score_blocks(r, 2, True, True) for r in range(2)] == [5, 5]
    assert [cp.score_blocks(r, 4, True, True) for r in range(4)] == [9] * 4
    assert cp.ring_bytes_per_step(100, 1) == 0 and cp.ring_bytes_per_step(100, 2) == 800


def test_split_sequence_refuses_uneven_lengths():
    with pytest.raises(ValueError, match="chunks"):
        cp.split_sequence(torch.zeros(1, 6, 2), cp.Ring(0, 2))


@pytest.fixture(scope="module")
def ranks():
    return launch(lesson.context_parallel, 2, timeout=120)


def test_two_ranks_equal_unsplit_attention_fp64(ranks):
    for r in ranks:
        for arm in lesson.CONTEXT_ARMS:
            assert max(r[arm]["gaps"].values()) < 1e-12, (arm, r[arm]["gaps"])


def test_two_ranks_bytes_memory_and_blocks(ranks):
    for rank, r in enumerate(ranks):
        for arm, x in r.items():
            assert x["sent_bytes"] == x["predicted_bytes"] > 0
            assert x["wire_bytes"] is None or x["wire_bytes"] >= x["sent_bytes"]
            assert x["kept_split"] * 2 == x["kept_unsplit"]
            assert x["score_blocks"] == x["predicted_blocks"]
    assert [r["causal"]["score_blocks"] for r in ranks] == [3, 7]
    assert [r["causal zig-zag"]["score_blocks"] for r in ranks] == [5, 5]


@pytest.mark.parametrize("world_size", [3, 4])
def test_three_and_four_ranks_equal_unsplit_attention_fp64(world_size):
    """At two ranks the ring's direction cannot be wrong (the neighbour is both ways round); at 3
    and 4 a block sent the wrong way would meet the wrong queries, and the gaps would show it."""
    results = launch(lesson.context_parallel, world_size, {"sequence": 48}, timeout=180)
    for r in results:
        for arm in lesson.CONTEXT_ARMS:
            assert max(r[arm]["gaps"].values()) < 1e-12, (world_size, arm, r[arm]["gaps"])
            assert r[arm]["sent_bytes"] == r[arm]["predicted_bytes"] > 0
            assert r[arm]["score_blocks"] == r[arm]["predicted_blocks"]
    zigzag = [r["causal zig-zag"]["score_blocks"] for r in results]
    assert len(set(zigzag)) == 1, zigzag          # the zig-zag split evens the work at any n
    # and so does the work the ledger counts, apart from the ring's counter: the same matmul FLOPs
    # per predicted block on every rank and arm (a block computed, then masked, would cost more)
    per_block = {r[arm]["flops_split"] / r[arm]["predicted_blocks"] for r in results for arm in r}
    assert len(per_block) == 1, per_block
    assert len({r["causal zig-zag"]["flops_split"] for r in results}) == 1
