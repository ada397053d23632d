"""course_utils.compare: the kit's one rule for "arm A beats arm B" (paired seeds, ±2 SE)."""
import math

import pytest

from course_utils.compare import NOT_RESOLVED, compare_paired


def test_the_interval_decides_the_direction():
    up = compare_paired([0.50, 0.52, 0.55], [0.40, 0.43, 0.44], names=("T=0.2", "T=1"))
    assert up.mean == pytest.approx(0.1, abs=1e-9)
    assert up.verdict == "T=0.2 > T=1"
    down = compare_paired([0.40, 0.43, 0.44], [0.50, 0.52, 0.55], names=("T=0.2", "T=1"))
    assert down.verdict == "T=1 > T=0.2"


def test_a_tie_and_a_noisy_gap_are_not_resolved():
    # the case: same-seed gaps +3.4, +2.1, +0.0 points
    noisy = compare_paired([0.234, 0.221, 0.209], [0.200, 0.200, 0.209])
    assert noisy.verdict == NOT_RESOLVED and noisy.interval[0] < 0 < noisy.interval[1]
    tie = compare_paired([0.3, 0.3, 0.3], [0.3, 0.3, 0.3])
    assert tie.verdict == NOT_RESOLVED        # a tie is not evidence of "no effect" either way
    assert "not resolved" in tie.describe(100, " points")
    small = compare_paired([0.012, 0.011, 0.013], [0.0, 0.0, 0.0], ("A", "B"))
    assert small.describe().startswith("A − B: +0.0,") and small.describe(digits=3).startswith("A − B: +0.012,")


def test_the_standard_error_is_that_of_the_paired_differences():
    c = compare_paired([1.0, 2.0, 4.0], [0.0, 0.0, 0.0])
    sd = math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    assert c.standard_error == pytest.approx(sd / math.sqrt(3))


def test_fewer_than_three_seeds_claim_no_direction():
    assert compare_paired([0.9, 0.91], [0.1, 0.11]).verdict == NOT_RESOLVED


@pytest.mark.parametrize("a, b", [([0.1, 0.2], [0.1]), ([], [])])
def test_unpaired_input_is_refused_with_what_to_do(a, b):
    with pytest.raises(ValueError, match="one value per seed"):
        compare_paired(a, b)


def test_the_interval_is_students_95_percent():
    from course_utils.compare import t95
    c = compare_paired([0.3, 0.5, 0.4], [0.2, 0.2, 0.2])
    assert c.half_width == pytest.approx(4.303 * c.standard_error)
    assert t95(4) == 2.776 and abs(t95(60) - 2.000) < 0.005


def test_identical_differences_need_more_than_a_zero_width_interval():
    one_image = 1 / 1000
    c = compare_paired([0.201, 0.301, 0.401], [0.2, 0.3, 0.4], resolution=2 * one_image)
    assert c.standard_error == pytest.approx(0, abs=1e-12) and c.verdict == NOT_RESOLVED


def test_seeds_given_by_name_are_paired_and_checked():
    c = compare_paired({0: 0.5, 1: 0.6, 2: 0.7}, {2: 0.4, 0: 0.2, 1: 0.3})
    assert c.differences == pytest.approx((0.3, 0.3, 0.3))
    with pytest.raises(ValueError, match="same seeds"):
        compare_paired({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.2, 1: 0.3, 3: 0.4})


def test_a_nan_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        compare_paired([0.1, float("nan"), 0.3], [0.1, 0.2, 0.3])
