"""Lesson 09: the schedule simulator against its formulas, and real pipeline / tensor parallel runs."""
import pytest

from course_utils.distributed import launch
from course_utils.distributed import pipeline as pp
from course_utils.experiments import pipeline_tensor_parallel as lesson
from course_utils.experiments import toys


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 4), (4, 8), (8, 16), (3, 7)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_equals_formula(schedule, p, m):
    for forward, backward in ((1, 2), (2, 3)):
        t = pp.simulate(schedule, p, m, forward=forward, backward=backward)
        assert t.bubble_fraction == pytest.approx(pp.bubble_formula(p, m))
        assert t.makespan == (m + p - 1) * (forward + backward)
        assert len(t.ops) == 2 * p * m


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4)])
def test_interleaved_and_zero_bubble_shrink_the_bubble(p, m):
    one_f_one_b = pp.simulate("1f1b", p, m).bubble_fraction
    inter = pp.simulate("interleaved", p, m, forward=2, backward=4, chunks=2)
    assert inter.bubble_fraction == pytest.approx(pp.bubble_formula(p, m, chunks=2))
    zb = pp.simulate("zero_bubble", p, m)
    assert zb.bubble_fraction == pytest.approx(pp.zero_bubble_formula(p, m))
    zb_capped = pp.simulate("zero_bubble", p, m, max_in_flight="1f1b")
    assert zb.bubble_fraction <= zb_capped.bubble_fraction < one_f_one_b


def test_activation_memory_per_stage():
    p, m = 4, 8
    gpipe, ofob = pp.simulate("gpipe", p, m), pp.simulate("1f1b", p, m)
    assert [gpipe.peak_activations(d) for d in range(p)] == [m] * p       # every micro-batch alive
    assert [ofob.peak_activations(d) for d in range(p)] == [p - d for d in range(p)]
    capped = pp.simulate("zero_bubble", p, m, max_in_flight="1f1b")
    assert [capped.peak_activations(d) for d in range(p)] == [p - d for d in range(p)]


def test_dependencies_respected_in_every_schedule():
    for schedule in pp.SCHEDULES:
        t = pp.simulate(schedule, 4, 8, forward=2, backward=4)
        ends = {(op.kind, op.chunk * 4 + op.device, op.microbatch): op.end for op in t.ops}
        stages = max(s for _, s, _ in ends) + 1
        for op in t.ops:
            s = op.chunk * 4 + op.device
            if op.kind == "F" and s > 0:
                assert op.start >= ends[("F", s - 1, op.microbatch)]
            if op.kind == "B" and s < stages - 1:
                assert op.start >= ends[("B", s + 1, op.microbatch)]
        per_device = sorted((op.device, op.start, op.end) for op in t.ops)
        for a, b in zip(per_device, per_device[1:]):
            assert a[0] != b[0] or a[2] <= b[1]                          # no overlap on a device


def test_simulator_rejects_bad_input():
    with pytest.raises(ValueError, match="schedule"):
        pp.simulate("pipedream", 2, 4)
    with pytest.raises(ValueError, match="divisible"):
        pp.simulate("interleaved", 4, 6, forward=2, backward=4)
    with pytest.raises(ValueError, match="devices must be a positive int"):
        pp.simulate("gpipe", 0, 4)
    with pytest.raises(TypeError, match="microbatches must be a positive int"):
        pp.simulate("gpipe", 2, True)
    with pytest.raises(ValueError, match="max_in_flight"):
        pp.simulate("zero_bubble", 2, 4, max_in_flight=0)


def test_plot_timeline_draws_one_bar_per_operation():
    import matplotlib
    matplotlib.use("Agg")
    from course_utils.plots import plot_timeline
    t = pp.simulate("1f1b", 2, 4)
    ax = plot_timeline(t)
    assert len(ax.patches) == len(t.ops) == 16
    assert "bubble 20%" in ax.get_title()


@pytest.fixture(scope="module")
def ranks():
    return launch(lesson.suite, 2, timeout=240)


def test_real_two_stage_pipeline_gradients_equal_unsplit(ranks):
    for r in ranks:
        for schedule in ("gpipe", "1f1b"):
            assert r["pipeline"][schedule]["grad_diff"] < 1e-6 * max(1.0, r["pipeline"]["grad_scale"])
    last = ranks[-1]["pipeline"]
    assert last["gpipe"]["loss"] == pytest.approx(last["loss_unsplit"], rel=1e-5)
    total = sum(r["pipeline"]["gpipe"]["params_on_this_stage"] for r in ranks)
    assert total == sum(p.numel() for p in toys.make_stack(32, 4, 0, head=True).parameters())


def test_real_gpipe_and_1f1b_hold_the_simulators_peak_activations(ranks):
    """Measured from autograd's saved tensors: GPipe m on every stage, 1F1B p - s on stage s."""
    p, m = len(ranks), lesson.PIPELINE_DEFAULTS["microbatches"]
    for schedule in ("gpipe", "1f1b"):
        measured = [r["pipeline"][schedule]["peak_microbatches_alive"] for r in ranks]
        assert measured == [pp.simulate(schedule, p, m).peak_activations(d) for d in range(p)]
        assert all(r["pipeline"][schedule]["alive_after_step"] == 0 for r in ranks)
    assert [r["pipeline"]["1f1b"]["peak_microbatches_alive"] for r in ranks] == [2, 1]


def test_torch_zero_bubble_schedules_run_with_exact_fp64_gradients(ranks):
    for r in ranks:
        zb = r["zero_bubble"]
        for name in lesson.ZERO_BUBBLE_SCHEDULES:
            assert zb[name]["grad_diff"] < 1e-12 * max(1.0, zb["grad_scale"]), name
            assert zb[name]["loss"] is None or zb[name]["loss"] == pytest.approx(zb["loss_unsplit"], abs=1e-12)
            assert zb[name]["alive_after_step"] == 0
    # the loss lives on the rank holding the last stage: rank 1 for ZB-H1, rank 0 for ZB-V's V
    assert [r["zero_bubble"]["zb_h1"]["loss"] is not None for r in ranks] == [False, True]
    assert [r["zero_bubble"]["zbv"]["loss"] is not None for r in ranks] == [True, False]


def test_torch_zb_h1_order_is_the_simulators_and_holds_its_peak(ranks):
    from course_utils.distributed import pipeline_orders as po
    p, m = len(ranks), lesson.PIPELINE_DEFAULTS["microbatches"]
    simulated = po.simulate_order("zb_h1", p, m)
    for rank, (r, order) in enumerate(zip(ranks, po.orders("zb_h1", p, m))):
        zb = r["zero_bubble"]["zb_h1"]
        ran = [f"{stage}{kind}{mb}" for kind, stage, mb in zb["executed"]]
        assert ran == [a for a in zb["order"] if a != "-"]             # the trace saw the order run
        assert ran == [f"{rank}{kind}{mb}" for kind, _, mb in order]   # the simulator's ZB-H1
        assert zb["peak_microbatches_alive"] == {rank: simulated.peak_activations(rank)} == {rank: p}


def test_torch_zbv_places_stages_in_a_v_and_holds_p_microbatches_worth(ranks):
    p = len(ranks)
    for rank, r in enumerate(ranks):
        zbv = r["zero_bubble"]["zbv"]
        assert zbv["stages"] == lesson.zero_bubble_stages("zbv", rank, p) == [rank, 2 * p - 1 - rank]
        assert {kind for kind, _, _ in zbv["executed"]} == {"F", "I", "W"}
        assert zbv["peak_on_rank"] == 2 * p                            # 2p half-size chunks


def test_stage_trace_counts_live_microbatches_and_restores_the_stage():
    """One process, a stand-in stage: forwards of 3 micro-batches, then backwards in order."""
    import torch
    from course_utils.distributed.pipeline_trace import StageTrace

    class FakeStage:
        stage_index = 5

        def __init__(self):
            self.submod = torch.nn.Linear(4, 4)
            self.out = {}

        def forward_one_chunk(self, chunk, x):
            self.out[chunk] = torch.tanh(self.submod(x)).sum()

        def backward_one_chunk(self, chunk, full_backward=True):
            self.out.pop(chunk).backward()

        def backward_weight_one_chunk(self, chunk):
            pass

    stage = FakeStage()
    with StageTrace([stage]) as trace:
        for j in range(3):
            stage.forward_one_chunk(j, torch.randn(2, 4))
        assert trace.alive() == 3
        stage.backward_one_chunk(0)
        assert trace.alive() == 2
        stage.forward_one_chunk(3, torch.randn(2, 4))
        for j in (1, 2, 3):
            stage.backward_one_chunk(j, full_backward=False)
            stage.backward_weight_one_chunk(j)
    assert trace.peak == {5: 3} and trace.alive() == 0
    assert trace.executed[:4] == [("F", 5, 0), ("F", 5, 1), ("F", 5, 2), ("B", 5, 0)]
    assert trace.executed[-2:] == [("I", 5, 3), ("W", 5, 3)]
    assert "forward_one_chunk" not in vars(stage)                      # the method is back


def test_tensor_parallel_mlp_equals_unsplit_with_two_all_reduces(ranks):
    for r in ranks:
        tp = r["tensor_parallel"]
        assert tp["output_diff"] < 1e-5
        assert max(tp["grad_diff"].values()) < 1e-6
        assert tp["allreduce_calls"] == {"forward": 1, "backward": 1}
        assert tp["allreduce_bytes"] == tp["predicted_bytes"]
        # Each rank: half of W1, b1, W2, plus the replicated b2.
        assert tp["weights_on_this_rank"] == (tp["weights_unsplit"] - 32) // 2 + 32
        assert tp["torch_dtensor_output_diff"] is None or tp["torch_dtensor_output_diff"] < 1e-5


@pytest.mark.parametrize("p, m", [(4, 16), (8, 32)])
def test_zero_bubble_reaches_its_formula_within_2p_minus_1_not_at_1f1b_memory(p, m):
    """The greedy zero-bubble rule reaches (p-1)(F+B_input-W) when it may hold 2p-1 micro-batches
    (lesson 09 finds the smallest cap that does, p+1 or p+2), not at 1F1B's p, and never needs m."""
    formula = pp.zero_bubble_formula(p, m)
    h2 = pp.simulate("zero_bubble", p, m, max_in_flight=2 * p - 1)
    assert h2.bubble_fraction == pytest.approx(formula) and h2.peak_activations(0) == 2 * p - 1 < m
    at_1f1b = pp.simulate("zero_bubble", p, m, max_in_flight=p)
    assert formula < at_1f1b.bubble_fraction < pp.bubble_formula(p, m)
