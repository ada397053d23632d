"""Explicit pipeline orders (1F1B, ZB-H1, ZB-H2-style, DualPipe) against DeepSeek-V3's Table 2."""
import pytest

from course_utils.distributed import pipeline_orders as po

# F = B_input (B - W = F): the costs at which the report's DualPipe formula is exact.
EQUAL_INPUT_COSTS = [dict(forward=1, backward=2, weight=1), dict(forward=2, backward=3, weight=1),
                     dict(forward=3, backward=4, weight=1)]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (6, 12), (8, 20)])
@pytest.mark.parametrize("costs", EQUAL_INPUT_COSTS)
def test_bubbles_equal_the_reports_formulas(p, m, costs):
    for schedule in ("1f1b", "zb_h1", "dualpipe"):
        t = po.simulate_order(schedule, p, m, **costs)
        formula = po.report_bubble(schedule, p, **costs)
        assert [t.idle(d) for d in range(p)] == pytest.approx([formula] * p), schedule


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16)])
def test_dualpipe_with_overlap_cheaper_than_f_plus_b_the_formula_is_the_worst_device(p, m):
    for overlapped in (2, 2.5):
        t = po.simulate_order("dualpipe", p, m, forward=1, backward=2, weight=1, overlapped=overlapped)
        formula = po.report_bubble("dualpipe", p, forward=1, backward=2, weight=1, overlapped=overlapped)
        assert max(t.idle(d) for d in range(p)) == pytest.approx(formula)


def test_dualpipe_formula_misses_when_forward_differs_from_input_backward():
    t = po.simulate_order("dualpipe", 4, 8, forward=2, backward=2, weight=1)
    assert t.idle(0) > po.report_bubble("dualpipe", 4, forward=2, backward=2, weight=1)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24)])
def test_memory_per_device(p, m):
    peak = {s: [po.simulate_order(s, p, m).peak_activations(d) for d in range(p)] for s in po.ORDERS}
    assert peak["1f1b"] == [p - d for d in range(p)]
    assert peak["zb_h1"] == [p] * p                      # 1F1B's peak, on every device
    assert max(peak["zb_h2"]) == 2 * p - 1
    assert peak["dualpipe"] == [p + 1] * p
    dual = po.simulate_order("dualpipe", p, m)
    for d in range(p):                                   # two stages' parameters per device
        stages = {po.stage_of(d, op.direction, p) + op.direction * p for op in dual.ops if op.device == d}
        assert stages == {d, (p - 1 - d) + p}


def test_zb_h2_beats_h1_when_input_backward_costs_more_than_forward():
    costs = dict(forward=1, backward=3, weight=1)
    h1, h2 = (po.simulate_order(s, 4, 16, **costs) for s in ("zb_h1", "zb_h2"))
    assert h2.idle(0) < h1.idle(0) == po.report_bubble("zb_h1", 4, **costs)


def test_dependencies_and_one_op_at_a_time():
    for schedule in po.ORDERS:
        t = po.simulate_order(schedule, 4, 8, forward=1, backward=3, weight=1, overlapped=3)
        ends = {(op.kind, op.direction, po.stage_of(op.device, op.direction, 4), op.microbatch): op.end
                for op in t.ops}
        for op in t.ops:
            s = po.stage_of(op.device, op.direction, 4)
            if op.kind == "F" and s > 0:
                assert op.start >= ends[("F", op.direction, s - 1, op.microbatch)]
            if op.kind == "B" and s < 3:
                assert op.start >= ends[("B", op.direction, s + 1, op.microbatch)]
            if op.kind == "W":
                assert op.start >= ends[("B", op.direction, s, op.microbatch)]
        assert len([op for op in t.ops if op.kind == "F"]) == 4 * 8


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="even"):
        po.simulate_order("dualpipe", 4, 6)
    with pytest.raises(ValueError, match="weight"):
        po.simulate_order("zb_h1", 4, 8, backward=1, weight=1)
    with pytest.raises(ValueError, match="schedule"):
        po.simulate_order("pipedream", 4, 8)
