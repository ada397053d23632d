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
def test_zero_bubble_needs_about_twice_1f1b_memory_not_all_m(p, m):
    """ZB-H2's trade: (p-1)(F+B-W) is reached holding 2p-1 micro-batches, and no sooner."""
    formula = pp.zero_bubble_formula(p, m)
    h2 = pp.simulate("zero_bubble", p, m, max_in_flight=2 * p - 1)
    assert h2.bubble_fraction == pytest.approx(formula) and h2.peak_activations(0) == 2 * p - 1 < m
    at_1f1b = pp.simulate("zero_bubble", p, m, max_in_flight=p)
    assert formula < at_1f1b.bubble_fraction < pp.bubble_formula(p, m)
